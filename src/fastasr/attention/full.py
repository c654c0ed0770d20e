"""Full softmax attention through the fastest exact kernel for each padded batch.

The baseline must be the fast one. A padded batch ``(B, H, N, E)`` with ``lengths`` takes one
of four exact paths (:func:`padded_path` chooses; every one gives the same numbers within
rounding, padded queries output 0):

* ``mask``: SDPA with a boolean key-padding mask. On a CPU the fused flash kernel takes the
  mask; on a GPU the memory-efficient kernel does. No host synchronisation.
* ``varlen``: FlashAttention's variable-length kernel (``torch.nn.attention.varlen``) on the
  padded layout itself, **without packing**: each utterance's valid positions are one
  sequence and its padding is another (``cu_seq = 0, L0, N, N+L1, 2N, ...``), so valid queries
  see exactly their valid keys, padding sees only padding (then zeroed), and the sequence
  offsets come from ``lengths`` on the device: no host synchronisation, no gather, no
  scatter. CUDA, fp16/bf16, equal head sizes of at most 256 (flash's own limits).
* ``packed``: the valid positions gathered into jagged nested tensors (``torch.nested``), SDPA
  on them, scattered back. It needs the number of valid positions on the host (one
  synchronisation per *lengths tensor*: the packing is cached on it, so the layers of one
  forward pass share it), and pays off only where the padding it skips outweighs its
  copies: very long sequences in fp32 on a GPU.
* ``dense``: SDPA without a mask on the padded batch itself (on a GPU the kernel of an
  unpadded batch: cuDNN's or FlashAttention's dense one, which the variable-length kernel
  trails by 1.2-2.3x at N = 800), the padding kept out by :data:`DENSE_COLUMNS` feature
  columns appended to every head: ``+DENSE_PUSH`` on every query, ``-DENSE_PUSH`` on a padded
  key, 0 on a valid one. A valid key's logit is unchanged (its extra products are exactly 0);
  a padded key's falls by ``DENSE_COLUMNS * DENSE_PUSH**2 * scale`` (92,682 for heads of 32),
  so its weight is exactly 0 in float32 while every logit's magnitude stays below a third of
  that fall (30,894 for heads of 32). Heads grow by 8 features (32 -> 40); no host
  synchronisation, no gather.

The choice, per device, dtype and N, is the fastest path of ``make gpu-check``'s full-attention
table (``benchmarks/attention/full_paths.py``; the numbers behind each threshold are in
benchmarks/gpu/notes.md "Decisions"): on a CPU ``mask``. On a GPU in half precision ``mask``
below ``dense_from`` positions (2,048), ``dense`` from there below ``varlen_from`` (32,768),
``varlen`` from there; ``dense`` where varlen cannot run. In float32 ``mask`` below
``pack_from`` positions (8,192) and ``packed`` from there.

On a CPU, half-precision inputs shorter than :data:`CPU_HALF_IN_FLOAT32_BELOW` positions attend
in float32 (cast in, the output cast back): torch's CPU flash kernel is slower in bfloat16 than
in float32 there (forward + backward, 4,000 tokens: 3.1× at N = 80, 1.2× at N = 325; from
N = 1,024 bfloat16 is the faster: benchmarks/gpu/notes.md "Answered questions", docs/BENCHMARKS.md
"Full attention on a CPU").
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from fastasr.attention.base import InnerAttention, compute_dtype
from fastasr.attention.masking import key_mask, valid_positions, zero_padded_queries
from fastasr.attention.registry import register
from fastasr.attention.spec import Param
from fastasr.kernels.clustering.varlen import as_rows, padded_offsets, varlen_attn, varlen_available

__all__ = ["FullAttention", "masked_attention", "packed_attention", "varlen_attention", "dense_attention",
           "padded_path", "forced_padded_path", "attends_in_float32", "PADDED_PATHS", "DEFAULT_PACK_FROM",
           "DEFAULT_DENSE_FROM", "DEFAULT_VARLEN_FROM", "CPU_HALF_IN_FLOAT32_BELOW", "DENSE_COLUMNS", "DENSE_PUSH"]

#: The exact paths of a padded batch, by name (:func:`padded_path` picks one).
PADDED_PATHS = ("mask", "varlen", "packed", "dense")
#: Feature columns :func:`dense_attention` appends to every head (flash kernels take head sizes
#: in multiples of 8), and their magnitude (exact in fp16 and bf16; a product of two is 65,536).
DENSE_COLUMNS, DENSE_PUSH = 8, 256.0
#: N from which an fp32 padded batch on a GPU is packed (module docstring).
DEFAULT_PACK_FROM = 8192
#: N from which a half-precision padded batch on a GPU takes ``dense`` instead of ``mask``, and
#: from which it takes ``varlen`` instead of ``dense`` (module docstring).
DEFAULT_DENSE_FROM, DEFAULT_VARLEN_FROM = 2048, 32768
#: N below which half-precision inputs on a CPU attend in float32 (module docstring; measured by
#: benchmarks/gpu/notes.md "Answered questions", docs/BENCHMARKS.md "Full attention on a CPU").
CPU_HALF_IN_FLOAT32_BELOW = 1024


class _Packing:
    """Where the valid positions of a padded ``(B, N)`` batch go in a packed one.

    Attributes:
        index: ``(T,)`` int64 rows of the flattened ``(B*N)`` positions that are valid.
        offsets: ``(B + 1,)`` int64 start of each sequence among the ``T`` packed rows.
        max_len, min_len: longest and shortest length (host ints).
    """

    _cache: tuple[weakref.ref, tuple, _Packing] | None = None

    def __init__(self, lengths: torch.Tensor, n: int, device: torch.device) -> None:
        B = lengths.shape[0]
        lengths = lengths.to(device)
        valid = valid_positions(lengths, B, n, device)
        self.index = valid.reshape(-1).nonzero().squeeze(1)  # the one host synchronisation
        self.offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        host = lengths.tolist()
        self.max_len, self.min_len = max(host), min(host)

    @classmethod
    def of(cls, lengths: torch.Tensor, n: int, device: torch.device) -> _Packing:
        """The packing of ``lengths`` for ``n`` positions, reused while it is the same tensor."""
        # an inference tensor (decoding under torch.inference_mode) keeps no version counter;
        # nothing rewrites a batch's lengths in place between the layers of one forward pass
        version = None if lengths.is_inference() else lengths._version
        key = (version, n, device)
        hit = cls._cache
        if hit is not None and hit[0]() is lengths and hit[1] == key:
            return hit[2]
        packing = cls(lengths, n, device)
        cls._cache = (weakref.ref(lengths), key, packing)
        return packing


def packed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """SDPA over the valid positions only (no mask): ``(B, H, N, E)`` -> ``(B, H, N, Ev)``.

    The batch is packed into jagged nested tensors, so SDPA can pick its fastest kernel
    (FlashAttention on a GPU); padded query rows of the result are 0. Differentiable.
    """
    B, H, N, _ = q.shape
    Ev = v.shape[-1]
    packing = _Packing.of(lengths, N, q.device)

    def pack(x: torch.Tensor) -> torch.Tensor:
        rows = x.transpose(1, 2).reshape(B * N, H, x.shape[-1]).index_select(0, packing.index)
        nested = torch.nested.nested_tensor_from_jagged(
            rows, packing.offsets, min_seqlen=packing.min_len, max_seqlen=packing.max_len
        )
        return nested.transpose(1, 2)  # (B, H, jagged N, E)

    out = F.scaled_dot_product_attention(pack(q), pack(k), pack(v)).transpose(1, 2).values()
    padded = out.new_zeros(B * N, H, Ev).index_copy(0, packing.index, out)
    return padded.view(B, N, H, Ev).transpose(1, 2)


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """SDPA with a boolean key-padding mask: ``(B, H, N, E)`` -> ``(B, H, N, Ev)``, padded
    query rows 0. No host synchronisation. Differentiable."""
    B, _, N, _ = q.shape
    mask = key_mask(lengths, B, N, q.device)[:, None, None, :]  # (B,1,1,N) True = attend
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return zero_padded_queries(out, lengths)


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """SDPA without a mask on the padded batch, padded keys pushed out by appended feature
    columns (module docstring, ``dense``): ``(B, H, N, E)`` -> ``(B, H, N, Ev)``, padded query
    rows 0. The softmax scale stays ``E ** -0.5``. Differentiable; no host synchronisation."""
    B, H, N, E = q.shape
    Ev = v.shape[-1]
    width = -(-max(E + DENSE_COLUMNS, Ev) // 8) * 8  # one head size for q, k and v, as flash takes
    padded_key = ~key_mask(lengths, B, N, q.device)  # (B, N) True = padding
    push = q.new_full((B, H, N, DENSE_COLUMNS), DENSE_PUSH)
    pushed = (padded_key.to(k.dtype) * -DENSE_PUSH)[:, None, :, None].expand(B, H, N, DENSE_COLUMNS)
    qq = F.pad(torch.cat([q, push], -1), (0, width - E - DENSE_COLUMNS))
    kk = F.pad(torch.cat([k, pushed], -1), (0, width - E - DENSE_COLUMNS))
    out = F.scaled_dot_product_attention(qq, kk, F.pad(v, (0, width - Ev)), scale=E ** -0.5)
    return zero_padded_queries(out[..., :Ev], lengths)


def varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """FlashAttention's variable-length kernel on the padded layout: ``(B, H, N, E)`` ->
    ``(B, H, N, E)``, padded query rows 0. Differentiable; no host synchronisation.

    Utterance ``b``'s valid positions ``[bN, bN + L_b)`` form one sequence and its padding
    ``[bN + L_b, (b+1)N)`` another, so no row is gathered or scattered (module docstring).
    Needs ``fastasr.kernels.clustering.varlen.varlen_available``.
    """
    B, H, N, E = q.shape
    lengths = lengths.to(device=q.device, dtype=torch.int32)
    cu_seq = padded_offsets(lengths, N)
    out = varlen_attn(as_rows(q), as_rows(k), as_rows(v), cu_seq, cu_seq, N, N)
    return zero_padded_queries(out.view(B, N, H, E).transpose(1, 2), lengths)


_forced_path: str | None = None


@contextlib.contextmanager
def forced_padded_path(path: str) -> Iterator[None]:
    """Within the block, :class:`FullAttention` takes ``path`` (one of :data:`PADDED_PATHS`) for
    every padded batch: how the benchmarks time each path inside a whole model."""
    global _forced_path
    if path not in PADDED_PATHS:
        raise ValueError(f"padded path {path!r}; expected one of {PADDED_PATHS}")
    saved, _forced_path = _forced_path, path
    try:
        yield
    finally:
        _forced_path = saved


def padded_path(q: torch.Tensor, v: torch.Tensor, pack_from: int | None = DEFAULT_PACK_FROM,
                dense_from: int | None = DEFAULT_DENSE_FROM, varlen_from: int | None = DEFAULT_VARLEN_FROM) -> str:
    """The exact path :class:`FullAttention` takes for a padded batch of ``N = q.shape[2]``
    positions (module docstring): ``"mask"`` on a CPU. On a GPU in half precision ``"mask"``
    below ``dense_from`` (None: never dense), ``"dense"`` below ``varlen_from`` (None: never
    varlen) or where :func:`varlen_available` is false, ``"varlen"`` from there; in float32
    ``"packed"`` from ``pack_from`` (None: never) and ``"mask"`` below."""
    if _forced_path is not None:
        return _forced_path
    if q.device.type != "cuda":
        return "mask"
    n = q.shape[2]
    if q.dtype in (torch.float16, torch.bfloat16):
        if dense_from is None or n < dense_from:
            return "mask"
        if varlen_from is not None and n >= varlen_from and varlen_available(q, v):
            return "varlen"
        return "dense"
    if pack_from is not None and n >= pack_from:
        return "packed"
    return "mask"


def attends_in_float32(q: torch.Tensor) -> bool:
    """Whether :class:`FullAttention` casts half-precision ``q, k, v`` to float32: on a CPU,
    below :data:`CPU_HALF_IN_FLOAT32_BELOW` positions (module docstring)."""
    return (q.device.type == "cpu" and q.dtype in (torch.float16, torch.bfloat16)
            and q.shape[2] < CPU_HALF_IN_FLOAT32_BELOW)


_PATH_FUNCTIONS = {"mask": masked_attention, "varlen": varlen_attention, "packed": packed_attention,
                   "dense": dense_attention}


@register
class FullAttention(InnerAttention):
    """``softmax(Q K^T / sqrt(E)) V`` over the valid keys. O(N^2). No parameters.

    ``FullAttention()(q, k, v, lengths)``: ``q, k`` ``(B, H, N, E)``, ``v``
    ``(B, H, N, Ev)``, ``lengths`` ``(B,)`` or None -> ``(B, H, N, Ev)``.
    """

    name = "full"
    length_cost = "quadratic"
    params = (Param("pack_from", low=1, optional=True,
                    doc="GPU, fp32: N from which a padded batch is packed (None: never)"),
              Param("dense_from", low=1, optional=True,
                    doc="GPU, fp16/bf16: N from which a padded batch takes the dense path, not the key mask (None: never)"),
              Param("varlen_from", low=1, optional=True,
                    doc="GPU, fp16/bf16: N from which a padded batch takes FlashAttention's varlen kernel (None: never)"))

    def __init__(self, pack_from: int | None = DEFAULT_PACK_FROM, dense_from: int | None = DEFAULT_DENSE_FROM,
                 varlen_from: int | None = DEFAULT_VARLEN_FROM) -> None:
        super().__init__()
        self._set_hparams(pack_from=pack_from, dense_from=dense_from, varlen_from=varlen_from)

    def _forward(self, q, k, v, lengths):
        dtype = q.dtype
        if attends_in_float32(q):
            q, k, v = q.float(), k.float(), v.float()
        if lengths is None:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            path = padded_path(q, v, self.hparams["pack_from"], self.hparams["dense_from"], self.hparams["varlen_from"])
            out = _PATH_FUNCTIONS[path](q, k, v, lengths)
        return out.to(dtype)

    def _dense_weights(self, q, k, lengths):
        B, _, N, E = q.shape
        dt = compute_dtype(q.dtype)
        scores = torch.matmul(q.to(dt), k.to(dt).transpose(-1, -2)) * self.scale(E)
        mask = key_mask(lengths, B, N, q.device)[:, None, None, :]
        weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        return zero_padded_queries(weights, lengths)
