"""Batches that fill the GPU: the probe's search for the largest budget a device holds
(``callbacks.largest_batch_probe.fill_device``), run on the CPU against a fake memory limit."""

from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace

import pytest
import torch

from fastasr.training.callbacks.largest_batches import LargestBatchProbe, largest_fitting


def _memory(limit):
    tried = []

    def attempt(budget):
        tried.append(budget)
        if budget > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory: {budget} frames")

    return attempt, tried


@pytest.mark.parametrize("limit", [8000, 8001, 31_000, 123_457, 999_999])
def test_the_search_finds_the_largest_budget_within_its_tolerance(limit):
    attempt, tried = _memory(limit)
    found = largest_fitting(attempt, 8000, 1_000_000, tolerance=0.05)
    assert found <= limit and found >= limit * 0.95 - 1
    assert len(tried) <= 18 and len(set(tried)) == len(tried)  # no budget tried twice


def test_the_search_halves_when_the_start_does_not_fit_and_stops_at_the_ceiling():
    attempt, _ = _memory(3000)
    assert 2850 <= largest_fitting(attempt, 8000, 1_000_000) <= 3000
    attempt, tried = _memory(10**9)
    assert largest_fitting(attempt, 8000, 50_000) == 50_000 and max(tried) == 50_000
    attempt, _ = _memory(10)
    assert largest_fitting(attempt, 8000, 50_000, floor=100) is None


class _Data:
    def __init__(self):
        self.max_frames_per_batch, self.budget = 8000, None

    def budget_ceiling(self):
        return 400_000

    def set_train_budget(self, frames):
        self.budget = frames


def test_the_probe_sets_the_budget_less_its_margin_and_says_why(caplog):
    data = _Data()
    trainer = SimpleNamespace(datamodule=data)
    module = torch.nn.Linear(1, 1)
    module.device = torch.device("cpu")
    probe = LargestBatchProbe(fill_device=True, margin=0.15, max_growth=None)
    attempt, _ = _memory(100_000)
    with caplog.at_level(logging.INFO, logger="fastasr.training.callbacks.largest_batches"):
        budget = probe.fill(trainer, module, attempt)
    assert data.budget == budget == probe.found and 0.95 * 85_000 <= budget <= 85_000
    line = caplog.records[-1].getMessage()
    assert line.startswith(f"batch budget {budget} frames on cpu: the largest budget in which")
    assert "15% margin" in line and "data.max_frames_per_batch=8000" in line and "fill_device=false" in line


@pytest.mark.parametrize("memory,corpus,budget,why", [
    (10**9, 400_000, 16_000, "max_growth 2 × data.max_frames_per_batch, which ran forward and backward with a 15% margin"),
    (10**9, 12_000, 12_000, "the corpus's ceiling, which ran"),
    (17_000, 400_000, None, "the largest budget in which"),  # memory bounds it: 85 % of what fitted
])
def test_the_probe_grows_the_budget_at_most_max_growth_times_and_keeps_its_margin(memory, corpus, budget, why, caplog):
    """The budget grows to at most ``max_growth`` × the config's (2 × 8,000 here) or the corpus's
    ceiling, whichever is lower, where the device holds it with the margin to spare; below that,
    memory bounds it, less the margin."""
    data = _Data()
    data.budget_ceiling = lambda: corpus
    probe = LargestBatchProbe(fill_device=True, margin=0.15)
    assert probe.max_growth == 2.0
    attempt, tried = _memory(memory)
    with caplog.at_level(logging.INFO, logger="fastasr.training.callbacks.largest_batches"):
        found = probe.fill(SimpleNamespace(datamodule=data), SimpleNamespace(device=torch.device("cpu"),
                                                                             training=True, train=lambda *a: None),
                           attempt)
    if budget is None:
        assert 0.95 * 0.85 * memory <= found <= 0.85 * memory
    else:
        assert found == budget and max(tried) <= budget / 0.85 + 1
    assert data.budget == found and why in caplog.records[-1].getMessage()


def test_the_probe_fills_a_gpu_only_unless_told():
    assert LargestBatchProbe().fill_device == "auto"
    with pytest.raises(ValueError, match="fill_device"):
        LargestBatchProbe(fill_device="yes")
    with pytest.raises(ValueError, match="margin"):
        LargestBatchProbe(margin=1.0)
    with pytest.raises(ValueError, match="max_growth"):
        LargestBatchProbe(max_growth=0.5)


_OPTIMIZER = object()


