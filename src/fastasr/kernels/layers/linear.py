"""Linear layers whose bias gradient is summed by a Triton kernel.

:class:`Linear` is :class:`torch.nn.Linear` (the same parameters, state-dict keys and numbers)
whose forward is :func:`linear`. That is ``torch.nn.functional.linear``, but where the Triton
kernel of :mod:`fastasr.kernels.layers.triton_column_sums` runs, by :mod:`fastasr.kernels.dispatch`'s rules for
the op ``"column_sums"`` (``FASTASR_KERNELS``), an autograd op of its own: the forward torch's
one product with the bias added by it (``addmm``), the backward torch's two products and the
bias's gradient, the output gradient's sum over the rows, by the Triton kernel:

* ``auto`` on a CUDA tensor: when :data:`TRITON_BIAS_GRADIENTS` is True; torch's otherwise. Off
  until a GPU times it: ``make gpu-check``'s step table ("Triton bias gradients");
* ``triton``: on every device (on the CPU under ``TRITON_INTERPRET=1``: how it is tested);
* otherwise torch's.

Under autocast it runs as torch's linear layer does: the input, weight and bias cast to
autocast's dtype, the output and the gradients in it (the parameters' float32 gradients by the
casts' backward, as autocast's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastasr.kernels.availability import import_kernel_module
from fastasr.kernels.dispatch import kernel_backend

__all__ = ["Linear", "linear", "uses_triton", "TRITON_BIAS_GRADIENTS"]

#: Whether ``FASTASR_KERNELS=auto`` sums a CUDA linear layer's bias gradient by the Triton kernel.
TRITON_BIAS_GRADIENTS = False


def uses_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """True if :func:`linear` takes the Triton bias gradient for these arguments (module doc)."""
    return (bias is not None and kernel_backend(x, "column_sums", auto_triton=TRITON_BIAS_GRADIENTS) == "triton"
            and weight.dim() == 2 and import_kernel_module("layers.triton_column_sums").applies(x))


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        rows = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(rows, weight)
        return torch.addmm(bias, rows, weight.t()).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dout):
        rows, weight = ctx.saved_tensors
        d = dout.reshape(-1, dout.shape[-1])
        dx = (d @ weight).view(*dout.shape[:-1], weight.shape[1]) if ctx.needs_input_grad[0] else None
        dw = d.t() @ rows if ctx.needs_input_grad[1] else None
        db = import_kernel_module("layers.triton_column_sums").column_sums(d) if ctx.needs_input_grad[2] else None
        return dx, dw, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.nn.functional.linear``, its bias gradient by the Triton kernel where
    :func:`uses_triton`."""
    if not uses_triton(x, weight, bias):
        return F.linear(x, weight, bias)
    device = x.device.type
    if torch.is_autocast_enabled(device):  # as autocast runs torch's: in its dtype
        dtype = torch.get_autocast_dtype(device)
        with torch.autocast(device, enabled=False):
            return _Linear.apply(x.to(dtype), weight.to(dtype), bias.to(dtype))
    return _Linear.apply(x, weight, bias)


class Linear(nn.Linear):
    """:class:`torch.nn.Linear` by :func:`linear` (the bias gradient by Triton where it runs)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
