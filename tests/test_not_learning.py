"""callbacks.not_learning: one warning per condition when a run sits on CTC's blank plateau or
stops improving; never for a run that learns; kept across a resume; carried into the results."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from fastasr.config import CONFIG_DIR
from fastasr.rundir import RunDir
from fastasr.training.callbacks import LearningWatch, learning_warnings, report_learning_warnings
from fastasr.training.callbacks.not_learning import (
    PLATEAU,
    PROGRESS_BAR_KEY,
    STALLED,
    TROUBLESHOOTING,
)

WARNING = "not learning: after"


def feed(watch: LearningWatch, curve, metric: str = "val/cer", **kw) -> list[tuple[int, list[str]]]:
    """Feed ``(update, dev loss, dev error)`` validations; the conditions each one raised."""
    return [(u, watch.observe(u, i, loss, error, metric=metric, **kw)) for i, (u, loss, error) in enumerate(curve)]


def raised(fed) -> list[tuple[int, str]]:
    return [(u, c) for u, new in fed for c in new]


# ---------------------------------------------------------------- the blank plateau
def test_the_plateau_warns_once_after_the_given_updates(caplog):
    watch = LearningWatch(after_updates=600, plateau_error=90.0)
    curve = [(u, 3.0 - 0.01 * i, 99.0 - 0.5 * i) for i, u in enumerate(range(240, 2400, 240))]
    with caplog.at_level(logging.WARNING, logger="fastasr.training.callbacks.not_learning"):
        fed = feed(watch, curve)
    assert raised(fed) == [(720, PLATEAU)]  # the first validation at or after update 600, and only it
    assert caplog.text.count(WARNING) == 1
    (w,) = watch.warnings
    assert (w["condition"], w["update"], w["epoch"], w["metric"]) == (PLATEAU, 720, 2, "val/cer")
    assert w["dev_error"] == pytest.approx(98.0) and w["dev_loss"] == pytest.approx(2.98)
    assert "720 updates" in w["message"] and "dev CER 98.0 %" in w["message"] and TROUBLESHOOTING in w["message"]


def test_the_plateau_is_judged_at_the_present_validation_not_the_best():
    """A run that dipped under the threshold once and went back up is still on the plateau."""
    watch = LearningWatch(after_updates=600)
    fed = feed(watch, [(300, 3.0, 95.0), (600, 2.9, 88.0), (900, 2.9, 92.8)])
    assert raised(fed) == [(900, PLATEAU)]


def test_no_warning_before_after_updates_even_on_the_plateau():
    watch = LearningWatch(after_updates=600, patience=2)
    fed = feed(watch, [(u, 3.0, 100.0) for u in range(50, 600, 50)])
    assert raised(fed) == [] and watch.warnings == []


# ---------------------------------------------------------------- learning runs never trip it
# dev error by update of documented runs (docs/results/table2 and figure1 budget_curves.csv, one
# validation every 63 updates): they sit at 100 % for 300-450 updates and leave by update 567
TABLE2_FULL_L6 = [100, 100, 100, 100, 100, 99, 95, 67, 57, 46, 39, 36, 29, 28, 27, 26]
FIGURE1_ICLUSTERED200_L6 = [100, 100, 100, 100, 100, 100, 97, 91, 77, 67, 58, 56]
TABLE2_LSH4_L6 = [100, 100, 100, 100, 100, 100, 97, 93, 85, 80]


@pytest.mark.parametrize("errors", [TABLE2_FULL_L6, FIGURE1_ICLUSTERED200_L6, TABLE2_LSH4_L6])
def test_runs_that_leave_the_plateau_by_update_600_raise_nothing(errors):
    # the dev loss sits still on the plateau (as it does), then falls
    curve = [(63 * (i + 1), 3.0 if e >= 95 else 3.0 * e / 100, e) for i, e in enumerate(errors)]
    watch = LearningWatch()
    assert raised(feed(watch, curve, metric="val/per")) == []


def test_an_overfitting_run_whose_dev_loss_rises_for_many_validations_raises_nothing():
    """Mini LibriSpeech 2 h (docs/results/mini_librispeech): the dev loss rose from epoch 11 to 44
    while the dev CER fell; the 40-minute subset: the dev loss rose for 20 epochs while the dev
    CER stayed at 48-51 %. Neither is a run that is not learning."""
    falling = [(220 * e, 1.29 + 0.01 * max(0, e - 11), 45.0 - 0.5 * e) for e in range(1, 45)]
    flat_high = [(165 * e, 1.95 + 0.05 * max(0, e - 23), 48.0 + (e % 4)) for e in range(1, 48)]
    for curve in (falling, flat_high):
        watch = LearningWatch()
        assert raised(feed(watch, curve)) == []


# ---------------------------------------------------------------- a stalled run
def test_a_flat_dev_loss_and_error_warn_stalled_after_patience_validations(caplog):
    watch = LearningWatch(after_updates=600, patience=5, min_delta=0.01, stalled_error=60.0)
    learning = [(200 * (i + 1), 3.0 - 0.1 * i, 88.0 - 2 * i) for i in range(5)]  # best loss 2.6, error 80
    flat = [(1200 + 200 * i, 2.6 + 0.02 * (i % 2), 80.0 + 0.5 * (i % 2)) for i in range(8)]
    with caplog.at_level(logging.WARNING, logger="fastasr.training.callbacks.not_learning"):
        fed = feed(watch, learning + flat, metric="val/per")
    # the 5 validations after the last improvement (updates 1,200-2,000) improved on neither
    assert raised(fed) == [(2000, STALLED)]
    assert caplog.text.count(WARNING) == 1
    message = watch.warnings[0]["message"]
    assert "neither the dev loss nor the dev PER improved by 1 % over the last 5 validations" in message
    assert "dev loss 2.600 (best 2.600 at update 1000;" in message and ": flat)" in message
    assert "What to try: the same command with another seed" in message  # a start that stuck off the plateau


def test_the_plateau_warning_does_not_blame_the_seed():
    watch = LearningWatch(after_updates=0)
    feed(watch, [(700, 2.9, 97.0)])
    assert watch.conditions == [PLATEAU] and "another seed" not in watch.warnings[0]["message"]


def test_a_rising_dev_loss_at_a_high_error_warns_stalled():
    watch = LearningWatch(after_updates=0, patience=3)
    curve = [(100, 2.5, 80.0), (200, 2.6, 81.0), (300, 2.8, 80.5), (400, 3.0, 82.0)]
    fed = feed(watch, curve)
    assert raised(fed) == [(400, STALLED)]
    assert "rising)" in watch.warnings[0]["message"]


def test_a_flat_dev_loss_while_the_error_falls_is_learning():
    watch = LearningWatch(after_updates=0, patience=3)
    curve = [(100 * i, 2.5, 85.0 - 3 * i) for i in range(1, 12)]
    assert raised(feed(watch, curve)) == []


def test_a_loss_improving_by_less_than_min_delta_is_flat():
    curve = [(100, 2.0, 80.0), (200, 1.99, 80.0), (300, 1.985, 80.0)]  # 0.75 % below the best before
    assert raised(feed(LearningWatch(after_updates=0, patience=2, min_delta=0.01), curve)) == [(300, STALLED)]
    assert raised(feed(LearningWatch(after_updates=0, patience=2, min_delta=0.005), curve)) == []


def test_each_condition_warns_once(caplog):
    watch = LearningWatch(after_updates=0, patience=2)
    curve = [(100 * i, 3.0, 99.0) for i in range(1, 10)]
    with caplog.at_level(logging.WARNING, logger="fastasr.training.callbacks.not_learning"):
        fed = feed(watch, curve)
    assert raised(fed) == [(100, PLATEAU), (300, STALLED)]
    assert watch.conditions == [PLATEAU, STALLED] and caplog.text.count(WARNING) == 2


# ---------------------------------------------------------------- what the warning says
def fake_trainer(**kw) -> SimpleNamespace:
    data = SimpleNamespace(max_frames_per_batch=16000, train_frames_per_batch=1428, min_batches_per_epoch=200)
    optimizer = SimpleNamespace(param_groups=[{"lr": 2.7e-3, "initial_lr": 3e-3}])
    defaults = dict(datamodule=data, optimizers=[optimizer], is_global_zero=True, sanity_checking=False,
                    fast_dev_run=False, global_step=0, current_epoch=0, callback_metrics={}, callbacks=[])
    return SimpleNamespace(**{**defaults, **kw})


class FakeModule:
    def __init__(self, unit_metric: str = "cer") -> None:
        self.unit_metric = unit_metric
        self.hparams = {"optimizer": {"_target_": "torch.optim.RAdam", "lr": 3e-3}}
        self.logged: list[tuple[str, float, dict]] = []

    def log(self, name, value, **kw):
        self.logged.append((name, value, kw))


def test_the_warning_names_the_batch_the_rate_and_what_to_try():
    watch = LearningWatch()
    trainer, module = fake_trainer(), FakeModule()
    for _ in range(4):
        watch.on_train_batch_start(trainer, module, {"ids": ["a", "b", "c"]}, 0)
    watch.on_train_batch_start(trainer, module, {"ids": ["d", "e", "f", "g"]}, 0)
    feed(watch, [(730, 2.7, 92.8)], trainer=trainer, pl_module=module)
    message = watch.warnings[0]["message"]
    for expected in ("after 730 updates", "dev CER 92.8 %", "dev loss 2.700",
                     "batches of 3.2 utterances on average",
                     "a batch budget of 1428 priced frames (data.max_frames_per_batch=16000, lowered to give "
                     "data.min_batches_per_epoch=200 updates an epoch)",
                     "a peak learning rate of 0.003 (optim.lr), 0.0027 now",
                     "a lower optim.lr", "data.min_batches_per_epoch=null", "tokenizer=bpe", "data.vocab_size",
                     TROUBLESHOOTING):
        assert expected in message, expected
    assert Path(TROUBLESHOOTING.split("#")[0]).name == "TROUBLESHOOTING.md"


@pytest.mark.parametrize("positions, xscaling, advised", [
    ("absolute", False, True), ("absolute", True, False), ("none", False, False), ("rotary", False, False)])
def test_a_model_whose_sinusoids_swamp_its_input_is_told_to_scale_it(positions, xscaling, advised):
    from fastasr.model import CTCModel

    module = FakeModule()
    module.model = CTCModel(vocab_size=5, feat_in=8, d_model=16, heads=2, ff_dim=16, layers=1,
                            positions=positions, xscaling=xscaling)
    plateau = [(700, 2.9, 97.0)]
    stalled = [(300 + 100 * i, 2.6, 80.0) for i in range(6)]
    for condition, curve in ((PLATEAU, plateau), (STALLED, stalled)):
        watch = LearningWatch(after_updates=0)
        feed(watch, curve, trainer=fake_trainer(), pl_module=module)
        assert watch.conditions == [condition]
        message = watch.warnings[-1]["message"]
        assert ("What to try: model.xscaling=true (" in message) == advised, message


def test_the_troubleshooting_section_the_warning_points_to_exists():
    from fastasr.config import PROJECT_ROOT

    path, anchor = TROUBLESHOOTING.split("#")
    headings = [line.lstrip("#").strip().lower().replace(" ", "-") for line in
                (PROJECT_ROOT / path).read_text().splitlines() if line.startswith("#")]
    assert anchor in headings


# ---------------------------------------------------------------- Lightning hooks
def test_hooks_read_the_modules_dev_metric_and_flag_the_progress_bar():
    watch = LearningWatch(after_updates=600)
    module = FakeModule("per")
    metrics = {"val/loss": torch.tensor(2.9), "val/per": torch.tensor(97.0), "val/cer": torch.tensor(10.0)}
    watch.on_validation_end(fake_trainer(sanity_checking=True, global_step=900, callback_metrics=metrics), module)
    assert watch.history == []  # the sanity check is not a validation
    watch.on_validation_end(fake_trainer(global_step=900, current_epoch=3, callback_metrics=metrics), module)
    assert watch.conditions == [PLATEAU] and watch.warnings[0]["metric"] == "val/per"
    trainer = fake_trainer()
    watch.on_train_batch_end(trainer, module, None, {"ids": ["a"]}, 0)
    watch.on_train_batch_end(trainer, module, None, {"ids": ["a"]}, 1)
    assert [(name, value, kw["prog_bar"]) for name, value, kw in module.logged] == [(PROGRESS_BAR_KEY, 1.0, True)]


def test_a_learning_run_shows_nothing_in_the_progress_bar():
    watch, module = LearningWatch(after_updates=0), FakeModule()
    metrics = {"val/loss": torch.tensor(1.0), "val/cer": torch.tensor(30.0)}
    watch.on_validation_end(fake_trainer(global_step=900, callback_metrics=metrics), module)
    watch.on_train_batch_end(fake_trainer(), module, None, {"ids": ["a"]}, 0)
    assert module.logged == [] and watch.warnings == []


# ---------------------------------------------------------------- resume
def round_trip(watch: LearningWatch, **kw) -> LearningWatch:
    """Through a checkpoint file as Lightning writes it and fastasr loads it (weights_only=True)."""
    buffer = io.BytesIO()
    torch.save({"callbacks": {"LearningWatch": watch.state_dict()}}, buffer)
    buffer.seek(0)
    resumed = LearningWatch(**kw)
    resumed.load_state_dict(torch.load(buffer, weights_only=True)["callbacks"]["LearningWatch"])
    return resumed


def test_the_state_survives_a_resume_so_a_warning_is_neither_repeated_nor_lost(caplog):
    watch = LearningWatch(after_updates=600)
    feed(watch, [(300, 3.0, 99.0), (700, 2.9, 98.0)])
    resumed = round_trip(watch)
    assert resumed.warnings == watch.warnings and resumed.history == watch.history
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastasr.training.callbacks.not_learning"):
        assert raised(feed(resumed, [(1000, 2.9, 97.0)])) == []  # not repeated
    assert WARNING not in caplog.text
    module = FakeModule()
    resumed.on_train_batch_end(fake_trainer(), module, None, {"ids": ["a"]}, 0)
    assert [name for name, *_ in module.logged] == [PROGRESS_BAR_KEY]  # the bar shows it again
    assert learning_warnings(fake_trainer(callbacks=[resumed])) == watch.warnings  # nor lost


def test_the_window_of_a_stalled_run_continues_across_a_resume():
    curve = [(100 * i, 2.0 + 0.01 * (i % 2), 80.0) for i in range(1, 8)]
    whole = LearningWatch(after_updates=0, patience=4)
    expected = raised(feed(whole, curve))
    assert expected == [(500, STALLED)]
    first = LearningWatch(after_updates=0, patience=4)
    feed(first, curve[:3])
    second = round_trip(first, after_updates=0, patience=4)
    fed = [(u, second.observe(u, i, loss, e, metric="val/cer")) for i, (u, loss, e) in enumerate(curve[3:], 3)]
    assert raised(fed) == expected


# ---------------------------------------------------------------- results
def test_the_results_carry_the_warnings(tmp_path):
    run = RunDir(tmp_path).create()
    run.write_results({"cer": 92.0})
    watch = LearningWatch()
    feed(watch, [(700, 2.9, 95.0)])
    trainer = fake_trainer(callbacks=[L.Callback(), watch])
    assert report_learning_warnings(trainer, run) == watch.warnings != []
    assert json.loads(run.results_file.read_text()) == {"cer": 92.0, "learning_warnings": watch.warnings}
    assert report_learning_warnings(fake_trainer(callbacks=[LearningWatch()]), run) == []
    assert json.loads(run.results_file.read_text())["learning_warnings"] == []  # a run that learnt says so too
    other = RunDir(tmp_path / "no_decoding").create()
    assert report_learning_warnings(trainer, None) == watch.warnings and not other.results_file.exists()


def test_it_is_on_by_default_with_the_documented_defaults():
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train")
    watch = instantiate(cfg.callbacks.not_learning)
    assert isinstance(watch, LearningWatch)
    assert (watch.after_updates, watch.plateau_error, watch.patience, watch.min_delta, watch.stalled_error) == \
        (600, 90.0, 4, 0.01, 60.0)


# Dev curves (update, dev loss, dev CER) of recorded runs of the documented command
# (docs/results/robustness/RESULTS.md): one that stuck off the plateau, and runs that learnt,
# fast, slowly, noisily or with a dev loss that jumps about.
STUCK_FSDD = [(150, 2.12, 76.2), (301, 1.92, 70.3), (452, 1.75, 69.5), (603, 1.79, 70.3), (754, 1.9, 68.9),
              (905, 1.77, 72.3), (1056, 1.82, 72.7), (1207, 1.78, 71.4), (1358, 1.74, 72.2), (1509, 1.78, 70.0),
              (1660, 1.73, 70.9), (1811, 1.84, 72.7), (1962, 1.8, 74.1), (2113, 1.75, 71.0)]
LEARNT = {
    "slowly (the tiny short shape, an earlier recipe)": [
        (223, 3.3, 100.0), (447, 2.7, 76.1), (671, 2.53, 72.7), (895, 2.42, 65.9), (1119, 2.67, 66.7),
        (1343, 2.3, 64.4), (1567, 2.29, 63.9), (1791, 2.26, 61.6), (2015, 2.2, 60.7), (2239, 2.18, 59.6)],
    "noisy shape": [(220, 2.96, 100.0), (441, 2.68, 75.0), (662, 2.46, 66.5), (883, 2.26, 62.2),
                    (1104, 2.11, 57.6), (1325, 2.01, 54.3), (1542, 1.93, 51.5)],
    "crawling off the plateau, then away": [(213, 2.03, 77.2), (427, 2.36, 85.6), (641, 1.9, 72.9),
                                            (855, 1.61, 69.3), (1069, 1.32, 51.0)],
    "FSDD, a dev loss that jumps": [(213, 1.68, 68.0), (427, 0.75, 23.9), (641, 0.98, 29.4), (855, 1.21, 26.4),
                                    (1069, 0.82, 22.4), (1283, 1.62, 26.8), (1497, 1.91, 33.8), (1711, 1.07, 21.0),
                                    (1925, 0.89, 18.6), (2139, 0.8, 18.4), (2353, 1.22, 22.4), (2567, 1.01, 20.7)],
}


def test_the_defaults_warn_a_recorded_stuck_run_early_and_no_recorded_run_that_learnt():
    """With the defaults (the class's, which conf/callbacks has: above) the stuck FSDD run (dev CER ~70 % from its second validation
    on) is warned at update 1,056, its 7th validation; none of the runs that learnt is."""
    assert raised(feed(LearningWatch(), STUCK_FSDD)) == [(1056, STALLED)]
    for what, curve in LEARNT.items():
        assert raised(feed(LearningWatch(), curve)) == [], what


@pytest.mark.parametrize("bad", [{"after_updates": -1}, {"patience": 0}, {"min_delta": 1.5}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        LearningWatch(**bad)


# ---------------------------------------------------------------- a real run
@pytest.mark.slow
def test_a_real_run_warns_shows_it_keeps_it_over_a_resume_and_reports_it(tiny_corpus, tmp_path, monkeypatch, caplog):
    """A tiny training that cannot learn (learning rate 0), judged at the default plateau error
    (90 %; only the updates before judging are lowered): the warning is logged once, the
    progress bar carries ``not_learning``, the checkpoint keeps the state, a resumed run does not
    warn again, and the result and results.json carry it."""
    from test_train_eval import compose_train

    import fastasr.training.fit

    bars = []  # the progress bar's metrics at the end of each fit, and the step

    class Keep(L.Callback):
        def on_fit_end(self, trainer, pl_module):
            bars.append((trainer.global_step, dict(trainer.progress_bar_metrics)))

    build = fastasr.training.fit.build_callbacks
    monkeypatch.setattr(fastasr.training.fit, "build_callbacks", lambda cfg, run_dir: [*build(cfg, run_dir), Keep()])
    overrides = ["name=stuck", "optim.lr=0", "+trainer.limit_train_batches=1", "callbacks.attention_maps=null",
                 "decoding@final_decoding=greedy", "callbacks.not_learning.after_updates=2"]  # the default threshold
    with caplog.at_level(logging.WARNING, logger="fastasr.training.callbacks.not_learning"):
        first = fastasr.training.fit.train(compose_train(tiny_corpus, tmp_path, "trainer.max_epochs=3", *overrides))
    assert caplog.text.count(WARNING) == 1 and "after 2 updates (epoch 1)" in caplog.text
    (w,) = first.learning_warnings
    assert (w["condition"], w["update"], w["metric"]) == (PLATEAU, 2, "val/per")
    assert bars[0] == (3, {**bars[0][1], PROGRESS_BAR_KEY: 1.0})
    run = RunDir(first.run_dir)
    assert json.loads(run.results_file.read_text())["learning_warnings"] == first.learning_warnings
    state = torch.load(run.checkpoints / "last.ckpt", map_location="cpu", weights_only=True)["callbacks"]
    assert state["LearningWatch"]["warnings"] == first.learning_warnings
    assert [h["update"] for h in state["LearningWatch"]["history"]] == [1, 2, 3]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastasr.training.callbacks.not_learning"):
        resumed = fastasr.training.fit.train(compose_train(tiny_corpus, tmp_path, "trainer.max_epochs=4", *overrides))
    assert WARNING not in caplog.text  # not repeated
    assert resumed.learning_warnings == first.learning_warnings  # nor lost
    assert bars[1] == (4, {**bars[1][1], PROGRESS_BAR_KEY: 1.0})  # the resumed run's bar shows it


def test_an_older_checkpoint_restored_for_the_test_does_not_erase_what_fit_saw():
    """trainer.test(ckpt_path=best) restores the callbacks' state too; the best checkpoint of a
    run on the plateau is older than its warning."""
    watch = LearningWatch(after_updates=600)
    feed(watch, [(300, 3.0, 99.0)])
    best = watch.state_dict()
    feed(watch, [(700, 2.9, 98.0)])
    warned = [dict(w) for w in watch.warnings]
    watch.load_state_dict(best)
    assert watch.warnings == warned != [] and len(watch.history) == 2
