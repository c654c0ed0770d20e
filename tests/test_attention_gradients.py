"""Gradients: they reach q, k, v; float64 gradcheck; top-k's custom backward."""

from __future__ import annotations

import pytest
import torch

from fastasr.attention import build_attention
from fastasr.attention.masking import key_mask
from fastasr.attention.topk import topk_attention

H, E = 2, 4

VARIANTS = {
    "full": dict(spec="full"),
    "topk-3": dict(spec="topk-3", chunk=4),
    "clustered-3": dict(spec="clustered-3", seed=0),
    "i-clustered-3": dict(spec="i-clustered-3", topk=4, seed=0),
    "lsh-2": dict(spec="lsh-2", chunk=4, buckets=4, seed=0),
}


def _build(name):
    cfg = dict(VARIANTS[name])
    return build_attention(cfg.pop("spec"), **cfg)


def _inputs(n, seed, dtype=torch.float32, batch=2):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(batch, H, n, E, generator=g, dtype=dtype).requires_grad_() for _ in range(3)
    ]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_gradients_reach_q_k_v_and_skip_padding(name):
    attn = _build(name)
    q, k, v = _inputs(12, 0)
    lengths = torch.tensor([12, 7])
    if attn.requires_shared_qk:
        k = q
    out = attn(q, k, v, lengths)
    out.sin().sum().backward()
    for label, t in (("q", q), ("k", k), ("v", v)):
        assert t.grad is not None, f"{name}: no gradient for {label}"
        assert bool(torch.isfinite(t.grad).all())
        assert float(t.grad[:, :, :7].abs().sum()) > 0, f"{name}: zero gradient for {label}"
        assert bool((t.grad[1, :, 7:] == 0).all()), f"{name}: padded {label} got gradient"


@pytest.mark.parametrize("name", list(VARIANTS))
def test_float64_gradcheck(name):
    """The discrete choices (clusters, top keys, buckets) are fixed by the seed and
    do not move under gradcheck's 1e-6 perturbations; everything else is smooth."""
    attn = _build(name)
    if "clustered" in name:
        attn = build_attention(attn, iterations=2)  # fewer Lloyd steps: same code paths, faster
    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(2, 1, 6, 3, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3)
    )
    lengths = torch.tensor([6, 4])
    if attn.requires_shared_qk:
        fn = lambda x, v_: attn(x, x, v_, lengths)  # noqa: E731
        args = (q, v)
    else:
        fn = lambda q_, k_, v_: attn(q_, k_, v_, lengths)  # noqa: E731
        args = (q, k, v)
    assert torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-5)


def _dense_topk_reference(q, k, v, keys_ok, kk):
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~keys_ok[:, None, None, :], -torch.inf)
    top = scores.topk(kk, -1)
    sparse = torch.full_like(scores, -torch.inf).scatter(-1, top.indices, top.values)
    return sparse.softmax(-1) @ v


@pytest.mark.parametrize("chunk", [2, 5, 1024])
def test_topk_custom_backward_matches_autograd_through_a_dense_reference(chunk):
    q, k, v = _inputs(11, 2, torch.float64, batch=3)
    lengths = torch.tensor([11, 6, 2])  # the last is shorter than k
    keys_ok = key_mask(lengths, 3, 11, q.device)
    grad = torch.randn(3, H, 11, E, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    out = topk_attention(q, k, v, keys_ok, 4, chunk)
    custom = torch.autograd.grad(out, (q, k, v), grad)
    ref_out = _dense_topk_reference(q, k, v, keys_ok, 4)
    reference = torch.autograd.grad(ref_out, (q, k, v), grad)
    torch.testing.assert_close(out, ref_out)
    for a, b in zip(custom, reference):
        torch.testing.assert_close(a, b)


def test_topk_backward_saves_no_dense_matrix():
    """What the forward keeps for backward is O(N k), not O(N^2)."""
    n, kk = 256, 4
    q, k, v = _inputs(n, 4, batch=1)
    keys_ok = torch.ones(1, n, dtype=torch.bool)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        topk_attention(q, k, v, keys_ok, kk, 32)
    assert max(saved) <= H * n * max(kk, E)
