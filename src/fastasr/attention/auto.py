"""Exact attention below a crossover length, improved clustered attention above it.

On short sequences full attention (torch's fused SDPA) is both exact and the fastest; on
long ones improved clustered attention is faster by a growing factor. ``auto`` picks
per call by the call's (padded) length ``N``: i-clustered when ``N >= crossover``
(calls under autograd: training) or ``N >= crossover_no_grad`` (calls without it:
decoding, whose crossover is higher: the backward is what full attention pays most
for). The crossovers are a property of the machine: ``python -m
fastasr.cli.calibrate`` (``make calibrate-auto``) measures them and writes them
into ``conf/attention/auto.yaml``. The choice needs no host synchronisation: ``N`` is a
shape. The paper's code has the same idea as a fixed-length "conditional full" switch.
"""

from __future__ import annotations

import torch

from fastasr.attention.base import InnerAttention
from fastasr.attention.full import FullAttention
from fastasr.attention.improved_clustered import ImprovedClusteredAttention
from fastasr.attention.registry import register
from fastasr.attention.spec import Param

__all__ = ["AutoAttention"]


#: i-clustered's defaults, read from its constructor (their one home).
_CLUSTERED = ImprovedClusteredAttention.defaults()


@register
class AutoAttention(InnerAttention):
    """``full`` for calls shorter than the crossover, ``i-clustered`` from it on.

    ``AutoAttention(1024)(q, k, v, lengths)``: ``q, k`` ``(B, H, N, E)``, ``v``
    ``(B, H, N, Ev)``, ``lengths`` ``(B,)`` or None -> ``(B, H, N, Ev)``.

    Args:
        crossover: ``N`` from which calls under autograd (training) use i-clustered.
        crossover_no_grad: ``N`` from which calls without autograd (decoding) do.
        clusters, bits, iterations, seed, topk: the i-clustered part, as
            :class:`ImprovedClusteredAttention` (same defaults).

    Raises:
        ValueError: a parameter out of range, naming it and what is expected.
    """

    name = "auto"
    number_param = "crossover"
    params = (
        Param("crossover", low=1, doc="N from which calls under autograd use i-clustered"),
        Param("crossover_no_grad", low=1, doc="N from which calls without autograd do"),
    ) + ImprovedClusteredAttention.params
    # Quadratic only below the crossover, a bounded length: priced as linear.
    length_cost = "linear"

    def __init__(
        self,
        crossover: int = 1024,
        *,
        crossover_no_grad: int = 1024,
        clusters: int = _CLUSTERED["clusters"],
        bits: int = _CLUSTERED["bits"],
        iterations: int = _CLUSTERED["iterations"],
        seed: int | None = _CLUSTERED["seed"],
        topk: int = _CLUSTERED["topk"],
    ) -> None:
        super().__init__()
        self._set_hparams(
            crossover=crossover,
            crossover_no_grad=crossover_no_grad,
            clusters=clusters,
            bits=bits,
            iterations=iterations,
            seed=seed,
            topk=topk,
        )
        self.exact = FullAttention()
        clustered = {p.name: self.hparams[p.name] for p in ImprovedClusteredAttention.params}
        self.approximate = ImprovedClusteredAttention(**clustered)

    def choose(self, n: int) -> InnerAttention:
        """The variant a call of length ``n`` runs (depends on whether autograd is on)."""
        crossover = self.crossover if torch.is_grad_enabled() else self.crossover_no_grad
        return self.approximate if n >= crossover else self.exact

    def _forward(self, q, k, v, lengths):
        return self.choose(q.shape[2])._forward(q, k, v, lengths)

    def _dense_weights(self, q, k, lengths):
        # dense_weights runs without autograd: the variant a decoding call would use
        return self.choose(q.shape[2])._dense_weights(q, k, lengths)
