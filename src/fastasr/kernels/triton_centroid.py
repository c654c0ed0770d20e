"""Triton kernels: the centroid attention of improved clustered attention, forward and backward.

``centroid_attention(centroids, k, v, lengths, scale, topk)`` is the Triton twin of
``fastasr.kernels.reference.centroid_attention`` (same arguments, same results, differentiable
in ``centroids``, ``k`` and ``v``) for fp32/fp16/bf16 keys and values. Every centroid attends to
every valid key of its sequence; what is returned is its output ``values = softmax(l) v``, and
its ``topk`` largest logits ``l`` as key positions ``top_idx`` with their weights ``top_w``.
With ``topk = 0`` (clustered attention's call) it is split-key attention of the centroids alone:
no logits are written, and a sequence's keys are spread over ``cdiv(N, SPLIT_KEYS)`` programs
where a fused attention call has one program a (batch, head) and 128 centroids.

Design, the way flash attention computes a softmax without holding it: one program takes one
(batch, head) and :data:`SPLIT_KEYS` of its keys, holds every centroid of the sequence in one
tile (``C <=`` :func:`max_centroids`) and walks its keys in blocks:

* forward, ``_centroid_fwd_kernel``: a block's logits are one tensor-core product, written once
  to a ``(B, H, C, N)`` float32 buffer for the top-k (when ``topk > 0``); a running maximum and sum (online softmax)
  weigh the block's values into the program's partial output. ``_centroid_combine_kernel``
  merges the partial outputs of a sequence's key spans into ``values`` and each centroid's
  log-sum-exp; ``triton_topk.topk_softmax`` reads the logits once and writes the top keys and
  their weights ``exp(l - lse)``. Three launches (two without top keys); no softmax, weight or
  gathered tensor of size ``C × N`` besides the logits.
* backward, ``_centroid_bwd_kernel``: recomputes each block's logits and weights from the
  log-sum-exp, forms ``dP = dvalues v^T`` plus the top weights' gradients at their keys and
  ``ds = P (dP - D)`` with ``D = dvalues · values + Σ top_w dtop_w`` (the softmax's row term),
  and writes the block's ``dk`` and ``dv`` (each key belongs to one program; in i-clustered's
  one op, :mod:`fastasr.kernels.triton_improved`, with the sparse part's float32 sums added) and adds its
  ``dcentroids`` with one atomic per centroid and feature. One launch. The top weights'
  gradients reach their keys by compares over each block's ``C × BLOCK_N`` tile, one a top key:
  a row's top keys come from the Triton top-k in increasing position, so a block's are the next
  few of each row and the compares run as often as the most any row has in the block (4.6 on
  average at N = 800 and 2.1 at 4,096 for K = 32 on Gaussian logits, K at most), where keys in
  another order (``torch.topk``'s, rows longer than ``triton_topk.MAX_N``) take K compares a
  block.

Products take the keys' dtype (fp16/bf16 on the tensor cores, fp32 in full precision) with
fp32 accumulation; logits, softmax and its statistics are fp32, as in the reference. Keys and
values are read through their strides, ``dk`` and ``dv`` written in their layout
(:mod:`fastasr.kernels.rows`): a head-split view of projections is not copied. ``dcentroids``
is summed with atomics over key spans, so it is reproducible to rounding, not bit for bit.
Top keys of rows longer than ``triton_topk.MAX_N``, which the Triton top-k cannot hold, are
chosen by ``torch.topk`` on the logits these kernels write and their weights gathered (18-22 %
faster than the reference's products there, benchmarks/gpu/notes.md "Decisions"). More
centroids than :func:`max_centroids` are not served here (:func:`applies`);
``fastasr.kernels.ops`` sends them to the reference.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from fastasr.kernels import reference
from fastasr.kernels.availability import (
    kernels_interpreted,
    prepare_interpreter,
    require_triton,
)
from fastasr.kernels.grid import cdiv, next_power_of_2
from fastasr.kernels.rows import heads_inner, new_rows, unit_stride
from fastasr.kernels.triton_clustered import dot_config
from fastasr.kernels.triton_topk import MAX_N, topk_softmax

prepare_interpreter()

__all__ = ["centroid_attention", "centroid_forward", "centroid_backward", "CentroidState", "checked_lengths",
           "applies", "max_centroids", "centroid_tiles", "MAX_CENTROIDS", "SPLIT_KEYS", "SHORT_BACKWARD_BELOW"]

#: Most centroids a sequence may have: all of them are one tile of a program.
MAX_CENTROIDS = 256
#: Keys a program covers, forward and backward (a multiple of every key block).
SPLIT_KEYS = 512
#: Rows of fewer keys take the half-precision backward of 65-128 centroids on heads of up to 32
#: in 4 warps, not 8 (32 keys a block either way): the centroid attention alone in 0.76 / 0.63 of
#: 8 warps' time at N = 800 / 1,024 on the H200, 1.03 / 0.95 at 3,200 / 4,096, 1.25 at 16,384
#: (c72e613, clustering_nvidia-h200.md "backward 32 keys × 4 warps").
SHORT_BACKWARD_BELOW = 2048
#: The float32 logits' rows (C a sequence, N keys each) lie this many floats apart at least:
#: ``N`` rounded up, so that every row starts 64-byte aligned whatever a batch's padded length
#: (a training batch's N is its longest utterance's). Aligned, the forward stores them in vectors
#: and the top-k loads them so: on sm_90 (C = 100, bf16) the forward's key block is 679
#: instructions against 840 with rows N apart, the top-k's store chunk 228 against 240 (rows of
#: up to 1,024 keys) and 280 against 356 (4,096).
LOGITS_ROW_ALIGN = 16
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _key_block(k_seq, v_seq, s_kn, s_vn, n0, N, E, EV, DOT_DTYPE: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_V: tl.constexpr):
    """Positions ``n0 ..`` of a block, which of them exist, and their key and value rows (a
    sequence's first key and value row at ``k_seq``, ``v_seq``, rows ``s_kn``, ``s_vn`` apart)."""
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_e = tl.arange(0, BLOCK_E)
    offs_v = tl.arange(0, BLOCK_V)
    in_n = cols < N
    keys = tl.load(k_seq + cols[:, None] * s_kn + offs_e[None, :],
                   mask=in_n[:, None] & (offs_e[None, :] < E), other=0.0).to(DOT_DTYPE)
    vals = tl.load(v_seq + cols[:, None] * s_vn + offs_v[None, :],
                   mask=in_n[:, None] & (offs_v[None, :] < EV), other=0.0).to(DOT_DTYPE)
    return cols, in_n, keys, vals


@triton.jit
def _centroid_tile(c_ptr, bh, C, E, DOT_DTYPE: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_E: tl.constexpr):
    """Every centroid of sequence ``bh`` as one (BLOCK_C, BLOCK_E) tile in the dot dtype, its
    rows' indices ``bh * C + c`` and which of them exist."""
    offs_c = tl.arange(0, BLOCK_C)
    offs_e = tl.arange(0, BLOCK_E)
    c_ok = offs_c < C
    crow = bh * C + offs_c
    cent = tl.load(c_ptr + crow[:, None] * E + offs_e[None, :],
                   mask=c_ok[:, None] & (offs_e[None, :] < E), other=0.0).to(DOT_DTYPE)
    return cent, crow, c_ok


@triton.jit
def _centroid_fwd_kernel(
    c_ptr, k_ptr, v_ptr, len_ptr, logits_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
    H, C, N, E, EV, SPLITS, scale, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, N_PAD,
    LOGITS: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, SPAN: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_V: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    bh = pid_bh.to(tl.int64)
    length = tl.load(len_ptr + pid_bh // H).to(tl.int32)  # 32-bit positions in the masks
    k_seq = k_ptr + (bh // H) * s_kb + (bh % H) * s_kh
    v_seq = v_ptr + (bh // H) * s_vb + (bh % H) * s_vh
    offs_c = tl.arange(0, BLOCK_C)
    offs_v = tl.arange(0, BLOCK_V)
    cent, crow, c_ok = _centroid_tile(c_ptr, bh, C, E, DOT_DTYPE, BLOCK_C, BLOCK_E)
    m = tl.full((BLOCK_C,), float("-inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_C,), tl.float32)
    acc = tl.zeros((BLOCK_C, BLOCK_V), tl.float32)
    start = split * SPAN
    for n0 in range(start, tl.minimum(start + SPAN, N), BLOCK_N):
        cols, in_n, keys, vals = _key_block(k_seq, v_seq, s_kn, s_vn, n0, N, E, EV, DOT_DTYPE,
                                            BLOCK_N, BLOCK_E, BLOCK_V)
        s = tl.dot(cent, tl.trans(keys), input_precision=PRECISION) * scale
        s = tl.where((cols < length)[None, :], s, float("-inf"))
        if LOGITS:  # the top-k's input
            tl.store(logits_ptr + crow[:, None] * N_PAD + cols[None, :], s,
                     mask=c_ok[:, None] & in_n[None, :])
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no valid key yet: all weights 0
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), vals, input_precision=PRECISION)
        m = m_new
    row = (bh * SPLITS + split) * C + offs_c
    tl.store(part_m_ptr + row, m, mask=c_ok)
    tl.store(part_l_ptr + row, l_sum, mask=c_ok)
    tl.store(part_acc_ptr + row[:, None] * EV + offs_v[None, :], acc,
             mask=c_ok[:, None] & (offs_v[None, :] < EV))


@triton.jit
def _centroid_combine_kernel(
    part_m_ptr, part_l_ptr, part_acc_ptr, values_ptr, values32_ptr, lse_ptr,
    C, EV, SPLITS, BLOCK_C: tl.constexpr, BLOCK_V: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    offs_c = tl.arange(0, BLOCK_C)
    offs_v = tl.arange(0, BLOCK_V)
    c_ok = offs_c < C
    ok = c_ok[:, None] & (offs_v[None, :] < EV)
    m = tl.full((BLOCK_C,), float("-inf"), tl.float32)
    for s in range(SPLITS):
        m = tl.maximum(m, tl.load(part_m_ptr + (bh * SPLITS + s) * C + offs_c, mask=c_ok,
                                  other=float("-inf")))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    l_sum = tl.zeros((BLOCK_C,), tl.float32)
    acc = tl.zeros((BLOCK_C, BLOCK_V), tl.float32)
    for s in range(SPLITS):
        row = (bh * SPLITS + s) * C + offs_c
        w = tl.exp(tl.load(part_m_ptr + row, mask=c_ok, other=float("-inf")) - m_safe)
        l_sum += tl.load(part_l_ptr + row, mask=c_ok, other=0.0) * w
        acc += tl.load(part_acc_ptr + row[:, None] * EV + offs_v[None, :], mask=ok, other=0.0) * w[:, None]
    values = acc / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]  # no valid key: 0
    out = (bh * C + offs_c)[:, None] * EV + offs_v[None, :]
    tl.store(values_ptr + out, values.to(values_ptr.dtype.element_ty), mask=ok)
    tl.store(values32_ptr + out, values, mask=ok)
    lse = m + tl.log(tl.where(l_sum > 0.0, l_sum, 1.0))
    tl.store(lse_ptr + bh * C + offs_c, tl.where(l_sum > 0.0, lse, float("-inf")), mask=c_ok)


@triton.jit
def _centroid_bwd_kernel(
    c_ptr, k_ptr, v_ptr, len_ptr, lse_ptr, values_ptr, dvalues_ptr, tw_ptr, dtw_ptr, idx_ptr,
    dc_ptr, dk_ptr, dv_ptr, dk_add_ptr, dv_add_ptr,
    H, C, N, E, EV, K, scale, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn,
    s_dkb, s_dkh, s_dkn, s_dvb, s_dvh, s_dvn,
    HAS_TOP: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, SPAN: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr, TOP_SORTED: tl.constexpr = False, ADD: tl.constexpr = False,
):
    pid_bh = tl.program_id(0)
    bh = pid_bh.to(tl.int64)
    length = tl.load(len_ptr + pid_bh // H).to(tl.int32)  # 32-bit positions in the masks
    b, h = bh // H, bh % H
    k_seq, v_seq = k_ptr + b * s_kb + h * s_kh, v_ptr + b * s_vb + h * s_vh
    dk_seq, dv_seq = dk_ptr + b * s_dkb + h * s_dkh, dv_ptr + b * s_dvb + h * s_dvh
    dk_add_seq, dv_add_seq = dk_add_ptr + b * s_dkb + h * s_dkh, dv_add_ptr + b * s_dvb + h * s_dvh
    offs_e = tl.arange(0, BLOCK_E)
    offs_v = tl.arange(0, BLOCK_V)
    cent, crow, c_ok = _centroid_tile(c_ptr, bh, C, E, DOT_DTYPE, BLOCK_C, BLOCK_E)
    e_mask = c_ok[:, None] & (offs_e[None, :] < E)
    v_mask = c_ok[:, None] & (offs_v[None, :] < EV)
    lse = tl.load(lse_ptr + crow, mask=c_ok, other=0.0)
    lse = tl.where(lse == float("-inf"), 0.0, lse)  # a centroid without keys: its weights are 0
    dvals = tl.load(dvalues_ptr + crow[:, None] * EV + offs_v[None, :], mask=v_mask, other=0.0)
    vals = tl.load(values_ptr + crow[:, None] * EV + offs_v[None, :], mask=v_mask, other=0.0)
    row_term = tl.sum(dvals.to(tl.float32) * vals, 1)  # D = Σ_n P dP: dvalues · values ...
    if HAS_TOP:  # ... + Σ_t top_w dtop_w
        offs_t = tl.arange(0, BLOCK_K)
        t_mask = c_ok[:, None] & (offs_t[None, :] < K)
        tw = tl.load(tw_ptr + crow[:, None] * K + offs_t[None, :], mask=t_mask, other=0.0)
        dtw = tl.load(dtw_ptr + crow[:, None] * K + offs_t[None, :], mask=t_mask, other=0.0)
        row_term += tl.sum(tw * dtw, 1)
    dvals = dvals.to(DOT_DTYPE)
    dcent = tl.zeros((BLOCK_C, BLOCK_E), tl.float32)
    start = tl.program_id(1) * SPAN
    if HAS_TOP and TOP_SORTED:
        # Each row's top keys in increasing position: a block's are the next few of the row, so
        # the compares below run only as often as the most any row has in the block, not K times.
        # done: each row's top keys before the block; nxt: the position of its next one (none:
        # past every block)
        done = tl.zeros((BLOCK_C,), tl.int32)
        for t in range(K):
            done += (tl.load(idx_ptr + crow * K + t, mask=c_ok, other=1 << 30) < start).to(tl.int32)
        nxt = tl.load(idx_ptr + crow * K + done, mask=c_ok & (done < K), other=1 << 30).to(tl.int32)
    for n0 in range(start, tl.minimum(start + SPAN, N), BLOCK_N):
        cols, in_n, keys, vals_n = _key_block(k_seq, v_seq, s_kn, s_vn, n0, N, E, EV, DOT_DTYPE,
                                              BLOCK_N, BLOCK_E, BLOCK_V)
        s = tl.dot(cent, tl.trans(keys), input_precision=PRECISION) * scale
        ok = c_ok[:, None] & (cols < length)[None, :]
        p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(dvals, tl.trans(vals_n), input_precision=PRECISION)
        if HAS_TOP:  # the top weights' gradients at their keys, one compare a top key
            # each top key as its lane in the block, compared with the lanes' constant indices in
            # 32 bits (out of the block, or no key: a lane that none has)
            lanes = tl.arange(0, BLOCK_N)
            if TOP_SORTED:  # the block's top keys of each row: its next ones, up to the block's end
                has = nxt < n0 + BLOCK_N
                while tl.max(has.to(tl.int32), 0) > 0:
                    lane_t = tl.where(has, nxt - n0, -1)
                    dtw_t = tl.load(dtw_ptr + crow * K + done, mask=has, other=0.0)
                    dp += tl.where(lane_t[:, None] == lanes[None, :], dtw_t[:, None], 0.0)
                    done += has.to(tl.int32)
                    nxt = tl.where(has, tl.load(idx_ptr + crow * K + done, mask=has & (done < K),
                                                other=1 << 30).to(tl.int32), nxt)
                    has = nxt < n0 + BLOCK_N
            else:
                for t in range(K):
                    lane_t = (tl.load(idx_ptr + crow * K + t, mask=c_ok, other=-1) - n0).to(tl.int32)
                    dtw_t = tl.load(dtw_ptr + crow * K + t, mask=c_ok, other=0.0)
                    dp += tl.where(lane_t[:, None] == lanes[None, :], dtw_t[:, None], 0.0)
        ds = (p * (dp - row_term[:, None]) * scale).to(DOT_DTYPE)
        dv_n = tl.dot(tl.trans(p.to(DOT_DTYPE)), dvals, input_precision=PRECISION)
        v_rows = cols[:, None] * s_dvn + offs_v[None, :]
        v_ok = in_n[:, None] & (offs_v[None, :] < EV)
        if ADD:  # another op's float32 gradients of these values, laid out as dv
            dv_n += tl.load(dv_add_seq + v_rows, mask=v_ok, other=0.0)
        tl.store(dv_seq + v_rows, dv_n.to(dv_ptr.dtype.element_ty), mask=v_ok)
        dk_n = tl.dot(tl.trans(ds), cent, input_precision=PRECISION)
        k_rows = cols[:, None] * s_dkn + offs_e[None, :]
        k_ok = in_n[:, None] & (offs_e[None, :] < E)
        if ADD:
            dk_n += tl.load(dk_add_seq + k_rows, mask=k_ok, other=0.0)
        tl.store(dk_seq + k_rows, dk_n.to(dk_ptr.dtype.element_ty), mask=k_ok)
        dcent += tl.dot(ds, keys, input_precision=PRECISION)
    tl.atomic_add(dc_ptr + crow[:, None] * E + offs_e[None, :], dcent, mask=e_mask, sem="relaxed")


def centroid_tiles(C: int, E: int, EV: int, dot_dtype, backward: bool, keys: int | None = None) -> dict:
    """Block sizes and warps of a launch over rows of ``keys`` keys (None: long rows): every
    centroid in one tile (at least 64 rows), fewer keys a block and more warps for wider tiles
    (fp32 operands, the backward's extra tiles, ``C > 128``); the half-precision backward of
    65-128 centroids on heads of up to 32 in 4 warps on rows shorter than
    :data:`SHORT_BACKWARD_BELOW`. Each configuration compiles for sm_90 without spills
    (``python -m fastasr.kernels.compile_check``)."""
    block_c = max(64, next_power_of_2(C))  # fewer rows took more registers on sm_90
    block_e = max(16, next_power_of_2(max(E, EV)))
    width = block_c * (4 if dot_dtype == tl.float32 else 1) * (2 if backward else 1) * max(1, block_e // 32)
    block_n = 64 if width <= 128 else (32 if width <= 256 and block_c <= 128 else 16)
    warps = 8 if width <= 128 or (backward and width <= 256) else 16
    if backward and block_c == 128 and width == 256 and keys is not None and keys < SHORT_BACKWARD_BELOW:
        warps = 4
    return {"BLOCK_C": block_c, "BLOCK_N": block_n, "BLOCK_E": max(16, next_power_of_2(E)),
            "BLOCK_V": max(16, next_power_of_2(EV)), "num_warps": warps}


def max_centroids(k: torch.Tensor, v: torch.Tensor) -> int:
    """The most centroids served for these keys and values (0: none), the largest tiles whose
    backward compiles for sm_90 without spills: heads up to 32 wide, :data:`MAX_CENTROIDS` in
    half precision and half that in float32; heads up to 64 wide, 64 in half precision."""
    width = max(k.shape[-1], v.shape[-1])
    fp32 = torch.float32 in (k.dtype, v.dtype)
    if width <= 32:
        return MAX_CENTROIDS // 2 if fp32 else MAX_CENTROIDS
    return 64 if width <= 64 and not fp32 else 0


def applies(centroids: torch.Tensor, k: torch.Tensor, v: torch.Tensor, topk: int) -> bool:
    """Whether :func:`centroid_attention` serves these shapes and dtypes."""
    C, N = centroids.shape[2], k.shape[2]
    return (k.dtype in _SUPPORTED and v.dtype in _SUPPORTED and 1 <= C <= max_centroids(k, v)
            and 1 <= N and centroids.dtype in _SUPPORTED)


def _launch_config(centroids, k, v, backward):
    interpreted = kernels_interpreted(_centroid_fwd_kernel)
    dot_dtype, precision = dot_config(torch.promote_types(k.dtype, v.dtype), interpreted)
    tiles = centroid_tiles(centroids.shape[2], k.shape[3], v.shape[3], dot_dtype, backward, k.shape[2])
    return {"DOT_DTYPE": dot_dtype, "PRECISION": precision, "SPAN": SPLIT_KEYS, **tiles}


class CentroidState(NamedTuple):
    """What the backward of a centroid attention needs besides its inputs: each centroid's
    log-sum-exp, its float32 values, the top keys' float32 weights, and whether the top keys
    come in increasing position (the Triton top-k's order)."""

    lse: torch.Tensor
    values32: torch.Tensor
    top_w: torch.Tensor
    top_sorted: bool


def centroid_forward(centroids, k, v, lengths, scale, topk):
    """The forward launches: ``values`` in ``v``'s dtype, ``top_w`` in the centroids' dtype,
    ``top_idx``, and the :class:`CentroidState` for :func:`centroid_backward`."""
    B, H, C, E = centroids.shape
    N, EV = k.shape[2], v.shape[3]
    splits = cdiv(N, SPLIT_KEYS)
    f32 = dict(dtype=torch.float32, device=k.device)
    part_m, part_l = torch.empty((B, H, splits, C), **f32), torch.empty((B, H, splits, C), **f32)
    part_acc = torch.empty((B, H, splits, C, EV), **f32)
    # the logits' rows LOGITS_ROW_ALIGN floats apart, whatever N: aligned rows, vector stores and loads
    n_pad = cdiv(N, LOGITS_ROW_ALIGN) * LOGITS_ROW_ALIGN
    logits = torch.empty((B, H, C, n_pad), **f32)[..., :N] if topk else part_m  # without top keys: not written
    config = _launch_config(centroids, k, v, backward=False)
    _centroid_fwd_kernel[(B * H, splits)](
        centroids, k, v, lengths, logits, part_m, part_l, part_acc,
        H, C, N, E, EV, splits, scale, *k.stride()[:3], *v.stride()[:3], n_pad, LOGITS=topk > 0, **config)
    values = torch.empty((B, H, C, EV), dtype=v.dtype, device=v.device)
    values32, lse = torch.empty((B, H, C, EV), **f32), torch.empty((B, H, C), **f32)
    _centroid_combine_kernel[(B * H,)](
        part_m, part_l, part_acc, values, values32, lse, C, EV, splits,
        BLOCK_C=config["BLOCK_C"], BLOCK_V=config["BLOCK_V"], num_warps=config["num_warps"])
    # the backward walks each row's top keys in increasing position where the Triton top-k wrote them
    top_sorted = bool(topk) and N <= MAX_N
    if top_sorted:
        top_idx, top_w = topk_softmax(logits, lse, topk)
    elif topk:  # rows the Triton top-k cannot hold: torch.topk, and the weights exp(l - lse) (0 in a row without keys)
        top_idx = reference.topk_indices(logits, topk)
        top_w = torch.exp(logits.gather(-1, top_idx) - lse.masked_fill(lse == float("-inf"), 0.0)[..., None])
    else:
        top_idx = torch.empty((B, H, C, 0), dtype=torch.int64, device=k.device)
        top_w = torch.empty((B, H, C, 0), **f32)
    return values, top_w.to(centroids.dtype), top_idx, CentroidState(lse, values32, top_w, top_sorted)


def centroid_backward(centroids, k, v, lengths, scale, state: CentroidState, top_idx, dvalues, dtop_w,
                      add: tuple[torch.Tensor, torch.Tensor] | None = None):
    """The backward launch: ``dcentroids`` in the centroids' dtype, ``dk`` and ``dv`` in their
    inputs' dtype and layout. ``add``: float32 ``(dk, dv)`` in those layouts that the kernel adds
    to its own before it stores them (another op's gradients of the same keys and values: one
    pass instead of a cast and a sum each)."""
    B, H, C, E = centroids.shape
    N, EV, K = k.shape[2], v.shape[3], top_idx.shape[3]
    dcent = torch.zeros((B, H, C, E), dtype=torch.float32, device=k.device)
    # each gradient in its input's layout (fastasr.kernels.rows): the caller's heads merge as a view
    dk = new_rows(B, H, N, E, heads_inner(k), dtype=k.dtype, device=k.device)
    dv = new_rows(B, H, N, EV, heads_inner(v), dtype=v.dtype, device=v.device)
    if add is not None and (add[0].stride() != dk.stride() or add[1].stride() != dv.stride()):
        raise ValueError("centroid_backward: the gradients to add must be laid out as k and v")
    dtop_w = dtop_w.float().contiguous() if K else state.top_w
    _centroid_bwd_kernel[(B * H, cdiv(N, SPLIT_KEYS))](
        centroids, k, v, lengths, state.lse, state.values32, dvalues.contiguous(), state.top_w, dtop_w, top_idx,
        dcent, dk, dv, *((dk, dv) if add is None else add), H, C, N, E, EV, K, scale,
        *k.stride()[:3], *v.stride()[:3], *dk.stride()[:3], *dv.stride()[:3],
        HAS_TOP=K > 0, BLOCK_K=max(16, next_power_of_2(K)), TOP_SORTED=state.top_sorted,
        ADD=add is not None, **_launch_config(centroids, k, v, backward=True))
    return dcent.to(centroids.dtype), dk, dv


class _CentroidAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, centroids, k, v, lengths, scale, topk):
        values, top_w, top_idx, state = centroid_forward(centroids, k, v, lengths, scale, topk)
        ctx.save_for_backward(centroids, k, v, lengths, state.lse, state.values32, state.top_w, top_idx)
        ctx.scale, ctx.top_sorted = scale, state.top_sorted
        ctx.mark_non_differentiable(top_idx)
        return values, top_w, top_idx

    @staticmethod
    def backward(ctx, dvalues, dtop_w, _):
        centroids, k, v, lengths, lse, values32, top_w, top_idx = ctx.saved_tensors
        state = CentroidState(lse, values32, top_w, ctx.top_sorted)
        dcent, dk, dv = centroid_backward(centroids, k, v, lengths, ctx.scale, state, top_idx, dvalues, dtop_w)
        return dcent, dk, dv, None, None, None


def centroid_attention(
    centroids: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor | None,
    scale: float,
    topk: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``reference.centroid_attention`` in three Triton launches forward (two when ``topk = 0``)
    and one backward.

    Args:
        centroids: ``(B, H, C, E)`` (float32; the products take ``k``'s dtype); k: ``(B, H, N, E)``;
            v: ``(B, H, N, Ev)``, fp32/fp16/bf16, in any layout with a unit stride along the last
            axis (their gradients take the same layout); lengths: ``(B,)`` or None; scale: the
            logits' factor; topk: keys to select per centroid, ``0 <= topk <= N``.

    Returns:
        ``values`` ``(B, H, C, Ev)`` in ``v``'s dtype, ``top_w`` ``(B, H, C, topk)`` in the
        centroids' dtype and ``top_idx`` ``(B, H, C, topk)`` int64, as the reference (a
        centroid of a sequence without valid keys gets zeros where the reference has NaN).

    Raises:
        ValueError: shapes that disagree, ``topk`` out of range, or what :func:`applies` refuses.
    """
    lengths = checked_lengths("centroid_attention", centroids, k, v, lengths, topk)
    return _CentroidAttention.apply(centroids.contiguous(), unit_stride(k), unit_stride(v), lengths,
                                    scale, topk)


def checked_lengths(op: str, centroids, k, v, lengths, topk: int) -> torch.Tensor:
    """``lengths`` as int64 on ``k``'s device (every key valid where None), after checking that
    the centroid kernels serve ``centroids``, ``k``, ``v`` and ``topk`` (the errors name ``op``)."""
    require_triton(op, k.device, kernels_interpreted(_centroid_fwd_kernel))
    if centroids.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{op}: centroids, k and v must be 4-D (B, H, ·, ·)")
    B, H, C, E = centroids.shape
    N = k.shape[2]
    if k.shape[:2] != (B, H) or k.shape[3] != E or v.shape[:3] != k.shape[:3]:
        raise ValueError(f"{op}: centroids {tuple(centroids.shape)}, k {tuple(k.shape)} "
                         f"and v {tuple(v.shape)} must be (B, H, C, E), (B, H, N, E), (B, H, N, Ev)")
    if not 0 <= topk <= N:
        raise ValueError(f"{op}: topk={topk} must be in [0, N={N}]")
    if not applies(centroids, k, v, topk):
        raise ValueError(f"{op}: needs fp32/fp16/bf16 k and v, 1 <= C <= "
                         f"{max_centroids(k, v)} (for heads of {k.shape[-1]}/{v.shape[-1]} in these "
                         f"dtypes) and 1 <= N; got C={C}, N={N}, "
                         f"topk={topk}, k {k.dtype}, v {v.dtype}")
    if lengths is None:
        lengths = torch.full((B,), N, dtype=torch.int64, device=k.device)
    return lengths.to(device=k.device, dtype=torch.int64)
