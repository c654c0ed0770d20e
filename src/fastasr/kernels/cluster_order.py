"""Each (batch, head)'s positions sorted by cluster, and blocks of one cluster each.

What the Triton clustered products (:mod:`fastasr.kernels.triton_clustered`) run on:
one stable ``argsort`` per attention call, shared by every product of the forward and
the backward pass, and a table of blocks built on the device without a host
synchronisation. Plain PyTorch: testable anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["ClusterOrder", "cluster_order"]


@dataclass
class ClusterOrder:
    """Positions of each (batch, head) sorted by cluster, and the blocks that cover them.

    Computed once per attention call (one ``argsort``) and shared by every product and
    its backward. A *block* is up to ``BLOCK_N`` consecutive sorted positions of one
    cluster; :meth:`blocks` lays them out without a host synchronisation: each
    (batch, head) gets ``cdiv(N, BLOCK_N) + C`` block slots (an upper bound on
    ``sum_c cdiv(count_c, BLOCK_N)``), unused slots have cluster -1 and exit at once.

    Attributes:
        perm: ``(B, H, N)`` int64 position at each sorted slot (padded positions last).
        counts: ``(B*H, C)`` int64 valid members per cluster.
        starts: ``(B*H, C)`` int64 first sorted slot of each cluster.
    """

    perm: torch.Tensor
    counts: torch.Tensor
    starts: torch.Tensor
    _tables: dict = field(default_factory=dict)

    def blocks(self, block_n: int) -> tuple[torch.Tensor, int]:
        """``(B*H, P, 3)`` int64 rows ``[cluster, first sorted slot, rows]`` and ``P``."""
        if block_n not in self._tables:
            BH, C = self.counts.shape
            N = self.perm.shape[-1]
            P = -(-N // block_n) + C
            nblk = (self.counts + block_n - 1) // block_n
            ends = nblk.cumsum(-1)
            slot = torch.arange(P, device=self.perm.device).expand(BH, P).contiguous()
            cl = torch.searchsorted(ends, slot, right=True)  # C: past the last block
            used = cl < C
            cc = cl.clamp(max=C - 1)
            offset = (slot - (ends.gather(-1, cc) - nblk.gather(-1, cc))) * block_n
            row0 = self.starts.gather(-1, cc) + offset
            rows = (self.counts.gather(-1, cc) - offset).clamp(0, block_n) * used
            table = torch.stack([torch.where(used, cl, -1), row0 * used, rows], dim=-1)
            self._tables[block_n] = (table.contiguous(), P)
        return self._tables[block_n]


def cluster_order(assignments: torch.Tensor, clusters: int) -> ClusterOrder:
    """Sort every (batch, head)'s positions by cluster, padded (or out-of-range) last.

    Args:
        assignments: ``(B, H, N)`` int64 clusters, ``-1`` for padded positions.
        clusters: ``C``; assignments outside ``[0, C)`` are treated as padded.
    """
    B, H, N = assignments.shape
    key = torch.where((assignments >= 0) & (assignments < clusters), assignments, clusters)
    key = key.to(torch.int64).view(B * H, N)
    perm = torch.argsort(key, dim=-1, stable=True)
    counts = torch.zeros(B * H, clusters + 1, dtype=torch.int64, device=assignments.device)
    counts = counts.scatter_add_(1, key, torch.ones_like(key))[:, :clusters].contiguous()
    starts = counts.cumsum(-1) - counts
    return ClusterOrder(perm.view(B, H, N).contiguous(), counts, starts.contiguous())
