"""benchmarks/attention/cpu_table.py (what `make bench` runs): the table, the targets, the paper's column."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, *extra) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.attention.cpu_table", "--quick", "--out-dir", str(tmp_path), *extra],
        capture_output=True, text=True, timeout=600, env={"PYTHONPATH": str(ROOT / "src"), "PATH": ""}, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (md,) = tmp_path.glob("cpu_*.md")
    assert len(list(tmp_path.glob("cpu_*.csv"))) == 1
    return md.read_text()


@pytest.mark.slow
def test_cpu_bench_writes_the_table_with_or_without_the_papers_code(tmp_path):
    text = _run(tmp_path / "with")
    for heading in ("## forward: ms per call", "## forward+backward: ms per call", "## Targets",
                    "## Error to full attention"):
        assert heading in text
    assert "| 64 | 4 |" in text and "| 128 | 2 |" in text
    assert "i-clustered-8 forward+backward vs SDPA from N = 2048: not measured" in text
    try:
        import fast_transformers  # noqa: F401
    except ImportError:
        assert "not importable" in text
    else:
        assert "its C++ CPU kernels, benchmark only" in text and "| n/a |" not in text
    text = _run(tmp_path / "without", "--no-theirs")
    assert "vs pytorch-fast-transformers 0.4.0: not measured (skipped (--no-theirs))" in text


def test_step_times_floor_with_torch_dropout_keeps_the_feed_forwards_gelu():
    """benchmarks/step/cpu.py's "floor, torch dropout": every dropout torch's own, the
    feed-forward's ``GeluDropout`` a GELU and torch's dropout, so in eval the same model as the
    floor (the same weights: one seed)."""
    import torch
    from torch import nn

    from benchmarks.step import cpu as step_time
    floor, torch_dropout = (step_time.build_model(spec, 1) for spec in (step_time.FLOOR, step_time.FLOOR_TORCH_DROPOUT))
    dropouts = [m for m in torch_dropout.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(type(m) is nn.Dropout for m in dropouts)
    feats, lengths, _, _ = step_time.make_batch(32, 64)
    with torch.no_grad():
        torch.testing.assert_close(torch_dropout.eval()(feats, lengths)[0], floor.eval()(feats, lengths)[0])


@pytest.mark.parametrize("graphed", ["CapturedStepper", "UpdateGraphedStepper"])
def test_gpu_step_graphed_split_step_updates_the_model_as_the_eager_step(monkeypatch, graphed):
    """benchmarks/step/gpu.py's ``CapturedStepper`` (training's ``CapturedSteps``, the stand-in
    backend off CUDA) and ``UpdateGraphedStepper``, whose capture runs eagerly off CUDA: the
    first's split step (its first step eager; then the forward; CTC on its detached output; the
    backward from CTC's gradient; clipping and RAdam), the second's update on its own copy of the
    gradients, leave the parameters ``GpuStepper``'s step leaves, from the same model, batch and
    draws, over three steps."""
    import torch

    from benchmarks.step import gpu as gpu_step
    monkeypatch.setattr(gpu_step, "DEVICE", torch.device("cpu"))
    batch = gpu_step.make_batch(32, 64)
    moved = {}  # each parameter's change over the steps (lr 1e-4: compared as changes, not values)
    for stepper_class in (gpu_step.GpuStepper, getattr(gpu_step, graphed)):
        stepper = stepper_class("clustered-8", None, (), 1)
        before = [p.detach().clone() for p in stepper.model.parameters()]
        torch.manual_seed(1)  # the same dropout masks and hash planes
        for _ in range(3):
            stepper.step(batch)
        moved[stepper_class.__name__] = [p.detach() - b for p, b in zip(stepper.model.parameters(), before)]
    assert sum(int(d.count_nonzero()) for d in moved["GpuStepper"]) > 10_000  # the steps moved them
    torch.testing.assert_close(moved[graphed], moved["GpuStepper"], rtol=1e-3, atol=1e-9)
    if graphed == "CapturedStepper":  # its second and third steps replayed the shape's graphs
        assert stepper.captured.summary()["captured"] == [tuple(batch[0].shape)]