def _run(device="cuda", setting=True, accumulate=1, world_size=1, optimizers=(_OPTIMIZER,)):
    from fastasr.training.captured_step import CapturedSteps

    model = torch.nn.Linear(1, 1)
    module = SimpleNamespace(device=torch.device(device), captured=CapturedSteps(model, setting))
    trainer = SimpleNamespace(optimizers=list(optimizers), world_size=world_size, strategy=SimpleNamespace(model=None),
                              accumulate_grad_batches=accumulate)
    return trainer, module


def test_a_run_holds_its_graphs_memory_only_where_its_steps_are_captured():
    """Captured steps keep their graphs' pool beside the eager steps of a shape not yet
    captured: the probe plans for it where capture runs (a CUDA device, capture on, nothing that
    keeps the steps eager), as ``CapturedSteps.start`` decides."""
    from fastasr.training.callbacks.largest_batches import graphs_held

    assert graphs_held(*_run())
    assert not graphs_held(*_run(setting=False))
    assert not graphs_held(*_run(device="cpu"))
    assert not graphs_held(*_run(accumulate=2))  # a captured backward cannot accumulate: eager
    assert not graphs_held(*_run(world_size=2))  # several processes without a DDP wrapper: eager
    assert not graphs_held(*_run(optimizers=()))
    trainer, module = _run()
    module.captured = None  # capture_steps=false: the plain module
    assert not graphs_held(trainer, module)


def test_a_held_pass_runs_twice_beside_a_block_of_the_first_passs_peak(monkeypatch):
    """With the graphs held, the batch runs forward and backward twice, the second beside a block
    as large as the first pass's peak above what was allocated before it; an out-of-memory error
    of the second pass propagates (that budget does not fit a captured run), the block freed."""
    from fastasr.training.callbacks import largest_batches

    events, weight = [], torch.nn.Parameter(torch.ones(3))
    monkeypatch.setattr(largest_batches, "_allocated", lambda device: 5_000)
    monkeypatch.setattr(largest_batches, "_reset_peak", lambda device: events.append("reset"))
    monkeypatch.setattr(largest_batches, "_peak", lambda device: 5_000 + 1_234)
    empty = torch.empty

    def recording_empty(*size, **kwargs):
        if kwargs.get("dtype") is torch.uint8:
            events.append(f"block {size[0]}")
        return empty(*size, **kwargs)

    monkeypatch.setattr(torch, "empty", recording_empty)

    def loss(batch):
        events.append("pass")
        if batch.get("second_fails") and events.count("pass") == 2:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return (weight * 2).sum(), None, None

    module = SimpleNamespace(device=torch.device("cpu"), _loss=loss, zero_grad=lambda set_to_none: events.append("zero"))
    trainer = SimpleNamespace(precision_plugin=SimpleNamespace(train_step_context=contextlib.nullcontext))
    largest_batches.forward_backward(trainer, module, {})
    assert events == ["pass", "zero"]
    events.clear()
    largest_batches.forward_backward(trainer, module, {}, hold_graphs=True)
    assert events == ["reset", "pass", "zero", "block 1234", "pass", "zero"]
    events.clear()
    with pytest.raises(torch.OutOfMemoryError):
        largest_batches.forward_backward(trainer, module, {"second_fails": True}, hold_graphs=True)
    assert events == ["reset", "pass", "zero", "block 1234", "pass", "zero"]


def test_a_captured_run_fills_the_device_with_two_steps_memory(monkeypatch, caplog):
    """Where the graphs are held, each budget the search tries runs held twice, so the budget
    found is what two steps fit (half, here, where memory grows with the frames), and the run's
    first lines say so."""
    from fastasr.training.callbacks import largest_batches

    limit, holds = 100_000, []

    def forward_backward(trainer, module, batch, hold_graphs=False):
        holds.append(hold_graphs)
        if batch["frames"] * (2 if hold_graphs else 1) > limit:
            raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(largest_batches, "forward_backward", forward_backward)
    monkeypatch.setattr(largest_batches, "graphs_held", lambda trainer, module: True)
    data = _Data()
    data.pessimistic_batch = lambda budget: {"frames": budget}
    module = SimpleNamespace(device=torch.device("cpu"), training=True, train=lambda *a: None,
                             transfer_batch_to_device=lambda batch, device, index: batch)
    probe = LargestBatchProbe(fill_device=True, margin=0.15, max_growth=None)
    with caplog.at_level(logging.INFO, logger="fastasr.training.callbacks.largest_batches"):
        budget = probe.fill(SimpleNamespace(datamodule=data), module)
    assert holds and all(holds)
    assert 0.95 * 0.85 * limit / 2 <= budget <= 0.85 * limit / 2
    assert "ran forward and backward twice, the first's memory held" in caplog.records[-1].getMessage()
