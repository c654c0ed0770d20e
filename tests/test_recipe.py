"""The recorded-speech recipe (conf/recipe/real_speech.yaml): what data=manifest chooses, and a
run that the wall-clock budget ends, with the learning rate decayed over that budget."""

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_train_eval import TINY_MODEL

import fastasr.recognition.final_decoding
from fastasr.config import CONFIG_DIR
from fastasr.recognition.final_decoding import FinalDecodingRequest, tune_vocabulary_and_weights
from fastasr.recognition.scoring import TuningResult
from fastasr.training.fit import final_decoding_request, train


def _compose(*overrides: str):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=list(overrides))


@pytest.mark.parametrize("data", ["manifest", "digits", "librispeech", "timit", "kaldi", "commonvoice"])
def test_recorded_speech_data_chooses_the_real_speech_recipe(data):
    cfg = _compose(f"data={data}")
    assert cfg.scheduler._target_ == "fastasr.training.lr_schedules.BudgetSchedule"
    assert cfg.trainer.max_epochs == -1 and cfg.trainer.max_time == "00:00:30:00"
    assert cfg.data.augment.speed_perturb is True and cfg.model.utterance_cmvn is True
    assert cfg.model.xscaling is True and cfg.model.positions == "absolute"  # content, not the sinusoids, fills the input
    assert cfg.final_average == {"best": 5}
    assert cfg.final_tuning.beam_size == 50 and cfg.final_decoding.beam_size == 500  # grid narrow, test wide
    assert cfg.final_tuning.extend_edges == 3  # a best weight on the grid's edge grows the grid past it
    # from the second epoch, dropout by the epochs the budget affords: none below 20, 0.1 from 40
    assert cfg.model.dropout == 0.0 and cfg.callbacks.budget_dropout.p == 0.1
    assert list(cfg.callbacks.budget_dropout.epochs) == [20, 40]
    assert cfg.trainer.precision == "auto"  # bf16-mixed where the hardware multiplies bfloat16
    assert cfg.data.cache.mode == "build"  # filterbanks of every split and speed factor computed once, then read


def test_the_final_tuning_searches_its_grid_at_its_own_beam_and_decodes_at_the_full_one(monkeypatch):
    """final_tuning.beam_size narrows the dev grid's beam only: the chosen decoding keeps the
    final decoding's width (recorded in tuned_on_dev as beam_size); without it the grid searches
    at the final decoding's own width."""
    searched = []

    def grid(recogniser, manifest, decoding, lm_weights, word_scores, extend_edges=0, **_):
        searched.append((decoding["beam_size"], extend_edges))
        best = {"lm_weight": lm_weights[-1], "word_score": word_scores[0], "wer": 10.0, "per": 5.0}
        return TuningResult(manifest=manifest, best=best, points=[best])

    monkeypatch.setattr(fastasr.recognition.final_decoding, "tune_recogniser", grid)
    monkeypatch.setattr(fastasr.recognition.final_decoding, "manifest_emissions", lambda *a, **k: ([], []))
    recogniser = SimpleNamespace(tokenizer=SimpleNamespace(kind="phoneme"), training_manifest=None)
    spec = {"name": "beam", "beam_size": 500, "lm": {"source": "auto"}, "lm_weight": 2.0, "word_score": 0.0}
    for beam, expected, extend in ((50, 50, 3), (None, 500, None)):
        request = FinalDecodingRequest(spec, "test.jsonl", dev_manifest="dev.jsonl", accelerator="cpu",
                                       tuning={"lm_weight": [0.5, 1.5], "word_score": [-1.0], "beam_size": beam,
                                               "extend_edges": extend})
        tuned = tune_vocabulary_and_weights(recogniser, request, spec, None)
        assert searched[-1] == (expected, extend or 0) and tuned.beam_size == expected
        assert tuned.decoding == dict(spec, lm_weight=1.5, word_score=-1.0)  # the full width, the grid's weights


