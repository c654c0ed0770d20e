"""Padding: padded positions never influence valid ones, never get weight, stay finite."""

from __future__ import annotations

import pytest
import torch

from fastasr.attention import build_attention

B, H, N, E = 4, 2, 24, 8
LENGTHS = torch.tensor([24, 13, 3, 1])  # 3 and 1 are shorter than k (4, 8) and than C (6)

VARIANTS = {
    "full": lambda: build_attention("full"),
    "topk-4": lambda: build_attention("topk-4", chunk=10),  # chunk < N: several query chunks
    "topk-64": lambda: build_attention("topk-64"),
    "clustered-6": lambda: build_attention("clustered-6", seed=1),
    "i-clustered-6": lambda: build_attention("i-clustered-6", topk=8, seed=1),
    "lsh-2": lambda: build_attention("lsh-2", chunk=4, buckets=4, seed=1),
}


def _inputs(seed=0, n=N, batch=B):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, H, n, E, generator=g) for _ in range(3)]


def _call(attn, q, k, v, lengths=None):
    if attn.requires_shared_qk:
        k = q
    return attn(q, k, v, lengths)


def _dense(attn, q, k, lengths=None):
    return attn.dense_weights(q, q if attn.requires_shared_qk else k, lengths)


def _garbage_padding(x, length, value):
    x = x.clone()
    x[:, :, length:] = value
    return x


@pytest.mark.parametrize("name", list(VARIANTS))
def test_valid_outputs_are_bitwise_independent_of_batch_and_padding_content(name):
    attn = VARIANTS[name]()
    q, k, v = _inputs()
    out = _call(attn, q, k, v, LENGTHS)
    g = torch.Generator().manual_seed(9)
    for b, length in enumerate(LENGTHS.tolist()):
        qb, kb, vb = (x[b : b + 1] for x in (q, k, v))
        noise = 100 * torch.randn(1, H, N, E, generator=g)
        qb = torch.where(torch.arange(N)[:, None] < length, qb, noise)
        kb = _garbage_padding(kb, length, 1e3)
        vb = _garbage_padding(vb, length, 1e4)
        alone = _call(attn, qb, kb, vb, LENGTHS[b : b + 1])
        assert torch.equal(alone[:, :, :length], out[b : b + 1, :, :length]), (
            f"{name}: sequence {b}"
        )


