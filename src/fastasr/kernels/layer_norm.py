"""Layer normalisation over the last dimension, by torch or by the Triton kernels.

:class:`LayerNorm` is :class:`torch.nn.LayerNorm` (the same parameters, state-dict keys and
numbers) whose forward is :func:`layer_norm`. That is ``torch.nn.functional.layer_norm``, but
where the Triton kernels of :mod:`fastasr.kernels.triton_layer_norm` run it instead, by
``fastasr.kernels.ops``' rules for the op ``"layer_norm"`` (``FASTASR_KERNELS``):

* ``auto`` on a CUDA tensor: the Triton kernels while :data:`TRITON_LAYER_NORM` is True (the
  default: on the H200 at a677210 the floor's step kernels 16.4 / 20.8 ms against torch's 24.9 /
  29.3 at N = 800 / 3,200, the backward 210 against 404 µs a call; the eager step within its noise
  either way, since a Triton call costs the host about 480 µs to issue against torch's 200:
  ``benchmarks/step/layer_norm_gpu.py``); ``make gpu-check``'s step table times torch's again
  ("torch layer norm");
* ``triton``: the Triton kernels on every device (on the CPU under ``TRITON_INTERPRET=1``: how
  they are tested);
* otherwise torch's.

The Triton kernels take rows of at most ``triton_layer_norm.MAX_WIDTH`` values with a weight
and a bias; other calls are torch's. Under autocast they run as torch's layer norm does: on
CUDA in float32 (an op CUDA autocast runs in float32: a float32 output of half-precision
activations), on the CPU in the input's dtype. With ``cast_output`` (a layer norm whose every
consumer is a product autocast casts its input for: a pre-norm layer's projections) they write
the output under autocast in autocast's dtype instead: the values its consumers read, rounded
once, without a cast of theirs each (a layer's queries, keys and values cast the same output
three times, forward and backward); the gradients coming back are then summed in that dtype.
On torch's path ``cast_output`` casts the output to autocast's dtype once, under autocast
where :data:`CAST_ONCE` is True: the same values for the projections, one cast forward and
one back instead of three each. Off until a GPU times it: ``make gpu-check``'s
step table ("norms cast once").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastasr.kernels.availability import import_kernel_module
from fastasr.kernels.ops import kernel_backend

__all__ = ["LayerNorm", "layer_norm", "uses_triton", "TRITON_LAYER_NORM", "CAST_ONCE"]

#: Whether ``FASTASR_KERNELS=auto`` runs a CUDA tensor's layer norm by the Triton kernels.
TRITON_LAYER_NORM = True
#: Whether a ``cast_output`` layer norm on torch's path casts its output to autocast's dtype
#: under autocast, so that its consumers do not cast it each (module doc).
CAST_ONCE = False


def uses_triton(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
    """True if :func:`layer_norm` runs the Triton kernels for these arguments (module doc)."""
    return (kernel_backend(x, "layer_norm", auto_triton=TRITON_LAYER_NORM) == "triton" and len(normalized_shape) == 1
            and import_kernel_module("triton_layer_norm").applies(x, weight, bias))


def layer_norm(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5, *, cast_output: bool = False) -> torch.Tensor:
    """``torch.nn.functional.layer_norm``, by the Triton kernels where :func:`uses_triton`;
    ``cast_output``: where they run under autocast (or torch's does, with :data:`CAST_ONCE`),
    the output in autocast's dtype (module doc)."""
    if not uses_triton(x, normalized_shape, weight, bias):
        out = F.layer_norm(x, normalized_shape, weight, bias, eps)
        if cast_output and CAST_ONCE and torch.is_autocast_enabled(x.device.type):
            return out.to(torch.get_autocast_dtype(x.device.type))
        return out
    kernels = import_kernel_module("triton_layer_norm")
    device = x.device.type
    out_dtype = torch.get_autocast_dtype(device) if cast_output and torch.is_autocast_enabled(device) else None
    if device == "cuda" and torch.is_autocast_enabled("cuda"):  # as CUDA autocast runs torch's: in float32
        # (the launcher runs no op autocast casts: no autocast-free context, ~10 µs a call)
        return kernels.layer_norm(x.float(), weight.float(), bias.float(), eps, out_dtype)
    return kernels.layer_norm(x, weight, bias, eps, out_dtype)


class LayerNorm(nn.LayerNorm):
    """:class:`torch.nn.LayerNorm` by :func:`layer_norm` (the Triton kernels where they run).

    ``cast_output``: for a layer norm whose every consumer is a product autocast casts its input
    for (a pre-norm layer's projections): where the Triton kernels run under autocast, or
    torch's with :data:`CAST_ONCE`, its output in autocast's dtype (module doc)."""

    def __init__(self, *args, cast_output: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.cast_output = cast_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, cast_output=self.cast_output)
