"""Greedy (best-path) CTC decoding."""

from __future__ import annotations

import torch


def ctc_greedy(log_probs: torch.Tensor, lengths: torch.Tensor, blank: int = 0) -> list[list[int]]:
    """Best-path decoding: argmax per frame, merge repeats, drop blanks.

    Args:
        log_probs: (B, T, V) frame scores (log-probabilities or logits).
        lengths: (B,) valid frames per utterance.
        blank: index of the CTC blank.

    Returns:
        One list of unit ids per utterance.
    """
    best = log_probs.argmax(dim=-1).cpu()  # (B, T)
    lengths = lengths.cpu()
    out: list[list[int]] = []
    for row, n in zip(best, lengths.tolist()):
        row = row[:n]
        keep = torch.ones_like(row, dtype=torch.bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != blank
        out.append(row[keep].tolist())
    return out
