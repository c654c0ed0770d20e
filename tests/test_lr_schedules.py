"""Learning-rate schedules: the warm-up's rate at given updates, and its composition with the
plateau schedule (fastasr.training.lr_schedules, conf/scheduler)."""

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fastasr.config import CONFIG_DIR
from fastasr.training.lr_schedules import build_lr_schedulers

LR = 1e-3


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.RAdam([torch.nn.Parameter(torch.zeros(2))], lr=LR)


def _scheduler_config(option: str, *overrides: str) -> dict:
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"scheduler={option}", *overrides])
    return OmegaConf.to_container(cfg.scheduler, resolve=True)


def _lr(opt) -> float:
    return opt.param_groups[0]["lr"]


def _update(opt, warmup) -> None:
    """One training update as Lightning runs it: optimiser step, then the step-interval scheduler."""
    opt.step()
    warmup.step()


def test_warmup_rate_at_given_updates():
    opt = _optimizer()
    scheds = build_lr_schedulers(opt, _scheduler_config("warmup_plateau", "scheduler.warmup_steps=100",
                                                        "scheduler.warmup_start_factor=0.01"))
    assert [s["interval"] for s in scheds] == ["epoch", "step"]
    assert scheds[0]["monitor"] == "val/loss"
    warmup = scheds[1]["scheduler"]
    seen = {}
    for t in range(151):  # rate used by update t (0-based)
        seen[t] = _lr(opt)
        _update(opt, warmup)
    expected = {t: LR * (0.01 + 0.99 * min(t, 100) / 100) for t in (0, 1, 10, 50, 99, 100, 150)}
    for t, lr in expected.items():
        assert seen[t] == pytest.approx(lr, rel=1e-6), t


def test_plateau_halving_during_and_after_warmup_composes():
    opt = _optimizer()
    plateau_cfg, warmup_cfg = build_lr_schedulers(
        opt, _scheduler_config("warmup_plateau", "scheduler.warmup_steps=10", "scheduler.patience=0"))
    plateau, warmup = plateau_cfg["scheduler"], warmup_cfg["scheduler"]
    assert isinstance(plateau, torch.optim.lr_scheduler.ReduceLROnPlateau)
    for _ in range(5):
        _update(opt, warmup)
    plateau.step(1.0)  # first validation: sets the best loss
    plateau.step(2.0)  # worse: halve (patience 0)
    assert _lr(opt) == pytest.approx(0.5 * LR * (0.01 + 0.99 * 5 / 10))
    for _ in range(10):
        _update(opt, warmup)
    assert _lr(opt) == pytest.approx(0.5 * LR)  # the ramp ends at half the peak, then stays
    plateau.step(3.0)
    assert _lr(opt) == pytest.approx(0.25 * LR)
    _update(opt, warmup)
    assert _lr(opt) == pytest.approx(0.25 * LR)  # the finished warm-up no longer touches the rate


def test_plateau_alone_and_constant_rate():
    opt = _optimizer()
    (only,) = build_lr_schedulers(opt, _scheduler_config("plateau"))
    assert isinstance(only["scheduler"], torch.optim.lr_scheduler.ReduceLROnPlateau)
    assert _lr(opt) == LR
    assert build_lr_schedulers(_optimizer(), _scheduler_config("none")) == []
    assert build_lr_schedulers(_optimizer(), None) == []


def test_warmup_to_a_constant_rate():
    opt = _optimizer()
    (warm,) = build_lr_schedulers(opt, {"warmup_steps": 4, "warmup_start_factor": 0.25})
    rates = []
    for _ in range(6):
        rates.append(_lr(opt))
        _update(opt, warm["scheduler"])
    assert rates == pytest.approx([LR * f for f in (0.25, 0.4375, 0.625, 0.8125, 1.0, 1.0)])


@pytest.mark.parametrize("bad, message", [
    ({"warmup_steps": 10, "warmup_start_factor": 0.0}, "warmup_start_factor 0.0"),
    ({"warmup_steps": -5}, "warmup_steps -5"),
    ({"factor": 0.5}, "no _target_"),
])
def test_bad_scheduler_config_is_named(bad, message):
    with pytest.raises(ValueError, match=message):
        build_lr_schedulers(_optimizer(), bad)


