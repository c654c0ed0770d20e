"""Captured training steps on a GPU (``make gpu-check``: ``pytest -m cuda``): N steps replayed as
CUDA graphs give the eager steps' losses and parameters, for full and clustered attention under
bf16 autocast, and the step reads nothing back to the host."""

from __future__ import annotations

import pytest
import torch
from test_captured_step import _batches, _fit_on, _lit

from fastasr.training.callbacks.throughput import ThroughputLogger
from fastasr.training.captured_step import CapturedSteps
from fastasr.training.graph_backends import CudaGraphs

pytestmark = pytest.mark.cuda

STEPS = 8


@pytest.mark.parametrize("attention", [
    "full", {"name": "clustered", "clusters": 3}, {"name": "i-clustered", "clusters": 3, "topk": 4},
    {"name": "topk", "k": 4}, {"name": "lsh", "rounds": 1, "chunk": 8, "buckets": 4}])
def test_captured_steps_train_as_eager_steps_under_bf16(attention):
    """Dropout 0 and no SpecAugment: the graphs replay the eager step's kernels, so the losses and
    parameters after N steps agree to bf16 rounding (the clustered variants' and LSH's hash
    planes are drawn at each replay from the device generator, whose stream a warm-up moves: a
    looser tolerance)."""
    from fastasr.attention import build_attention

    shared_qk = getattr(build_attention(attention), "requires_shared_qk", False)
    batches = _batches(shapes=((3, 40), (2, 64)), steps=STEPS)
    eager_losses, eager_params = _fit_on("gpu", _lit(attention, shared_qk=shared_qk), batches, precision="bf16-mixed")
    lit = _lit(attention, capture=True, shared_qk=shared_qk)
    lit.captured = CapturedSteps(lit.model, True, warmup=1, backend=CudaGraphs())
    losses, params = _fit_on("gpu", lit, batches, precision="bf16-mixed")
    summary = lit.captured.summary()
    assert sorted(summary["captured"]) == [(2, 64, 20), (3, 40, 20)] and not summary["failed"], summary
    tol = 2e-2 if attention != "full" else 5e-3
    torch.testing.assert_close(losses, eager_losses, rtol=tol, atol=tol)
    for a, b in zip(params, eager_params):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=tol, atol=tol)


def test_a_captured_step_syncs_with_the_host_nowhere():
    """After capture, a replayed step (forward graph, CTC on host lengths, backward and update
    graphs), the step-time logger's hooks and the non-finite guard's run under torch's sync debug
    mode set to error."""
    batches = _batches(shapes=((3, 40),), steps=4)
    lit = _lit("full", capture=True)
    lit.captured = CapturedSteps(lit.model, True, warmup=1, backend=CudaGraphs())

    class _Strict:
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx >= 2:
                torch.cuda.set_sync_debug_mode("error")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            torch.cuda.set_sync_debug_mode("default")

    import lightning as L

    strict = type("Strict", (L.Callback,), dict(vars(_Strict)))()
    # the step times' events and the non-finite guard's verdicts are recorded and read inside
    # the strict part of the step
    from fastasr.training.callbacks.nonfinite_loss import NonFiniteLossGuard

    _fit_on("gpu", lit, batches, precision="bf16-mixed", callbacks=[ThroughputLogger(), NonFiniteLossGuard(), strict],
            clip=None)
    assert lit.captured.summary()["captured"] == [(3, 40, 20)]


def test_a_nonfinite_captured_step_is_undone_on_the_gpu():
    """A NaN batch in a replayed step: the update graph undoes its update on the device, as the
    eager run's guard skips it; the guard counts it from the outcome read back later."""
    from test_captured_step import _poisoned

    from fastasr.training.callbacks.nonfinite_loss import NonFiniteLossGuard

    batches = _poisoned(_batches(shapes=((3, 40), (2, 64)), steps=STEPS), [4])
    eager_guard, guard = NonFiniteLossGuard(), NonFiniteLossGuard()
    _, eager_params = _fit_on("gpu", _lit("full"), batches, precision="bf16-mixed", callbacks=[eager_guard])
    lit = _lit("full", capture=True)
    lit.captured = CapturedSteps(lit.model, True, warmup=1, backend=CudaGraphs())
    _, params = _fit_on("gpu", lit, batches, precision="bf16-mixed", callbacks=[guard])
    assert eager_guard.skipped == guard.skipped == 1
    for a, b in zip(params, eager_params):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=5e-3, atol=5e-3)
