"""Which positions of a padded batch are valid: the one definition every op and variant uses.

Position ``n`` of sequence ``b`` is *valid* iff ``n < lengths[b]`` (every position when
``lengths`` is None).
"""

from __future__ import annotations

import torch

__all__ = ["valid_positions", "key_mask"]


def valid_positions(
    lengths: torch.Tensor | None, batch: int, n: int, device: torch.device | str
) -> torch.Tensor:
    """``(B, N)`` bool: True at valid positions (everywhere if ``lengths`` is None)."""
    if lengths is None:
        return torch.ones(batch, n, dtype=torch.bool, device=device)
    return torch.arange(n, device=device)[None, :] < lengths.to(device)[:, None]


def key_mask(
    lengths: torch.Tensor | None, batch: int, n: int, device: torch.device | str
) -> torch.Tensor:
    """``(B, N)`` bool: keys a query may attend to.

    The valid keys; for an empty sequence (length 0) all keys, so its rows stay
    finite (its outputs are zeroed anyway).
    """
    valid = valid_positions(lengths, batch, n, device)
    if lengths is None:
        return valid
    return valid | (lengths.to(device) == 0)[:, None]