def test_training_asks_its_final_decoding_from_its_config():
    """train() hands the final decoding a typed request: the recipe's decoding and tuning grid, the
    data config's splits and batching, the training device and seed; nothing of the config else."""
    manifests = ("data.train_manifest=c/train.jsonl", "data.dev_manifest=c/dev.jsonl", "data.test_manifest=c/test.jsonl")
    cfg = _compose("data=manifest", "tokenizer=char", *manifests, "trainer.accelerator=cpu",
                   "data.num_workers=1", "seed=7", "trainer.enable_progress_bar=false")
    request = final_decoding_request(cfg)
    assert request == FinalDecodingRequest(
        decoding=OmegaConf.to_container(cfg.final_decoding, resolve=True), test_manifest="c/test.jsonl",
        dev_manifest="c/dev.jsonl", tuning=OmegaConf.to_container(cfg.final_tuning, resolve=True),
        loader={"max_frames_per_batch": cfg.data.max_frames_per_batch, "num_workers": 1,
                "on_bad_utterance": "skip"},
        training_manifest="c/train.jsonl", accelerator="cpu", seed=7, progress=False)
    assert request.decoding["beam_size"] == 500 and request.tuning["beam_size"] == 50
    assert final_decoding_request(_compose("data=manifest", *manifests, "trainer.accelerator=auto")).accelerator == "auto"
    builtin = final_decoding_request(_compose())  # the built-in recipe decodes at its own weights
    assert builtin.tuning is None and builtin.test_manifest.endswith("test.jsonl")


def test_the_builtin_corpus_and_the_paper_presets_keep_their_own_recipe():
    builtin = _compose()
    assert builtin.scheduler._target_.endswith("ReduceLROnPlateau")
    assert builtin.trainer.max_epochs == 30 and builtin.trainer.max_time == "00:00:18:00"
    assert builtin.model.layers == 4 and builtin.data.augment.speed_perturb is False
    # make train's encoder reads any length: no positions, order from the convolution modules
    assert builtin.model.positions == "none" and builtin.model.conv_kernel == 15
    assert builtin.model.xscaling is False  # make train's model as it was measured
    # bf16 mixed precision on a GPU, float32 on a CPU (where make train's numbers were measured)
    assert builtin.trainer.precision == "bf16-on-gpu"
    from fastasr.training.derived_config import auto_precision, resolve_train_config

    assert resolve_train_config(_compose("trainer.accelerator=cpu")).trainer.precision == "32-true"
    assert auto_precision("cpu", on_cpu=False) == "32-true"
    assert builtin.data.cache.mode == "auto"  # make train computes its features on the fly unless `make features` ran
    assert builtin.callbacks.get("budget_dropout") is None  # make train trains as it is
    for preset in ("paper_wsj", "paper_swbd", "matrix_member"):
        cfg = _compose(f"experiment={preset}")
        assert cfg.scheduler._target_.endswith("ReduceLROnPlateau"), preset
        assert cfg.data.augment.speed_perturb is False and cfg.model.utterance_cmvn is False, preset
        assert cfg.trainer.max_epochs > 0 and cfg.final_average is None, preset
        # the paper's model: added sinusoids and no convolution module
        assert cfg.model.positions == "absolute" and cfg.model.conv_kernel is None, preset
        assert cfg.model.xscaling is False, preset  # the paper's input: front end + sinusoids
    # a user's choice still wins over the recipe
    assert _compose("data=manifest", "recipe=builtin").scheduler._target_.endswith("ReduceLROnPlateau")
    assert _compose("data=manifest", "trainer.max_time=00:02:00:00").trainer.max_time == "00:02:00:00"