@pytest.mark.parametrize("name", list(VARIANTS))
def test_valid_outputs_match_the_unpadded_sequence_alone(name):
    """Against the sequence cut to its length: equal up to float rounding (BLAS picks
    different kernels for different N, so not bitwise for full/top-k)."""
    attn = VARIANTS[name]()
    q, k, v = _inputs(1)
    out = _call(attn, q, k, v, LENGTHS)
    for b, length in enumerate(LENGTHS.tolist()):
        alone = _call(attn, *(x[b : b + 1, :, :length] for x in (q, k, v)))
        torch.testing.assert_close(alone, out[b : b + 1, :, :length], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_padded_keys_get_zero_weight_and_padded_queries_zero_rows(name):
    attn = VARIANTS[name]()
    q, k, v = _inputs(2)
    w = _dense(attn, q, k, LENGTHS)
    assert w.shape == (B, H, N, N)
    for b, length in enumerate(LENGTHS.tolist()):
        assert bool((w[b, :, :, length:] == 0).all()), (
            f"{name}: padded keys of sequence {b} got weight"
        )
        assert bool((w[b, :, length:, :] == 0).all()), (
            f"{name}: padded queries of sequence {b} got weights"
        )
        torch.testing.assert_close(
            w[b, :, :length].sum(-1), torch.ones(H, length), atol=1e-5, rtol=0
        )
    # forward applies exactly these weights
    torch.testing.assert_close(_call(attn, q, k, v, LENGTHS), w @ v, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_padded_outputs_are_zero_and_finite_with_huge_padding(name):
    attn = VARIANTS[name]()
    q, k, v = _inputs(3)
    mask = torch.arange(N)[None, None, :, None] >= LENGTHS[:, None, None, None]
    q = torch.where(mask, 1e4, q)
    k = torch.where(mask, -1e4, k)
    v = torch.where(mask, 1e6, v)
    out = _call(attn, q, k, v, LENGTHS)
    assert bool(torch.isfinite(out).all())
    assert bool((out.masked_select(mask) == 0).all())
    assert float(out.masked_select(~mask).abs().max()) < 10  # no 1e6 value leaked in


@pytest.mark.parametrize("name", list(VARIANTS))
def test_empty_sequence_gives_zeros_and_finite_gradients(name):
    attn = VARIANTS[name]()
    q, k, v = (x.requires_grad_() for x in _inputs(4, batch=2))
    lengths = torch.tensor([N, 0])
    out = _call(attn, q, k, v, lengths)
    assert bool((out[1] == 0).all()) and bool(torch.isfinite(out).all())
    out.square().sum().backward()
    for t in (q, k, v):
        if t.grad is not None:
            assert bool(torch.isfinite(t.grad).all())
            assert bool((t.grad[1] == 0).all())


@pytest.mark.parametrize("name", ["clustered-6", "i-clustered-6"])
def test_padded_queries_are_never_clustered_with_valid_ones(name):
    attn = VARIANTS[name]()
    q, k, _ = _inputs(5)
    q = torch.where(
        torch.arange(N)[None, None, :, None] >= LENGTHS[:, None, None, None], q[:, :, :1], q
    )
    ca = attn.centroid_attention(q, k, LENGTHS)
    for b, length in enumerate(LENGTHS.tolist()):
        assert bool((ca.assignments[b, :, length:] == -1).all())
        assert bool((ca.assignments[b, :, :length] >= 0).all())
        assert ca.counts[b].sum(-1).tolist() == [length] * H
        # a sequence shorter than C uses at most `length` clusters
        assert int((ca.counts[b] > 0).sum(-1).max()) <= min(length, attn.clusters)


def test_i_clustered_never_lets_padded_keys_into_the_topk_softmax():
    """The bug of the paper's reference code: with a sequence shorter than topk, the
    per-query softmax over the centroid's top keys included padded keys. Here the
    padded keys are made maximally attractive; the result must still be full
    attention over the valid keys (topk >= length)."""
    g = torch.Generator().manual_seed(6)
    n, length = 40, 5
    q, k, v = (torch.randn(1, H, n, E, generator=g) for _ in range(3))
    k = torch.where(torch.arange(n)[:, None] >= length, 50 * q.mean(2, keepdim=True), k)
    v = _garbage_padding(v, length, 100.0)
    lengths = torch.tensor([length])
    attn = build_attention("i-clustered-3", topk=32, seed=0)  # 5 <= topk < n
    out = attn(q, k, v, lengths)[:, :, :length]
    full = build_attention("full")(*(x[:, :, :length] for x in (q, k, v)))
    torch.testing.assert_close(out, full, atol=1e-5, rtol=1e-5)
    w = attn.dense_weights(q, k, lengths)
    assert bool((w[..., length:] == 0).all())
    # the inputs are adversarial: letting padded keys in would change the result a lot
    leaky = torch.softmax(q @ k.transpose(-1, -2) / E**0.5, -1) @ v
    assert float((leaky[:, :, :length] - full).abs().max()) > 10


def test_packed_full_attention_equals_the_masked_kernel():
    """The padding-free path (jagged nested tensors: what a GPU runs, so that SDPA can use
    FlashAttention) against SDPA with a key-padding mask: values, gradients, a sequence of
    length 0, and one packing shared by the calls that get the same lengths tensor."""
    from fastasr.attention import full

    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(3, H, N, E, generator=g, requires_grad=True) for _ in range(3))
    lengths = torch.tensor([N, 0, 7])
    grad = torch.randn(3, H, N, E, generator=g)
    packed = full.packed_attention(q, k, v, lengths)
    masked = build_attention("full")(q, k, v, lengths)  # CPU: the masked flash kernel
    torch.testing.assert_close(packed, masked, atol=1e-6, rtol=1e-5)
    assert bool((packed[1] == 0).all()) and bool((packed[2, :, 7:] == 0).all())
    want = torch.autograd.grad(masked, (q, k, v), grad)
    got = torch.autograd.grad(full.packed_attention(q, k, v, lengths), (q, k, v), grad)
    for name, a, b in zip("qkv", got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"d{n}: {m}")
    first = full._Packing.of(lengths, N, q.device)
    assert full._Packing.of(lengths, N, q.device) is first  # the layers of a forward share it
    assert full._Packing.of(lengths.clone(), N, q.device) is not first


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-6), (torch.bfloat16, 2e-2)])
def test_dense_full_attention_equals_the_masked_kernel(dtype, tol):
    """The unpadded kernel on the padded batch, padding pushed out by appended feature columns
    (``dense``): values and gradients equal SDPA with a key mask (computed in float32), with a
    sequence of length 0, one of length N, padded keys that would dominate if let in (50x the
    norm, aligned with the queries), heads of another width than the values'; padded rows 0,
    and the forced path is the one :class:`FullAttention` takes."""
    from fastasr.attention import full

    g = torch.Generator().manual_seed(11)
    q, k = (torch.randn(3, H, N, E, generator=g) for _ in range(2))
    v = torch.randn(3, H, N, E + 4, generator=g)
    lengths = torch.tensor([N, 0, 7])
    k[2, :, 7:] = 50 * q[2, :, 7:].mean(1, keepdim=True)  # adversarial padding
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    grad = torch.randn(3, H, N, E + 4, generator=g)
    got = full.dense_attention(*leaves, lengths)
    assert got.dtype == dtype and got.shape == v.shape
    assert bool((got[1] == 0).all()) and bool((got[2, :, 7:] == 0).all())
    ref = [t.detach().float().requires_grad_() for t in leaves]
    want = full.masked_attention(*ref, lengths)
    assert float((want - full.masked_attention(*ref, lengths.new_full((3,), N))).abs().max()) > 1  # it matters
    rel = float((got.float() - want).norm() / want.norm())
    assert rel < tol, rel
    got_grads = torch.autograd.grad((got.float() * grad).sum(), leaves)
    want_grads = torch.autograd.grad((want * grad).sum(), ref)
    for name, a, b in zip("qkv", got_grads, want_grads):
        assert float((a.float() - b).norm() / b.norm()) < tol, name
    with full.forced_padded_path("dense"), torch.no_grad():
        expect = (full.dense_attention(*(t.float() for t in leaves), lengths).to(dtype)
                  if full.attends_in_float32(leaves[0]) else got)  # a CPU's short half-precision batch
        assert torch.equal(build_attention("full")(*leaves, lengths), expect)


