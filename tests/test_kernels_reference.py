"""The PyTorch reference clustering ops: bit semantics, K-means rules, gathers."""

from __future__ import annotations

import pytest
import torch
from kernel_fixtures import clustered_codes

from fastasr.kernels.clustering import gathers, ops, reference


def _lengths(*values):
    return torch.tensor(values, dtype=torch.int64)


# ------------------------------------------------------------------ bit helpers
def test_popcount_matches_python():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 2**62, (500,), generator=g, dtype=torch.int64) * 2 + torch.randint(
        0, 2, (500,), generator=g
    )
    x = torch.cat([x, torch.tensor([0, 1, 2**63 - 1, 2**62, 0x5555555555555555])])
    expected = torch.tensor([bin(int(v)).count("1") for v in x])
    assert torch.equal(reference.popcount(x), expected)


def test_pack_unpack_roundtrip():
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 2**40, (3, 7), generator=g, dtype=torch.int64)
    bits = reference.unpack_bits(codes, 40)
    assert bits.shape == (3, 7, 40)
    assert torch.equal(
        bits[0, 0],
        torch.tensor([(int(codes[0, 0]) >> i) & 1 for i in range(40)], dtype=torch.float32),
    )
    assert torch.equal(reference.pack_bits(bits), codes)


# ------------------------------------------------------------------ hash codes
@pytest.mark.parametrize("bits", [1, 13, 63])
def test_hash_code_bits_are_signs_of_affine_projections(bits):
    g = torch.Generator().manual_seed(bits)
    B, H, N, E = 2, 3, 9, 5
    x = torch.randn(B, H, N, E, generator=g, dtype=torch.float64)
    planes = torch.randn(E + 1, bits, generator=g, dtype=torch.float64)
    codes = reference.hash_codes(x, planes)
    assert codes.dtype == torch.int64 and codes.shape == (B, H, N)
    assert bool((codes >= 0).all()) and bool(((codes >> bits) == 0).all())
    for b, h, n in [(0, 0, 0), (1, 2, 8), (0, 1, 4)]:
        for i in range(bits):
            side = float(x[b, h, n] @ planes[:E, i] + planes[E, i]) > 0
            assert ((int(codes[b, h, n]) >> i) & 1) == side


def test_hash_codes_offset_row_is_used_and_padding_is_zero():
    E = 4
    x = torch.zeros(1, 1, 3, E)
    planes = torch.zeros(E + 1, 3)
    planes[E] = torch.tensor([1.0, -1.0, 2.0])  # only the offsets decide: bits 0 and 2 set
    codes = reference.hash_codes(x, planes, _lengths(2))
    assert codes.tolist() == [[[0b101, 0b101, 0]]]


def test_hash_codes_reject_too_many_bits():
    with pytest.raises(ValueError, match="64 bits"):
        reference.hash_codes(torch.zeros(1, 1, 2, 3), torch.zeros(4, 64))
    with pytest.raises(ValueError, match=r"\(E\+1, bits\)"):
        reference.hash_codes(torch.zeros(1, 1, 2, 3), torch.zeros(3, 8))
    with pytest.raises(ValueError, match=r"hash_codes: x must be \(B, H, N, E\)"):
        reference.hash_codes(torch.zeros(2, 3), torch.zeros(4, 8))


