"""The device-side skip of a captured update (fastasr.training.update_guard): a finite step is
the optimiser's own, a step that is not finite leaves parameters and optimiser state exactly as
they were, whatever its gradients hold."""

from __future__ import annotations

import pytest
import torch

from fastasr.training.update_guard import DeviceUpdateGuard


def _setup():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(3))]
    optimizer = torch.optim.RAdam(params, lr=1e-2, weight_decay=0.01, decoupled_weight_decay=True)
    for p in params:  # an earlier step: the state exists
        p.grad = torch.randn_like(p)
    optimizer.step()
    return params, optimizer


def _snapshot(params, optimizer):
    return [p.detach().clone() for p in params] + [
        t.clone() for p in params for t in optimizer.state[p].values() if isinstance(t, torch.Tensor)]


def _guarded_step(params, optimizer, grads, loss_finite=1.0):
    guard = DeviceUpdateGuard(torch.device("cpu"))
    guard.loss_finite.fill_(loss_finite)
    for p, g in zip(params, grads):
        p.grad = g.clone()
    guard.before(params, optimizer)
    optimizer.step()
    guard.after(params, optimizer)
    return float(guard.finite)


@pytest.mark.parametrize("bad", ["nan", "inf", "huge", "loss"])
def test_a_step_that_is_not_finite_leaves_everything_as_it_was(bad):
    """NaN or infinite gradients, finite ones whose squares overflow (1e30: RAdam's second
    moment would be infinite, which no product by zero could set back), or a non-finite loss
    with finite gradients."""
    params, optimizer = _setup()
    before = _snapshot(params, optimizer)
    grads = [torch.randn_like(p) for p in params]
    grads[0][1, 2] = {"nan": float("nan"), "inf": float("inf"), "huge": 1e30, "loss": 1.0}[bad]
    if bad == "huge":
        grads[0].fill_(1e30)
    finite = _guarded_step(params, optimizer, grads, loss_finite=0.0 if bad == "loss" else 1.0)
    assert finite == 0.0
    for a, b in zip(_snapshot(params, optimizer), before):
        assert torch.equal(a, b)


def test_a_finite_step_is_the_optimisers_own():
    params, optimizer = _setup()
    twins, twin_optimizer = _setup()
    grads = [torch.randn_like(p) for p in params]
    assert _guarded_step(params, optimizer, grads) == 1.0
    for p, g in zip(twins, grads):
        p.grad = g.clone()
    twin_optimizer.step()
    for a, b in zip(_snapshot(params, optimizer), _snapshot(twins, twin_optimizer)):
        assert torch.equal(a, b)


def test_each_set_of_state_shapes_keeps_its_own_copies():
    """A captured update graph writes its copies at every replay: the copies of one set of
    parameters stay the same tensors after another set's update, never replaced (a graph would
    then write memory freed under it)."""
    params, optimizer = _setup()
    guard = DeviceUpdateGuard(torch.device("cpu"))
    for p in params:
        p.grad = torch.randn_like(p)
    guard.before(params, optimizer)
    first = guard._saved
    guard.before(params[:1], optimizer)  # another update's parameters: other shapes
    assert guard._saved is not first and len(guard._saved) < len(first)
    guard.before(params, optimizer)
    assert guard._saved is first
