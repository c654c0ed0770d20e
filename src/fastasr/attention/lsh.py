"""Reformer LSH attention (Kitaev, Kaiser, Levskaya 2020).

Queries and keys are shared (``q`` and ``k`` must be one tensor). In each of
``rounds`` hashing rounds:

1. every valid position is hashed by a random rotation ``R`` (``E x buckets/2``)
   to ``argmax([x R, -x R])``; padded positions go to an extra last bucket;
2. positions are sorted by ``(bucket, position)`` and cut into chunks of
   ``chunk``; each chunk attends to itself and to the chunk before it (the
   first chunk only to itself: no wrap-around, so a sequence's result does not
   depend on how much padding follows it);
3. keys are the unit-normalised queries, scores ``q_i . k_j / sqrt(E)``; a
   position does not attend to itself unless nothing else in its window is
   valid; padded keys get zero weight.

The rounds are combined by their log-sum-exp: round ``r`` contributes with
weight ``exp(lse_r(i) - logsumexp_r lse_r(i))``. With several rounds a key can sit in
a query's window in more than one of them; Reformer's duplicate correction counts it
once: the score of pair ``(i, j)`` is lowered by ``log n_ij``, the number of rounds
whose windows pair ``i`` with ``j``. The combination is then exactly the softmax over
the *union* of the keys the rounds found (tested against that union softmax).
Cost O(rounds N chunk E + rounds^2 N chunk).

Padded keys have -1e9 and the position itself -1e5 added to their scores
(finite, not -inf, so a window with nothing valid stays finite): the self score
loses to any valid key, whose weight then underflows to exactly 0. Rounds run
one after another, which keeps each round's ``(N, 2 chunk)`` scores in cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fastasr.attention.base import InnerAttention, compute_dtype
from fastasr.attention.masking import valid_positions, zero_padded_queries
from fastasr.attention.registry import register
from fastasr.attention.spec import Param

__all__ = ["LSHAttention"]

_PAD_SCORE = -1e9
_SELF_SCORE = -1e5


@register
class LSHAttention(InnerAttention):
    """Shared-QK attention within LSH buckets, over ``rounds`` hashing rounds.

    ``LSHAttention(1)(x, x, v, lengths)``: ``x`` ``(B, H, N, E)`` (one tensor as both
    queries and keys), ``v`` ``(B, H, N, Ev)``, ``lengths`` ``(B,)`` or None ->
    ``(B, H, N, Ev)``.

    Args:
        rounds: hashing rounds, combined by log-sum-exp; a key found by several
            rounds counts once (paper: 1 or 4).
        chunk: positions per chunk after sorting by bucket; a chunk also sees the
            previous one.
        buckets: hash buckets per round, even (Reformer: about ``N / chunk``).
        seed: seed of the random rotations, redrawn identically at every call; None:
            torch's global RNG (new rotations every call).

    Raises:
        ValueError: a parameter out of range, naming it and what is expected.
    """

    name = "lsh"
    number_param = "rounds"
    params = (
        Param("rounds", low=1, doc="hashing rounds, combined by log-sum-exp (duplicates once)"),
        Param("chunk", low=1, doc="positions per chunk; a chunk also sees the previous one"),
        Param("buckets", low=2, even=True, doc="hash buckets per round (Reformer: ~N / chunk)"),
        Param("seed", low=0, optional=True, doc="seed of the random rotations (None: global RNG)"),
    )
    requires_shared_qk = True

    def __init__(
        self, rounds: int = 1, *, chunk: int = 32, buckets: int = 32, seed: int | None = None
    ) -> None:
        super().__init__()
        self._set_hparams(rounds=rounds, chunk=chunk, buckets=buckets, seed=seed)

    def _order(self, x: torch.Tensor, valid: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
        """One round's hash and sort: ``(B, H, Np)`` sorted slot -> original position.

        Every valid position goes to bucket ``argmax([x R, -x R])``; padding sorts last.
        """
        Np = x.shape[2]
        proj = torch.matmul(x.detach(), rotation)  # (B,H,Np,nb/2)
        buckets = torch.cat([proj, -proj], dim=-1).argmax(-1)
        buckets = buckets.masked_fill(~valid[:, None, :], self.buckets)
        return (buckets * Np + torch.arange(Np, device=x.device)).argsort(dim=-1)

    def _duplicates(self, order: torch.Tensor, chunks: list[torch.Tensor]) -> torch.Tensor:
        """``(B, H, nc, c, W)``: in how many rounds each (query, window key) pair of this
        round's windows shares a window (>= 1; ``chunks[r]`` is each original position's
        chunk in round ``r``, ``(B, H, Np)``)."""
        B, H, Np = order.shape
        c = self.chunk
        nc = Np // c
        pos = torch.arange(Np, device=order.device).view(1, 1, Np, 1).expand(B, H, Np, 1)
        k_pos = self._windows(pos, order)[..., 0]  # (B,H,nc,W)
        q_pos = order.view(B, H, nc, c)
        count = torch.zeros(*q_pos.shape, k_pos.shape[-1], dtype=torch.int64, device=order.device)
        for chunk_of in chunks:
            cq = chunk_of.gather(2, q_pos.reshape(B, H, Np)).view(B, H, nc, c, 1)
            ck = chunk_of.gather(2, k_pos.reshape(B, H, -1)).view(B, H, nc, 1, -1)
            count += (ck == cq) | (ck == cq - 1)  # own chunk, or the one before it
        return count.clamp(min=1)

    def _round(self, x: torch.Tensor, valid: torch.Tensor, order: torch.Tensor,
               chunks: list[torch.Tensor] | None):
        """One hashing round: attend within own + previous chunk of the sorted order.

        Args:
            x: ``(B, H, Np, E)`` shared queries/keys (compute dtype), ``Np`` a
                multiple of ``chunk``; valid: ``(B, Np)`` bool; order: this round's
                :meth:`_order`; chunks: every round's chunk of each position (several
                rounds: duplicates are divided out and the log-sum-exp returned), or None.

        Returns:
            ``weights (B,H,nc,c,W)`` the softmax of each sorted query over its window of
            ``W`` keys (own chunk first, then the previous one), ``lse (B,H,nc,c)`` or None.
        """
        B, H, Np, E = x.shape
        c = self.chunk
        nc = Np // c
        xs = x.gather(2, order[..., None].expand(B, H, Np, E)).view(B, H, nc, c, E)
        ok = valid[:, None, :].expand(B, H, Np).gather(2, order).view(B, H, nc, c)
        keys = F.normalize(xs, dim=-1)
        if nc > 1:
            keys = torch.cat([keys, keys.roll(1, dims=2)], dim=3)  # own chunk, then previous
            prev_ok = ok.roll(1, dims=2)
            prev_ok[:, :, 0] = False  # the first chunk has no previous chunk
            ok = torch.cat([ok, prev_ok], dim=3)
        scores = torch.matmul(xs * self.scale(E), keys.transpose(-1, -2))  # (B,H,nc,c,W)
        scores = scores + torch.where(ok, 0.0, _PAD_SCORE)[..., None, :].to(scores.dtype)
        # Key t of the own chunk is query t itself: push the diagonal down.
        scores[..., :c].diagonal(dim1=-2, dim2=-1).add_(_SELF_SCORE)
        if chunks is None:
            return scores.softmax(-1), None
        scores = scores - self._duplicates(order, chunks).to(scores.dtype).log()
        return scores.softmax(-1), scores.logsumexp(-1)

    def _windows(self, t: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """``(B,H,Np,D)`` -> sorted by ``order`` and cut into windows ``(B,H,nc,W,D)``."""
        B, H, Np, D = t.shape
        c = self.chunk
        ts = t.gather(2, order[..., None].expand(B, H, Np, D)).view(B, H, Np // c, c, D)
        return torch.cat([ts, ts.roll(1, dims=2)], dim=3) if Np > c else ts

    def _prepare(self, x: torch.Tensor, lengths: torch.Tensor | None):
        """Pad to whole chunks; draw the rotations of every round."""
        B, H, N, E = x.shape
        Np = max(1, -(-N // self.chunk)) * self.chunk
        valid = valid_positions(lengths, B, N, x.device)
        if Np > N:
            x = F.pad(x, (0, 0, 0, Np - N))
            valid = F.pad(valid, (0, Np - N), value=False)
        rotations = self._randn(self.rounds, E, self.buckets // 2, device=x.device).to(x.dtype)
        return x, valid, rotations

    def _rounds(self, x: torch.Tensor, valid: torch.Tensor, rotations: torch.Tensor):
        """Every round's order, and (several rounds) each position's chunk in every round."""
        orders = [self._order(x, valid, rotation) for rotation in rotations]
        if len(orders) == 1:
            return orders, None
        return orders, [order.argsort(dim=-1) // self.chunk for order in orders]

    def _forward(self, q, k, v, lengths):
        B, H, N, E = q.shape
        Ev = v.shape[-1]
        dt = compute_dtype(q.dtype)
        x, valid, rotations = self._prepare(q.to(dt), lengths)
        Np = x.shape[2]
        vv = F.pad(v.to(dt), (0, 0, 0, Np - N))
        orders, chunks = self._rounds(x, valid, rotations)
        outs, lses = [], []
        for order in orders:
            weights, lse = self._round(x, valid, order, chunks)
            inverse = order.argsort(dim=-1)
            out = torch.matmul(weights, self._windows(vv, order)).view(B, H, Np, Ev)
            outs.append(out.gather(2, inverse[..., None].expand(B, H, Np, Ev)))
            if lse is not None:
                lses.append(lse.view(B, H, Np).gather(2, inverse))
        if self.rounds == 1:
            out = outs[0]
        else:
            # softmax over the last axis: its result for a row does not depend on
            # the batch around it (a softmax over axis 0 vectorises across rows)
            round_w = torch.stack(lses, dim=-1).softmax(dim=-1)  # (B,H,Np,R)
            out = sum(round_w[..., r, None] * o for r, o in enumerate(outs))
        return zero_padded_queries(out[:, :, :N], lengths).to(v.dtype)

    def _dense_weights(self, q, k, lengths):
        B, H, N, E = q.shape
        dt = compute_dtype(q.dtype)
        x, valid, rotations = self._prepare(q.to(dt), lengths)
        Np = x.shape[2]
        orders, chunks = self._rounds(x, valid, rotations)
        per_round, lses = [], []
        for order in orders:
            weights, lse = self._round(x, valid, order, chunks)
            pos = torch.arange(Np, device=x.device).view(1, 1, Np, 1).expand(B, H, Np, 1)
            q_pos = order.view(*weights.shape[:-1])  # (B,H,nc,c)
            k_pos = self._windows(pos, order)[..., 0]  # (B,H,nc,W)
            dense = weights.new_zeros(B, H, Np, Np)
            rows = q_pos[..., None].expand(weights.shape)
            dense.view(B, H, -1).scatter_add_(
                2, (rows * Np + k_pos[..., None, :]).reshape(B, H, -1), weights.reshape(B, H, -1)
            )
            per_round.append(dense)
            if lse is not None:
                lses.append(lse.view(B, H, Np).gather(2, order.argsort(dim=-1)))
        if len(per_round) == 1:
            dense = per_round[0]
        else:
            round_w = torch.stack(lses, dim=-1).softmax(dim=-1)  # (B,H,Np,R) by original position
            dense = sum(round_w[..., r, None] * d for r, d in enumerate(per_round))
        return zero_padded_queries(dense[:, :, :N, :N], lengths)