def test_lengths_on_a_device_are_checked_without_a_host_sync():
    """A host synchronisation (bool(), .item(), .tolist()) fails on the meta device; the
    check must instead be a device-side assertion. CPU lengths still raise at once."""
    from fastasr.attention.masking import check_lengths

    meta = torch.tensor([5, 3], device="meta")
    assert check_lengths(meta, 2, 5).device.type == "meta"
    with pytest.raises(ValueError, match=r"lie in \[0, 5\]"):
        check_lengths(torch.tensor([6, 3]), 2, 5)


@pytest.mark.parametrize("name", sorted(VARIANTS) + ["auto"])
def test_every_attention_runs_under_inference_mode(name):
    """Lightning tests and fastasr decodes under ``torch.inference_mode()``, where tensors keep
    no version counter: every variant gives there what it gives under ``no_grad``."""
    attn = build_attention("auto", crossover=8, crossover_no_grad=8, seed=1) if name == "auto" \
        else VARIANTS[name]()
    q, k, v = _inputs(seed=3)
    with torch.no_grad():
        want = _call(attn, q, k, v, LENGTHS)
    with torch.inference_mode():
        lengths = LENGTHS.clone()  # an inference tensor, as a batch's lengths are when testing
        got = _call(attn, q, k, v, lengths)
    torch.testing.assert_close(got, want)


