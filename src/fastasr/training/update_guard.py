"""A captured step's update undone on the device when its loss or gradients are not finite.

``callbacks.nonfinite_loss`` skips the update of a batch whose loss or gradients are NaN or
infinite. In an eager step it decides on the host: one value read back a step, which on a GPU
waits for the step's backward before the update can be issued. A captured step
(:mod:`fastasr.training.captured_step`) decides on the device instead, inside its update graph,
so that the host can queue the next step while this one runs:

1. the state the update changes (the parameters and every tensor of their optimiser state:
   RAdam's moments and step counts) is copied aside, one foreach copy;
2. the verdict: the loss's finiteness (:attr:`DeviceUpdateGuard.loss_finite`, which the callback
   fills before the replay) and the gradients' norm's (the one norm of the update: the clipping
   and the ``train/grad_norm`` log reuse it);
3. where the verdict is "not finite", the gradients are set to 0 (their NaN and infinities
   cleared first), so that the update's result stays finite; a finite step's gradients are
   left as they are;
4. clipping and the optimiser's step, as ever;
5. the state is set back to its copy where the verdict says so: ``state × finite + copy ×
   (1 - finite)``, which leaves a finite step's values as they are and restores a skipped
   step's exactly (both terms are finite, and one of them is a zero).

A finite step's update is the eager step's; a skipped step leaves the parameters and the
optimiser's state as an eager skip does (no parameter has a gradient, so the optimiser changes
nothing). :attr:`DeviceUpdateGuard.finite` holds the verdict after each replay, which the
callback reads back later, without waiting, for its warnings and counts.
"""

from __future__ import annotations

import torch
from torch import nn


class DeviceUpdateGuard:
    """The device-side skip of a captured update (module docstring).

    Args:
        device: where the step runs.

    :meth:`before` and :meth:`after` run inside the update graph's function, around the
    clipping and the optimiser's step.
    """

    def __init__(self, device: torch.device) -> None:
        #: 1.0 where this step's loss is finite, else 0.0 (a static input: filled before a replay).
        self.loss_finite = torch.ones((), device=device)
        #: 1.0 where this step's update was kept, 0.0 where it was undone (written by each replay).
        self.finite = torch.ones((), device=device)
        # the copies, one list for each set of state shapes: each update graph holds its own list
        # for good (a list replaced under a graph would leave it writing freed memory)
        self._copies: dict[tuple, list[torch.Tensor]] = {}
        self._saved: list[torch.Tensor] = []  # the copies of the update in progress

    @staticmethod
    def _state(params: list[nn.Parameter], optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        """What an update changes: the parameters, then each one's optimiser-state tensors."""
        state = list(params)
        for p in params:
            values = optimizer.state.get(p, {})
            state += [values[k] for k in sorted(values) if isinstance(values[k], torch.Tensor)]
        return state

    @torch.no_grad()
    def before(self, params: list[nn.Parameter], optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """Copy the state aside, take the verdict, and give a step that is not finite zero
        gradients (its non-finite values cleared first: ``0 × NaN`` is NaN), so that its update
        leaves the state finite, whatever a huge gradient would have made of RAdam's squares.
        Returns the gradients' L2 norm as they came (the verdict's, which the clipping reuses)."""
        state = self._state(params, optimizer)
        shapes = tuple((t.shape, t.dtype) for t in state)
        if shapes not in self._copies:
            self._copies[shapes] = [torch.empty_like(t) for t in state]
        self._saved = self._copies[shapes]
        torch._foreach_copy_(self._saved, state)
        grads = [p.grad for p in params]
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        self.finite.copy_(self.loss_finite * torch.isfinite(norm))
        for grad in grads:
            torch.nan_to_num_(grad, nan=0.0, posinf=0.0, neginf=0.0)
        torch._foreach_mul_(grads, self.finite)
        return norm

    @torch.no_grad()
    def after(self, params: list[nn.Parameter], optimizer: torch.optim.Optimizer) -> None:
        """Set the state back to its copy where the step was not finite: ``state × finite + copy
        × (1 - finite)``, exact either way since both are finite. Foreach products by a device
        tensor (``_foreach_mul_.Tensor``); ``_foreach_lerp_`` takes its weight as a host scalar
        only, a read back that no capture holds."""
        state = self._state(params, optimizer)
        torch._foreach_mul_(state, self.finite)
        torch._foreach_mul_(self._saved, 1.0 - self.finite)
        torch._foreach_add_(state, self._saved)
