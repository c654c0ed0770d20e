"""Exact limits of the approximations, and Proposition 2 of the clustered-attention paper."""

from __future__ import annotations

import pytest
import torch

from fastasr.attention import build_attention

H, E = 2, 8
FULL = build_attention("full")


def _qkv(batch, n, seed, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    q = scale * torch.randn(batch, H, n, E, generator=g)
    k = scale * torch.randn(batch, H, n, E, generator=g)
    v = torch.randn(batch, H, n, E, generator=g)
    return q, k, v


@pytest.mark.parametrize("clusters", [1, 3, 100])
def test_i_clustered_with_topk_at_least_the_length_is_full_attention(clusters):
    q, k, v = _qkv(3, 40, clusters)
    lengths = torch.tensor([40, 16, 7])
    expected = FULL(q, k, v, lengths)
    for topk in (40, 64):
        attn = build_attention(f"i-clustered-{clusters}", topk=topk, seed=0)
        torch.testing.assert_close(attn(q, k, v, lengths), expected, atol=1e-5, rtol=0)
    # topk = 16 covers the two shorter sequences exactly
    out = build_attention(f"i-clustered-{clusters}", topk=16, seed=0)(q, k, v, lengths)
    torch.testing.assert_close(out[1:], expected[1:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("clusters", [30, 100])
def test_clustered_with_one_cluster_per_query_is_full_attention(clusters):
    q, k, v = _qkv(2, 30, 7)
    lengths = torch.tensor([30, 12])
    attn = build_attention(f"clustered-{clusters}", seed=3)
    ca = attn.centroid_attention(q, k, lengths)
    assert bool((ca.counts <= 1).all()), "codes must be distinct for this limit"
    torch.testing.assert_close(attn(q, k, v, lengths), FULL(q, k, v, lengths), atol=1e-5, rtol=0)


def test_clustered_with_one_cluster_gives_everyone_the_mean_query_attention():
    q, k, v = _qkv(1, 20, 8)
    out = build_attention("clustered-1", seed=0)(q, k, v)
    mean_q = q.mean(2, keepdim=True)
    expected = torch.softmax(mean_q @ k.transpose(-1, -2) / E**0.5, -1) @ v
    torch.testing.assert_close(out, expected.expand_as(out), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("k_top,chunk", [(25, 1024), (25, 3), (1000, 7)])
def test_topk_with_k_at_least_the_length_is_full_attention(k_top, chunk):
    q, k, v = _qkv(3, 25, 9)
    lengths = torch.tensor([25, 10, 1])
    out = build_attention(f"topk-{k_top}", chunk=chunk)(q, k, v, lengths)
    torch.testing.assert_close(out, FULL(q, k, v, lengths), atol=1e-6, rtol=1e-5)
    # ...and topk-10 is exact for the sequences of length <= 10
    out10 = build_attention("topk-10", chunk=chunk)(q, k, v, lengths)
    torch.testing.assert_close(out10[1:], FULL(q, k, v, lengths)[1:], atol=1e-6, rtol=1e-5)


def test_topk_keeps_exactly_the_k_largest_scores():
    q, k, _ = _qkv(2, 30, 10)
    lengths = torch.tensor([30, 5])
    w = build_attention("topk-6", chunk=4).dense_weights(q, k, lengths)
    scores = (q @ k.transpose(-1, -2)).masked_fill(
        torch.arange(30) >= lengths[:, None, None, None], -torch.inf
    )
    for b, length in enumerate(lengths.tolist()):
        kept = w[b, :, :length] > 0
        assert kept.sum(-1).eq(min(6, length)).all()
        best = scores[b, :, :length].topk(min(6, length), -1).indices
        assert kept.gather(-1, best).all()


def test_proposition_2_i_clustered_is_never_further_from_full_than_clustered():
    """Per query, ||A_i-clustered - A_full||_1 <= ||A_clustered - A_full||_1."""
    g = torch.Generator().manual_seed(11)
    n, protos = 96, 6
    centres = 3 * torch.randn(2, H, protos, E, generator=g)
    member = torch.randint(0, protos, (2, H, n), generator=g)
    q = centres.gather(2, member[..., None].expand(2, H, n, E)) + 0.3 * torch.randn(
        2, H, n, E, generator=g
    )
    k = torch.randn(2, H, n, E, generator=g)
    lengths = torch.tensor([96, 70])
    full = FULL.dense_weights(q, k, lengths)
    clustered = build_attention("clustered-6", seed=2)
    improved = build_attention("i-clustered-6", topk=8, seed=2)
    assert torch.equal(
        clustered.centroid_attention(q, k, lengths).assignments,
        improved.centroid_attention(q, k, lengths).assignments,
    )
    err_c = (clustered.dense_weights(q, k, lengths) - full).abs().sum(-1)
    err_i = (improved.dense_weights(q, k, lengths) - full).abs().sum(-1)
    assert bool((err_i <= err_c + 1e-6).all())
    assert float(err_i.sum()) < 0.8 * float(err_c.sum())  # and strictly better overall


def test_lsh_with_one_chunk_is_full_shared_qk_attention_without_self():
    g = torch.Generator().manual_seed(12)
    n = 20
    x = 2 * torch.randn(2, H, n, E, generator=g)
    v = torch.randn(2, H, n, E, generator=g)
    lengths = torch.tensor([20, 9])
    keys = torch.nn.functional.normalize(x, dim=-1)
    scores = x @ keys.transpose(-1, -2) / E**0.5
    scores = scores.masked_fill(torch.eye(n, dtype=torch.bool), -torch.inf)
    scores = scores.masked_fill(torch.arange(n) >= lengths[:, None, None, None], -torch.inf)
    expected = (scores.softmax(-1) @ v).masked_fill(
        torch.arange(n)[:, None] >= lengths[:, None, None, None], 0
    )
    for rounds in (1, 3):  # identical rounds must combine to the same result
        out = build_attention(f"lsh-{rounds}", chunk=32, seed=0)(x, x, v, lengths)
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_lsh_position_attends_to_itself_only_when_alone():
    x = torch.randn(1, H, 1, E)
    v = torch.randn(1, H, 1, E)
    torch.testing.assert_close(build_attention("lsh-2", seed=0)(x, x, v), v)
    x = torch.randn(1, H, 50, E)
    w = build_attention("lsh-4", chunk=4, seed=0).dense_weights(x, x)
    assert bool((torch.diagonal(w, dim1=-2, dim2=-1) == 0).all())
    torch.testing.assert_close(w.sum(-1), torch.ones(1, H, 50))


def test_lsh_rounds_softmax_over_the_union_of_their_keys():
    """Reformer's duplicate correction: a key that several rounds put in a query's window
    counts once, so lsh-R is the softmax over the union of the keys the rounds found."""
    g = torch.Generator().manual_seed(14)
    n = 40
    x = torch.randn(2, H, n, E, generator=g)
    v = torch.randn(2, H, n, E, generator=g)
    lengths = torch.tensor([40, 27])
    attn = build_attention("lsh-3", chunk=4, buckets=4, seed=2)
    # The windows of every round, from the module's own hashing and sorting.
    xp, valid, rotations = attn._prepare(x, lengths)
    found = torch.zeros(2, H, n, n, dtype=torch.int64)
    for rotation in rotations:
        chunk_of = (attn._order(xp, valid, rotation).argsort(-1) // attn.chunk)[..., :n]
        cq, ck = chunk_of[..., :, None], chunk_of[..., None, :]
        found += (ck == cq) | (ck == cq - 1)  # own chunk or the one before
    union = found > 0
    assert bool((found > 1).any()), "no key found twice: the test would not test anything"
    scores = x @ torch.nn.functional.normalize(x, dim=-1).transpose(-1, -2) / E**0.5
    scores = scores.masked_fill(~union, -torch.inf)
    scores = scores.masked_fill(torch.arange(n) >= lengths[:, None, None, None], -torch.inf)
    scores = scores - 1e5 * torch.eye(n)  # itself only when nothing else is there
    expected = scores.softmax(-1).masked_fill(
        torch.arange(n)[:, None] >= lengths[:, None, None, None], 0
    )
    torch.testing.assert_close(attn.dense_weights(x, x, lengths), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(attn(x, x, v, lengths), expected @ v, atol=1e-5, rtol=1e-5)