def test_packed_full_attention_runs_under_inference_mode():
    """The packed path (a GPU's for long fp32 batches) caches its packing on the lengths
    tensor; an inference tensor has no version to key it on, and must still pack."""
    from fastasr.attention import full

    q, k, v = _inputs(seed=4)
    want = full.masked_attention(q, k, v, LENGTHS)
    with torch.inference_mode():
        lengths = LENGTHS.clone()
        first = full.packed_attention(q, k, v, lengths)
        second = full.packed_attention(q, k, v, lengths)  # the layers of one forward share it
    torch.testing.assert_close(first, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(second, want, atol=1e-6, rtol=1e-5)


def test_full_attention_path_per_device_dtype_and_length():
    """The measured choice (benchmarks/gpu/notes.md "Decisions"): CPU key mask; on a GPU in half
    precision the key mask below dense_from (2,048), dense below varlen_from (32,768), varlen
    from there (dense where varlen cannot run); in fp32 the key mask below pack_from and
    packing from it. (Decided on meta tensors.)"""
    from fastasr.attention.full import padded_path, varlen_attn

    def x(device, dtype, n, e=32):
        return torch.empty(2, 3, n, e, device=device, dtype=dtype)

    assert padded_path(x("cpu", torch.float32, 70000), x("cpu", torch.float32, 70000)) == "mask"
    assert padded_path(x("cpu", torch.bfloat16, 800), x("cpu", torch.bfloat16, 800)) == "mask"
    if torch.cuda.is_available():
        pytest.skip("the CUDA rows are decided on meta tensors where no GPU is visible")
    from unittest import mock

    with mock.patch.object(torch.Tensor, "device", property(lambda self: torch.device("cuda"))):
        q32 = x("meta", torch.float32, 800)
        assert padded_path(q32, q32) == "mask"
        big = x("meta", torch.float32, 8192)
        assert padded_path(big, big) == "packed"
        assert padded_path(big, big, None) == "mask"
        for dtype in (torch.bfloat16, torch.float16):
            for n, path in ((800, "mask"), (2047, "mask"), (2048, "dense"), (16384, "dense"),
                            (32768, "varlen" if varlen_attn is not None else "dense"), (65536, "varlen" if varlen_attn is not None else "dense")):
                half = x("meta", dtype, n)
                assert padded_path(half, half) == path, (dtype, n)
        long = x("meta", torch.bfloat16, 32768)
        odd = x("meta", torch.bfloat16, 32768, e=20)  # flash needs head sizes that are multiples of 8
        assert padded_path(odd, odd) == "dense"
        assert padded_path(long, long, dense_from=None) == "mask"
        assert padded_path(long, long, varlen_from=None) == "dense"
        assert padded_path(x("meta", torch.bfloat16, 800), x("meta", torch.bfloat16, 800), dense_from=512) == "dense"


def test_full_attention_on_a_cpu_attends_short_half_precision_batches_in_float32(monkeypatch):
    from fastasr.attention import full

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 24, 8, generator=g).bfloat16().requires_grad_() for _ in range(3))
    lengths = torch.tensor([24, 17, 9])
    attn = build_attention("full")
    assert full.attends_in_float32(q) and not full.attends_in_float32(q.float())
    out = attn(q, k, v, lengths)
    assert out.dtype == torch.bfloat16
    # below the bound: the float32 kernel on the cast inputs, the output cast back
    expected = full.masked_attention(q.float(), k.float(), v.float(), lengths).bfloat16()
    assert torch.equal(out, expected)
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad.float()).all()
    # from the bound on: bfloat16 as given (no lengths: the unpadded call alike)
    monkeypatch.setattr(full, "CPU_HALF_IN_FLOAT32_BELOW", 24)
    assert not full.attends_in_float32(q)
    with torch.no_grad():
        assert torch.equal(attn(q, k, v, lengths), full.masked_attention(q, k, v, lengths))
        assert torch.equal(attn(q, k, v), torch.nn.functional.scaled_dot_product_attention(q, k, v))