@pytest.mark.slow
def test_the_time_budget_ends_the_run_and_the_rate_decays_over_it(tiny_corpus, tmp_path, caplog):
    """No epoch cap: an 8-second budget stops training, and the learning rate logged at the last
    update has decayed from the peak towards final_factor × peak. The final beam + LM decoding's
    LM weight, word score and vocabulary are chosen on the dev split (final_tuning)."""
    cfg = _compose(
        "data=manifest", "tokenizer=char", f"data.train_manifest={tiny_corpus / 'train.jsonl'}",
        f"data.dev_manifest={tiny_corpus / 'dev.jsonl'}", f"data.test_manifest={tiny_corpus / 'test.jsonl'}",
        "data.num_workers=0", "data.augment.speed_perturb=false", *TINY_MODEL, "logger=csv",
        "trainer.accelerator=cpu", "trainer.enable_progress_bar=false", f"paths.output_dir={tmp_path}",
        "trainer.max_time=00:00:00:08", "trainer.log_every_n_steps=1", "scheduler.warmup_steps=0",
        "callbacks.lr_monitor.logging_interval=step", "name=budget",
        "final_tuning.lm_weight=[0.5,3.0]", "final_tuning.word_score=[0.0]", "final_tuning.frequent_words=[0,200]",
        "final_tuning.beam_size=4", f"data.cache.dir={tmp_path / 'feature_cache'}",
        "callbacks.budget_dropout.epochs=[1,1]",  # any budget affords one epoch: the dropout is raised
    )
    assert cfg.trainer.max_epochs == -1
    with caplog.at_level("INFO"):
        result = train(cfg)
    assert "Time limit reached" in caplog.text  # Lightning's Timer ended the run
    # the recipe built each split's feature cache before training (one per split; no speed factors here)
    built = sorted(p.name.split("-")[0] for p in (tmp_path / "feature_cache").iterdir())
    assert built == [f"{tiny_corpus.name}_{split}" for split in ("dev", "test", "train")], built
    state = torch.load(result.last_ckpt, map_location="cpu", weights_only=True)
    timer = next(v for k, v in state["callbacks"].items() if k.startswith("Timer"))
    assert timer["time_elapsed"]["train"] > 0.0  # in the checkpoint: a resumed run continues the budget
    (sched,) = state["lr_schedulers"]
    assert state["global_step"] >= 1 and sched["last_epoch"] == state["global_step"]
    peak = cfg.optim.lr
    assert sched["_last_lr"][0] < peak  # decayed with the budget spent (the exact shape: test_lr_schedules.py)
    rows = list(csv.DictReader(open(Path(result.run_dir) / "csv" / "version_0" / "metrics.csv")))
    rates = [float(r["lr-RAdam"]) for r in rows if r.get("lr-RAdam")]
    assert rates and all(a >= b for a, b in zip(rates, rates[1:])) and rates[0] <= peak
    final = json.loads((Path(result.run_dir) / "results.json").read_text())
    tuned = final["tuned_on_dev"]
    assert tuned["manifest"].endswith("dev.jsonl")
    searched = {(p["lm_weight"], p["word_score"]) for p in tuned["points"]}  # the grid, grown past a best edge
    assert {(0.5, 0.0), (3.0, 0.0)} <= searched and len(searched) <= 2 + cfg.final_tuning.extend_edges
    assert final["decoding"]["lm_weight"] == tuned["best"]["lm_weight"] and final["decoding"]["word_score"] == 0.0
    assert tuned["beam_size"] == 4 and final["decoding"]["beam_size"] == cfg.final_decoding.beam_size == 500
    # both vocabularies were tried on dev; the decoding used the winner's lexicon and LM
    assert [v["frequent_words"] for v in tuned["vocabularies"]] == [0, 200]
    opened = tuned["vocabularies"][1]
    assert opened["lm"].endswith("words-3gram-en200.arpa") and Path(opened["lexicon"]).is_file()
    winner = next(v for v in tuned["vocabularies"] if v["frequent_words"] == tuned["best"]["frequent_words"])
    assert (final["decoding"]["lm"] == winner["lm"]) == bool(winner["frequent_words"])  # the opened LM iff it won
    assert tuned["best"]["wer"] == min(v["best"]["wer"] for v in tuned["vocabularies"])
    # final_average: the best epochs' mean (as many as were written, up to 5) is what was tested and decoded
    averaged = Path(result.averaged_ckpt)
    assert averaged.name == "averaged.ckpt" and final["ckpt_path"] == str(averaged)
    assert 1 <= len(result.averaged_from) <= 5 and final["averaged_checkpoints"] == result.averaged_from
    # callbacks.budget_dropout: decided after the first epoch, in the results, the rate logged every epoch
    assert result.dropout["dropout"] == 0.1 and result.dropout["epochs"] >= 1 and final["budget_dropout"] == result.dropout
    logged = [float(r["train/dropout"]) for r in rows if r.get("train/dropout")]
    assert logged and all(rate == pytest.approx(0.1) for rate in logged)
