"""Padding masks shared by the attention variants.

Position ``n`` of sequence ``b`` is *valid* iff ``n < lengths[b]``. Every variant
follows the same rules:

* padded keys get exactly zero weight;
* padded queries output zeros (and have all-zero rows in ``dense_weights``);
* every softmax row has at least one finite entry, so nothing is ever NaN.
  For that, a sequence of length 0 lets its (padded, zeroed) queries see every
  key: :func:`key_mask` marks all its keys as attendable.
"""

from __future__ import annotations

import torch

from fastasr.kernels.padding import key_mask, valid_positions

__all__ = ["valid_positions", "key_mask", "zero_padded_queries", "check_lengths"]


def check_lengths(lengths: torch.Tensor | None, batch: int, n: int) -> torch.Tensor | None:
    """Validate ``lengths`` for a ``(batch, ..., n, ...)`` input; return it as int64 (or None).

    Never synchronises with an accelerator: the range of lengths on a device is checked
    by a device-side assertion (``torch._assert_async``), which fails the next
    synchronising call; lengths on the CPU are checked here.

    Raises:
        ValueError: wrong shape, non-integer dtype, or (CPU lengths) a value outside
            ``[0, n]``.
    """
    if lengths is None:
        return None
    if not isinstance(lengths, torch.Tensor):
        lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.shape[0] != batch:
        raise ValueError(
            f"attention: lengths must have shape ({batch},); got {tuple(lengths.shape)}"
        )
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise ValueError(f"attention: lengths must be an integer tensor; got {lengths.dtype}")
    lengths = lengths.to(torch.int64)
    if not batch:
        return lengths
    if lengths.device.type != "cpu":
        # No host synchronisation per call: the check runs on the device and fails the
        # next synchronising operation (a device-side assert) instead of raising here.
        torch._assert_async(
            ((lengths >= 0) & (lengths <= n)).all(),
            f"attention: lengths must lie in [0, {n}] (the sequence axis)",
        )
    elif bool(((lengths < 0) | (lengths > n)).any()):
        raise ValueError(
            f"attention: lengths must lie in [0, {n}] (the sequence axis); got "
            f"min {int(lengths.min())}, max {int(lengths.max())}"
        )
    return lengths


def zero_padded_queries(x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """Zero the padded query rows of ``x`` ``(B, H, N, ...)``; returns ``x`` unchanged if no lengths."""
    if lengths is None:
        return x
    B, _, N = x.shape[:3]
    valid = valid_positions(lengths, B, N, x.device)
    shape = (B, 1, N) + (1,) * (x.dim() - 3)
    return x.masked_fill(~valid.view(shape), 0)
