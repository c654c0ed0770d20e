"""Learning-rate schedules: the warm-up's rate at given updates, and its composition with the
plateau schedule (fastasr.lr_schedules, conf/scheduler)."""

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fastasr.config import CONFIG_DIR
from fastasr.lr_schedules import build_lr_schedulers

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