# ------------------------------------------------------------------ k-means
def _kmeans_python(codes: list[int], clusters: int, iterations: int, bits: int):
    """The module docstring's K-means, written with Python ints, one sequence."""
    L = len(codes)
    c_eff = min(clusters, L)
    cent = [codes[(c * L) // c_eff] for c in range(c_eff)]

    def assign():
        out = []
        for x in codes:
            d = [bin(x ^ c).count("1") for c in cent]
            out.append(d.index(min(d)))  # first minimum
        return out

    for _ in range(iterations):
        a = assign()
        for c in range(c_eff):
            members = [codes[i] for i in range(L) if a[i] == c]
            if not members:
                continue
            new = 0
            for bit in range(bits):
                ones = sum((m >> bit) & 1 for m in members)
                if 2 * ones > len(members):
                    new |= 1 << bit
            cent[c] = new
    a = assign()
    return a, [a.count(c) for c in range(clusters)]


@pytest.mark.parametrize("clusters,iterations", [(1, 2), (4, 0), (4, 3), (7, 10), (40, 2)])
def test_kmeans_matches_the_written_rules(clusters, iterations):
    g = torch.Generator().manual_seed(clusters * 10 + iterations)
    B, H, N, bits = 3, 2, 30, 12
    # codes drawn around a few prototypes, so clusters are non-trivial
    protos = torch.randint(0, 2**bits, (4,), generator=g)
    noise = (torch.rand(B, H, N, bits, generator=g) < 0.1).long()
    flips = reference.pack_bits(noise)
    codes = protos[torch.randint(0, 4, (B, H, N), generator=g)] ^ flips
    lengths = _lengths(30, 11, 3)
    codes = codes.masked_fill(torch.arange(N)[None, None] >= lengths[:, None, None], 0)
    assign, counts = reference.hamming_kmeans(codes, lengths, clusters, iterations, bits=bits)
    assert assign.shape == (B, H, N) and counts.shape == (B, H, clusters)
    for b in range(B):
        L = int(lengths[b])
        for h in range(H):
            exp_a, exp_c = _kmeans_python(codes[b, h, :L].tolist(), clusters, iterations, bits)
            assert assign[b, h, :L].tolist() == exp_a
            assert counts[b, h].tolist() == exp_c
            assert bool((assign[b, h, L:] == -1).all())
            assert int(counts[b, h].sum()) == L


def test_kmeans_assignment_is_nearest_final_centroid():
    """After convergence the centroids are the members' majority codes and each
    code sits with the nearest of them (Hamming distance)."""
    g = torch.Generator().manual_seed(3)
    bits = 20
    codes = torch.randint(0, 2**bits, (1, 1, 64), generator=g)
    assign, counts = reference.hamming_kmeans(codes, None, 5, 50, bits=bits)
    cents = {}
    for c in range(5):
        members = codes[0, 0][assign[0, 0] == c]
        if len(members):
            ones = reference.unpack_bits(members, bits).sum(0)
            cents[c] = int(reference.pack_bits((2 * ones > len(members)).long()))
    for x, a in zip(codes[0, 0].tolist(), assign[0, 0].tolist()):
        dists = {c: bin(x ^ v).count("1") for c, v in cents.items()}
        assert dists[a] == min(dists.values())
    assert torch.equal(counts[0, 0], torch.bincount(assign[0, 0], minlength=5))


def test_kmeans_more_clusters_than_positions_and_empty_sequences():
    codes = torch.tensor([[[5, 9, 3, 0, 0]], [[0, 0, 0, 0, 0]]])
    assign, counts = reference.hamming_kmeans(codes, _lengths(3, 0), 100, 10, bits=4)
    assert assign[0, 0].tolist() == [0, 1, 2, -1, -1]  # one cluster per distinct code
    assert counts[0, 0, :3].tolist() == [1, 1, 1] and int(counts[0, 0, 3:].sum()) == 0
    assert assign[1, 0].tolist() == [-1] * 5 and int(counts[1].sum()) == 0


def test_kmeans_is_deterministic_and_ignores_generator():
    codes = torch.randint(0, 2**63 - 1, (2, 2, 40), generator=torch.Generator().manual_seed(0))
    a1, c1 = reference.hamming_kmeans(codes, None, 6, 5)
    a2, c2 = reference.hamming_kmeans(codes, None, 6, 5, torch.Generator().manual_seed(99))
    assert torch.equal(a1, a2) and torch.equal(c1, c2)
    a3, c3 = ops.hamming_kmeans(codes, None, 6, 5)
    assert torch.equal(a1, a3) and torch.equal(c1, c3)


def test_kmeans_rejects_bad_arguments():
    codes = torch.zeros(1, 1, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="clusters=0"):
        reference.hamming_kmeans(codes, None, 0, 1)
    with pytest.raises(ValueError, match="iterations=-1"):
        reference.hamming_kmeans(codes, None, 2, -1)


def test_fixed_point_iteration_is_where_kmeans_stops_changing():
    """The iteration ``t`` that moves no centroid: ``t - 1`` iterations already give what 30
    give (the fixed point the C++ and Triton kernels stop at), sequence by sequence; codes
    near a few centres reach it early, random codes over 2 iterations mostly do not (-1)."""
    g = torch.Generator().manual_seed(11)
    codes = clustered_codes(2, 3, 60, 5, 0.05, g)
    lengths = torch.tensor([60, 41])
    first = reference.fixed_point_iteration(codes, lengths, 5, 30)
    assert first.shape == (2, 3) and bool(((first >= 1) & (first < 30)).all()), first
    final = reference.hamming_kmeans(codes, lengths, 5, 30)
    for b in range(2):
        for h in range(3):
            early = reference.hamming_kmeans(codes, lengths, 5, int(first[b, h]) - 1)
            assert all(torch.equal(e[b, h], f[b, h]) for e, f in zip(early, final)), (b, h)
    random = torch.randint(0, 2**62, (4, 2, 200), generator=g)
    assert int((reference.fixed_point_iteration(random, None, 20, 2) == -1).sum()) >= 6
    with pytest.raises(ValueError, match="clusters=0"):
        reference.fixed_point_iteration(codes, lengths, 0, 3)
    with pytest.raises(ValueError, match="no positions"):
        reference.fixed_point_iteration(codes[..., :0], None, 5, 3)


# ------------------------------------------------------------------ gathers
def _dense_per_query(topk_idx, assignments):
    return topk_idx.gather(
        2, assignments.clamp(min=0)[..., None].expand(*assignments.shape, topk_idx.shape[-1])
    )


def test_clustered_dot_and_weighted_sum_match_dense_gathers():
    g = torch.Generator().manual_seed(5)
    B, H, N, E, C, K = 2, 2, 11, 4, 3, 5
    q = torch.randn(B, H, N, E, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, N, E, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, N, 6, generator=g, dtype=torch.float64)
    topk_idx = torch.stack([torch.randperm(N, generator=g)[:K] for _ in range(B * H * C)]).view(
        B, H, C, K
    )
    assignments = torch.randint(0, C, (B, H, N), generator=g)
    assignments[1, :, 7:] = -1
    per_q = _dense_per_query(topk_idx, assignments)
    kg = k[:, :, None].expand(B, H, N, N, E).gather(3, per_q[..., None].expand(B, H, N, K, E))
    dots = (q[:, :, :, None] * kg).sum(-1).masked_fill((assignments < 0)[..., None], 0)
    torch.testing.assert_close(ops.clustered_dot(q, k, topk_idx, assignments), dots)
    w = torch.randn(B, H, N, K, generator=g, dtype=torch.float64)
    vg = v[:, :, None].expand(B, H, N, N, 6).gather(3, per_q[..., None].expand(B, H, N, K, 6))
    sums = (w[..., None] * vg).sum(-2).masked_fill((assignments < 0)[..., None], 0)
    torch.testing.assert_close(ops.clustered_weighted_sum(w, v, topk_idx, assignments), sums)


def test_gather_ops_gradcheck(monkeypatch):
    monkeypatch.setattr(gathers, "_GATHER_ROWS", 7)  # exercise the row blocking
    g = torch.Generator().manual_seed(6)
    B, H, N, E, C, K = 1, 2, 9, 3, 2, 4
    q = torch.randn(B, H, N, E, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, H, N, E, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(B, H, N, K, generator=g, dtype=torch.float64, requires_grad=True)
    topk_idx = torch.randint(
        0, N, (B, H, C, K), generator=g
    )  # repeats allowed: index_add accumulates
    assignments = torch.randint(0, C, (B, H, N), generator=g)
    assignments[..., -2:] = -1
    assert torch.autograd.gradcheck(
        lambda a, b: ops.clustered_dot(a, b, topk_idx, assignments), (q, k)
    )
    assert torch.autograd.gradcheck(
        lambda a, b: ops.clustered_weighted_sum(a, b, topk_idx, assignments), (w, k)
    )


@pytest.mark.parametrize("lengths", [None, [9, 4, 0]])
def test_fused_centroid_values_equal_the_reference(lengths):
    """The fused SDPA call clustered attention uses on a GPU gives the reference's centroid
    outputs and gradients (padded keys masked; a length-0 sequence attends to every key)."""
    g = torch.Generator().manual_seed(5)
    B, H, C, N, E = 3, 2, 4, 9, 8
    lens = None if lengths is None else torch.tensor(lengths)
    leaves = [torch.randn(*shape, generator=g).requires_grad_()
              for shape in ((B, H, C, E), (B, H, N, E), (B, H, N, E))]
    want, _, _ = reference.centroid_attention(*leaves, lens, 0.3, 0)
    want_grads = torch.autograd.grad(want.square().sum(), leaves)
    got = ops.fused_centroid_values(*leaves, lens, 0.3)
    got_grads = torch.autograd.grad(got.square().sum(), leaves)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_padded_offsets_are_each_sequences_valid_rows_then_its_padding():
    """``fastasr.kernels.clustering.varlen.padded_offsets``: ``0, L0, N, N + L1, 2N, ...`` on the device of
    the lengths, int32; ``C`` rows a sequence and no padding (the centroids) is ``0, C, C, 2C, ...``."""
    from fastasr.kernels.clustering.varlen import as_rows, padded_offsets, varlen_available

    got = padded_offsets(torch.tensor([3, 5, 0]), 5)
    assert got.dtype == torch.int32 and got.tolist() == [0, 3, 5, 10, 10, 10, 15]
    assert padded_offsets(torch.full((3,), 4), 4).tolist() == [0, 4, 4, 8, 8, 12, 12]
    proj = torch.randn(2, 5, 3 * 4)  # (B, N, H·E): its head-split view's rows are the projection itself
    rows = as_rows(proj.view(2, 5, 3, 4).transpose(1, 2))
    assert rows.shape == (10, 3, 4) and rows.data_ptr() == proj.data_ptr() and torch.equal(rows.reshape(2, 5, 12), proj)
    x = torch.randn(2, 3, 5, 4)  # contiguous (B, H, N, E): copied into rows
    assert torch.equal(as_rows(x)[7], x[1, :, 2])
    assert not varlen_available(torch.zeros(1, 8, dtype=torch.bfloat16), torch.zeros(1, 8, dtype=torch.bfloat16))  # CPU


@pytest.mark.cuda
@pytest.mark.parametrize("lengths", [[700, 513, 0, 64], [700, 700, 700, 700]])
def test_varlen_centroid_values_equal_the_sdpa_call(lengths, monkeypatch):
    """``ops.VARLEN_CENTROID_VALUES``: FlashAttention's variable-length kernel gives the centroid
    values and gradients of the masked SDPA call (bf16, 100 centroids, heads of 32) on keys and
    values as an attention layer passes them (head-split views of its projections), padded
    sequences, and one without keys (which attends to every key, as the key mask has it)."""
    from fastasr.kernels.clustering.varlen import varlen_available

    B, H, C, N, E = 4, 6, 100, 700, 32
    g = torch.Generator().manual_seed(3)
    lens = torch.tensor(lengths, device="cuda")
    proj = [torch.randn(B, N, H * E, generator=g).cuda().bfloat16() for _ in range(2)]
    cent = torch.randn(B, H, C, E, generator=g).cuda().bfloat16()
    results = []
    for varlen in (False, True):
        monkeypatch.setattr(ops, "VARLEN_CENTROID_VALUES", varlen)
        leaves = [x.clone().requires_grad_() for x in (cent, *proj)]
        k, v = (x.view(B, N, H, E).transpose(1, 2) for x in leaves[1:])
        assert varlen_available(k, v)
        out = ops.fused_centroid_values(leaves[0], k, v, lens, E ** -0.5)
        out.float().square().sum().backward()
        results.append([out.detach().float(), *(x.grad.float() for x in leaves)])
    for name, got, want in zip(("values", "dcentroids", "dk", "dv"), *results[::-1]):
        scale = float(want.abs().max())
        torch.testing.assert_close(got, want, atol=2e-2 * scale, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_fused_centroid_attention_only_on_cuda_and_not_when_reference_is_forced(monkeypatch):
    assert not ops.fused_centroid_attention_applies(torch.zeros(1))  # CPU: the C++/reference op
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda")))
    assert ops.fused_centroid_attention_applies(torch.zeros(1, dtype=torch.bfloat16))
    assert not ops.fused_centroid_attention_applies(torch.zeros(1, dtype=torch.float64))
    monkeypatch.setenv(ops.KERNELS_ENV, "reference")
    assert not ops.fused_centroid_attention_applies(torch.zeros(1, dtype=torch.bfloat16))


def test_rows_keep_the_heads_inner_layout_of_projections():
    """``new_rows`` stores a heads-inner ``(B, H, N, D)`` as ``(B, N, H, D)`` (so merging the heads
    is a view), and ``heads_inner`` tells the head-split view of projections from contiguous rows."""
    from fastasr.kernels.rows import heads_inner, new_rows, unit_stride

    B, H, N, D = 2, 3, 5, 4
    split = torch.randn(B, N, H * D).view(B, N, H, D).transpose(1, 2)
    assert heads_inner(split) and not heads_inner(split.contiguous())
    assert not heads_inner(torch.randn(B, 1, N, D).transpose(1, 2).transpose(1, 2))  # one head: either
    rows = new_rows(B, H, N, 7, True, dtype=torch.float16, device="cpu", zero=True)
    assert rows.shape == (B, H, N, 7) and rows.dtype == torch.float16 and heads_inner(rows)
    assert rows.transpose(1, 2).is_contiguous() and float(rows.abs().sum()) == 0.0
    assert new_rows(B, H, N, 7, False, dtype=torch.float32, device="cpu").is_contiguous()
    assert unit_stride(split) is split
    strided = torch.randn(B, H, D, N).transpose(2, 3)
    assert unit_stride(strided).stride(-1) == 1 and torch.equal(unit_stride(strided), strided)


def test_profiled_ranges_appear_in_a_profile_and_cost_no_op_outside_one():
    """The attention's named ranges (``attention.hash_kmeans`` ...) are in a torch.profiler
    profile of a clustered call; without a profiler the call creates none (``record_function``
    would: a profiler op each, host time a range whether recorded or not)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.utils._python_dispatch import TorchDispatchMode

    from fastasr.attention import build_attention

    attn = build_attention("clustered-4", seed=0)
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    names: list[str] = []

    class _Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    with _Ops():
        attn(q, k, v)
    assert names and not any(n.startswith("profiler::") for n in names)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        attn(q, k, v)
    recorded = {e.name for e in prof.events()}
    assert {"attention.hash_kmeans", "attention.centroid_means", "attention.centroid_attention",
            "attention.broadcast"} <= recorded