# ---------------------------------------------------------------- the budget schedule (recipe=real_speech)
def _budget(opt, **kw):
    (entry,) = build_lr_schedulers(opt, {**_scheduler_config("budget"), **kw})
    assert entry["interval"] == "step" and "monitor" not in entry
    return entry["scheduler"]


def test_budget_schedule_shape_over_the_budget():
    """Warm-up by updates, then a linear decay by the fraction of the budget spent, to final_factor."""
    from fastasr.training.lr_schedules import BudgetSchedule

    opt = _optimizer()
    spent = {"p": 0.0}
    sched = _budget(opt, warmup_steps=10, warmup_start_factor=0.1, decay_fraction=1.0, final_factor=0.01)
    assert isinstance(sched, BudgetSchedule)
    sched.progress = lambda: spent["p"]
    rates = []
    for _ in range(10):  # warm-up: progress still 0
        rates.append(_lr(opt))
        _update(opt, sched)
    assert rates == pytest.approx([LR * (0.1 + 0.9 * t / 10) for t in range(10)])
    assert _lr(opt) == pytest.approx(LR)  # the peak after warm-up
    for p in (0.25, 0.5, 1.0, 1.3):
        spent["p"] = p
        _update(opt, sched)
        assert _lr(opt) == pytest.approx(LR * (0.01 + 0.99 * (1 - min(p, 1.0))))


def test_budget_schedule_holds_then_cosine():
    opt = _optimizer()
    spent = {"p": 0.0}
    sched = _budget(opt, warmup_steps=0, decay_fraction=0.4, final_factor=0.0, decay="cosine")
    sched.progress = lambda: spent["p"]
    for p, factor in ((0.0, 1.0), (0.3, 1.0), (0.6, 1.0), (0.8, 0.5), (1.0, 0.0)):
        spent["p"] = p
        _update(opt, sched)
        assert _lr(opt) == pytest.approx(LR * factor, abs=1e-12), p


def test_budget_schedule_state_resumes_without_the_progress_callable():
    """The state dict holds no callable (checkpoints load with weights_only=True) and a restored
    schedule continues at the same update."""
    from fastasr.training.lr_schedules import BudgetSchedule

    opt = _optimizer()
    sched = BudgetSchedule(opt, warmup_steps=100, progress=lambda: 0.0)
    for _ in range(30):
        _update(opt, sched)
    state = sched.state_dict()
    assert "progress" not in state and state["last_epoch"] == 30
    opt2 = _optimizer()
    again = BudgetSchedule(opt2, warmup_steps=100)
    again.load_state_dict(state)
    _update(opt2, again)
    assert _lr(opt2) == pytest.approx(LR * (0.01 + 0.99 * 31 / 100))


@pytest.mark.parametrize("bad, message", [
    ({"decay": "step"}, "scheduler.decay 'step'"),
    ({"decay_fraction": 1.5}, "decay_fraction 1.5"),
    ({"final_factor": -0.1}, "final_factor -0.1"),
    ({"warmup_start_factor": 0.0}, "warmup_start_factor 0.0"),
])
def test_bad_budget_schedule_is_named(bad, message):
    with pytest.raises(ValueError, match=message):
        _budget(_optimizer(), **bad)


def test_budget_progress_takes_the_budget_that_ends_first():
    from datetime import timedelta
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import Timer

    from fastasr.training.lr_schedules import budget_progress

    timer = Timer(duration=timedelta(seconds=100))
    timer.load_state_dict({"time_elapsed": {"train": 25.0}})  # resumed after 25 s of training
    loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(
        current=SimpleNamespace(ready=5))))
    trainer = SimpleNamespace(callbacks=[timer], max_steps=-1, max_epochs=-1, global_step=0,
                              num_training_batches=10, current_epoch=0, fit_loop=loop)
    assert budget_progress(trainer) == pytest.approx(0.25)  # time (not started: the restored offset)
    trainer.max_steps, trainer.global_step = 40, 20
    assert budget_progress(trainer) == pytest.approx(0.5)  # steps end first
    trainer.max_epochs, trainer.current_epoch = 2, 1
    assert budget_progress(trainer) == pytest.approx(0.75)  # 1.5 of 2 epochs
    trainer.callbacks, trainer.max_steps, trainer.max_epochs = [], -1, -1
    assert budget_progress(trainer) == 0.0  # no budget: the peak rate throughout
