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

__all__ = ["valid_positions", "key_mask", "zero_padded_queries", "check_lengths"]


def check_lengths(lengths: torch.Tensor | None, batch: int, n: int) -> torch.Tensor | None:
    """Validate ``lengths`` for a ``(batch, ..., n, ...)`` input; return it as int64 (or None).

    Raises:
        ValueError: wrong shape, non-integer dtype, or a value outside ``[0, n]``.
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
    if batch and bool(((lengths < 0) | (lengths > n)).any()):
        raise ValueError(
            f"attention: lengths must lie in [0, {n}] (the sequence axis); got "
            f"min {int(lengths.min())}, max {int(lengths.max())}"
        )
    return lengths


def valid_positions(
    lengths: torch.Tensor | None, batch: int, n: int, device: torch.device
) -> torch.Tensor:
    """``(B, N)`` bool: True at valid positions (everywhere if ``lengths`` is None)."""
    if lengths is None:
        return torch.ones(batch, n, dtype=torch.bool, device=device)
    return torch.arange(n, device=device)[None, :] < lengths.to(device)[:, None]


def key_mask(
    lengths: torch.Tensor | None, batch: int, n: int, device: torch.device
) -> torch.Tensor:
    """``(B, N)`` bool: keys a query may attend to.

    The valid keys; for an empty sequence (length 0) all keys, so its rows stay
    finite (its outputs are zeroed anyway).
    """
    valid = valid_positions(lengths, batch, n, device)
    if lengths is None:
        return valid
    return valid | (lengths.to(device) == 0)[:, None]


def zero_padded_queries(x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """Zero the padded query rows of ``x`` ``(B, H, N, ...)``; returns ``x`` unchanged if no lengths."""
    if lengths is None:
        return x
    B, _, N = x.shape[:3]
    valid = valid_positions(lengths, B, N, x.device)
    shape = (B, 1, N) + (1,) * (x.dim() - 3)
    return x.masked_fill(~valid.view(shape), 0)
