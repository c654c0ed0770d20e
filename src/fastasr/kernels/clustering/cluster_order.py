"""Each (batch, head)'s positions sorted by cluster, and blocks of one cluster each.

What the Triton clustered products (:mod:`fastasr.kernels.clustering.triton_clustered`) run on: one
stable ``argsort`` per attention call, shared by every product of the forward and the
backward pass, and a table of blocks built on the device without a host synchronisation,
by one Triton launch (:func:`block_table`; :func:`block_table_reference` is its PyTorch twin, for tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from fastasr.kernels.availability import prepare_interpreter
from fastasr.kernels.grid import next_power_of_2

prepare_interpreter()

__all__ = ["ClusterOrder", "block_slots", "block_table", "block_table_reference", "cluster_order"]

#: Block slots a program of ``_block_table_kernel`` fills at once, times ``next_pow2(C)``.
_TABLE_ELEMENTS = 4096


@triton.jit
def _block_table_kernel(counts_ptr, table_ptr, C, P, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                        BLOCK_P: tl.constexpr):
    """Rows ``[cluster, first sorted slot, rows]`` of the ``P`` block slots of one (batch, head).

    Cluster ``c`` owns ``cdiv(count_c, BLOCK_N)`` consecutive slots from the sum of the
    earlier clusters' slots; its members start at the sum of the earlier clusters' counts
    (padded positions sort last). A slot past the last cluster's is ``[-1, 0, 0]``."""
    bh = tl.program_id(0).to(tl.int64)
    offs_c = tl.arange(0, BLOCK_C)
    in_c = offs_c < C
    counts = tl.load(counts_ptr + bh * C + offs_c, mask=in_c, other=0).to(tl.int32)
    nblk = (counts + BLOCK_N - 1) // BLOCK_N
    ends = tl.cumsum(nblk, 0)  # one past each cluster's last slot
    firsts = ends - nblk
    starts = tl.cumsum(counts, 0) - counts
    ends = tl.where(in_c, ends, 2147483647)
    for p0 in range(0, P, BLOCK_P):
        slot = p0 + tl.arange(0, BLOCK_P)
        cluster = tl.sum((ends[None, :] <= slot[:, None]).to(tl.int32), 1)  # C: past the last block
        used = cluster < C
        mine = offs_c[None, :] == cluster[:, None]
        offset = (slot - tl.sum(tl.where(mine, firsts[None, :], 0), 1)) * BLOCK_N
        row0 = tl.sum(tl.where(mine, starts[None, :], 0), 1) + offset
        rows = tl.minimum(tl.maximum(tl.sum(tl.where(mine, counts[None, :], 0), 1) - offset, 0), BLOCK_N)
        out = table_ptr + (bh * P + slot) * 3
        inside = slot < P
        tl.store(out, tl.where(used, cluster, -1).to(tl.int64), mask=inside)
        tl.store(out + 1, tl.where(used, row0, 0).to(tl.int64), mask=inside)
        tl.store(out + 2, tl.where(used, rows, 0).to(tl.int64), mask=inside)


def table_tile(clusters: int) -> tuple[int, int]:
    """``_block_table_kernel``'s ``BLOCK_C`` (the clusters, a power of two) and ``BLOCK_P``."""
    block_c = max(16, next_power_of_2(clusters))
    return block_c, max(16, min(128, _TABLE_ELEMENTS // block_c))


def block_slots(N: int, clusters: int, block_n: int) -> int:
    """``P``, the block slots of a (batch, head): ``cdiv(N, block_n) + C``, an upper bound on
    ``sum_c cdiv(count_c, block_n)``."""
    return -(-N // block_n) + clusters


def block_table(counts: torch.Tensor, N: int, block_n: int) -> tuple[torch.Tensor, int]:
    """The block table of ``counts`` ``(B*H, C)`` valid members per cluster of sequences of
    ``N`` positions: ``(B*H, P, 3)`` int64 rows ``[cluster, first sorted slot, rows]`` and
    ``P`` (:func:`block_slots`), by one Triton launch."""
    BH, C = counts.shape
    P = block_slots(N, C, block_n)
    table = torch.empty((BH, P, 3), dtype=torch.int64, device=counts.device)
    if table.numel():
        block_c, block_p = table_tile(C)
        _block_table_kernel[(BH,)](counts, table, C, P, BLOCK_N=block_n, BLOCK_C=block_c, BLOCK_P=block_p)
    return table, P


def block_table_reference(counts: torch.Tensor, N: int, block_n: int) -> tuple[torch.Tensor, int]:
    """PyTorch twin of :func:`block_table`: the same rows and ``P``."""
    BH, C = counts.shape
    P = block_slots(N, C, block_n)
    nblk = (counts + block_n - 1) // block_n
    ends = nblk.cumsum(-1)
    starts = counts.cumsum(-1) - counts
    slot = torch.arange(P, device=counts.device).expand(BH, P).contiguous()
    cl = torch.searchsorted(ends, slot, right=True)  # C: past the last block
    used = cl < C
    cc = cl.clamp(max=C - 1)
    offset = (slot - (ends.gather(-1, cc) - nblk.gather(-1, cc))) * block_n
    row0 = starts.gather(-1, cc) + offset
    rows = (counts.gather(-1, cc) - offset).clamp(0, block_n) * used
    return torch.stack([torch.where(used, cl, -1), row0 * used, rows], dim=-1).contiguous(), P


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
    """

    perm: torch.Tensor
    counts: torch.Tensor
    _tables: dict = field(default_factory=dict)

    def blocks(self, block_n: int) -> tuple[torch.Tensor, int]:
        """``(B*H, P, 3)`` int64 rows ``[cluster, first sorted slot, rows]`` and ``P``
        (:func:`block_table`: one Triton launch per ``block_n``, kept for the next product)."""
        if block_n not in self._tables:
            self._tables[block_n] = block_table(self.counts, self.perm.shape[-1], block_n)
        return self._tables[block_n]


def cluster_order(assignments: torch.Tensor, clusters: int, counts: torch.Tensor | None = None) -> ClusterOrder:
    """Sort every (batch, head)'s positions by cluster, padded (or out-of-range) last.

    Args:
        assignments: ``(B, H, N)`` int64 clusters, ``-1`` for padded positions.
        clusters: ``C``; assignments outside ``[0, C)`` are treated as padded.
        counts: ``(B, H, C)`` members per cluster when the caller has them (K-means returns
            them); they must be the counts of ``assignments``. None: counted here.
    """
    B, H, N = assignments.shape
    key = assignments.to(torch.int64).clamp(-1, clusters).remainder(clusters + 1)  # padded: C
    key = key.view(B * H, N)
    perm = torch.argsort(key, dim=-1, stable=True)
    if counts is None:
        counts = torch.zeros(B * H, clusters + 1, dtype=torch.int64, device=assignments.device)
        counts = counts.scatter_add_(1, key, torch.ones_like(key))[:, :clusters]
    counts = counts.reshape(B * H, clusters).to(torch.int64).contiguous()
    return ClusterOrder(perm.view(B, H, N).contiguous(), counts)
