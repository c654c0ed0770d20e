"""The C++ CPU kernels (``fastasr.kernels.native``) against the PyTorch reference.

Hashing and K-means must be bit for bit the reference's; the products within 1e-4
(values) and 1e-3 (gradients) in float32. Sizes are odd on purpose: N, E, K not
multiples of any block or vector width, padded batches, an empty sequence, fewer
positions than clusters or than K. ``make install`` builds the kernels; a checkout
without them fails here, saying why (``FASTASR_NATIVE=0`` switches them off, and
then these tests skip).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from fastasr.attention import build_attention
from fastasr.kernels import native
from fastasr.kernels.clustering import ops, reference

pytestmark = pytest.mark.skipif(
    os.environ.get("FASTASR_NATIVE", "").strip() == "0", reason="FASTASR_NATIVE=0"
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _lengths(B: int, N: int, g: torch.Generator) -> torch.Tensor:
    lengths = torch.randint(1, N + 1, (B,), generator=g)
    lengths[0] = N
    return lengths


def test_the_kernels_are_built_and_load():
    assert native.unavailable_reason() is None, (
        f"C++ CPU kernels unavailable: {native.unavailable_reason()} "
        "(make install builds them; FASTASR_NATIVE=0 skips these tests)"
    )


@pytest.mark.parametrize("threads", [1, 2])
def test_kernels_run_on_every_torch_thread(threads):
    """parallel_items reaches torch.get_num_threads() threads (a build without -fopenmp: one)."""
    assert native.available(), native.unavailable_reason()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert torch.ops.fastasr_cpu.worker_threads(16) == threads
        assert torch.ops.fastasr_cpu.worker_threads(1) == 1
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------ clustering
@pytest.mark.parametrize(
    "B,H,N,E,bits,dtype",
    [(2, 3, 37, 20, 63, torch.float32), (1, 2, 130, 64, 13, torch.float32),
     (3, 1, 5, 9, 1, torch.float32), (2, 1, 19, 24, 40, torch.float64)],
)
def test_hash_codes_equal_reference(B, H, N, E, bits, dtype):
    g = _gen(N + E + bits)
    x = torch.randn(B, H, N, E, generator=g, dtype=dtype)
    planes = torch.randn(E + 1, bits, generator=g, dtype=dtype)
    lengths = _lengths(B, N, g)
    for lens in (lengths, None):
        assert torch.equal(native.hash_codes(x, planes, lens), reference.hash_codes(x, planes, lens))
    with pytest.raises(ValueError, match="bits"):
        native.hash_codes(x, torch.randn(E + 1, 64, dtype=dtype))


@pytest.mark.parametrize(
    "B,H,N,C,iterations,bits",
    [(2, 3, 37, 5, 3, 63), (2, 2, 100, 10, 10, 16), (3, 1, 7, 20, 2, 63),
     (1, 2, 150, 100, 2, 63), (2, 2, 90, 12, 4, 3), (2, 1, 50, 3, 0, 63), (1, 1, 16, 1, 3, 63)],
)
def test_kmeans_equals_reference(B, H, N, C, iterations, bits):
    """Including more clusters than positions, 3-bit codes (many ties), no iteration."""
    g = _gen(N + C + iterations + bits)
    lengths = _lengths(B, N, g)
    x = torch.randn(B, H, N, 16, generator=g)
    codes = reference.hash_codes(x, torch.randn(17, bits, generator=g), lengths)
    for lens in (lengths, None):
        want = reference.hamming_kmeans(codes, lens, C, iterations, bits=bits)
        got = native.hamming_kmeans(codes, lens, C, iterations, bits=bits)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_kmeans_empty_sequence_and_high_bits():
    g = _gen(3)
    codes = torch.randint(0, 2**62, (3, 2, 40), generator=g)
    lengths = torch.tensor([40, 0, 17])
    want = reference.hamming_kmeans(codes, lengths, 4, 3, bits=10)  # bits above 10 ignored
    got = native.hamming_kmeans(codes, lengths, 4, 3, bits=10)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert bool((got[0][1] == -1).all()) and int(got[1][1].sum()) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("N,k", [(1000, 32), (37, 7), (33, 33), (200, 1), (64, 40)])
def test_topk_indices_select_the_k_largest(N, k, dtype):
    g = _gen(N + k)
    scores = torch.randn(3, 5, N, generator=g, dtype=dtype)
    scores[0, 0, N // 2 :] = float("-inf")  # masked keys: never before a finite score
    scores[1, 0] = scores[1, 0].round()  # many ties, negative zeros among them
    scores[1, 1] = -scores[1, 1].abs()  # every score negative
    got = native.topk_indices(scores, k)
    assert got.shape == (3, 5, k) and got.dtype == torch.int64
    assert bool((got.sort(-1).values.diff(dim=-1) > 0).all())  # k distinct positions
    kept = scores.gather(-1, got)
    kth = scores.topk(k, dim=-1).values[..., -1:]
    assert bool((kept >= kth).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("N,k", [(1000, 32), (37, 7), (200, 1)])
def test_topk_indices_of_rows_holding_nan_lie_in_the_row(N, k, dtype):
    """A diverged step's NaN never passes a comparison, so such a row can leave fewer than k
    candidates: every index must still be a distinct position of the row (an index outside
    it crashed the process in the sparse part's gather)."""
    g = _gen(N * k)
    scores = torch.randn(4, N, generator=g, dtype=dtype)
    scores[0] = float("nan")  # the whole row
    scores[1, ::3] = float("nan")  # a third of it
    scores[2, : N // 2] = float("nan")
    scores[3, -1] = float("nan")
    got = native.topk_indices(scores, k)
    assert bool(((got >= 0) & (got < N)).all())
    assert bool((got.sort(-1).values.diff(dim=-1) > 0).all())  # k distinct positions
    finite = scores[3, :-1]  # one NaN: the top k of the rest
    assert set(got[3].tolist()) == set(finite.topk(k).indices.tolist())


def test_i_clustered_attention_of_nan_inputs_is_nan_not_a_crash():
    attention = build_attention({"name": "i-clustered", "clusters": 3, "topk": 4})
    g = _gen(5)
    q, k, v = (torch.randn(2, 2, 40, 8, generator=g, requires_grad=True) for _ in range(3))
    q.data[0] = float("nan")
    out = attention(q, k, v, torch.tensor([40, 31]))
    out.sum().backward()
    assert bool(out[0].isnan().any()) and bool(out[1].isfinite().all())


# ---------------------------------------------------------- centroid attention
def _centroid_case(B, H, C, N, E, Ev, K, g, dtype=torch.float32):
    lengths = _lengths(B, N, g)
    if B > 2:
        lengths[-1] = min(3, N)  # shorter than K: padded keys fill the top list
    cent = torch.randn(B, H, C, E, generator=g, dtype=dtype)
    k = torch.randn(B, H, N, E, generator=g, dtype=dtype)
    v = torch.randn(B, H, N, Ev, generator=g, dtype=dtype)
    return cent, k, v, lengths


def _centroid_run(impl, cent, k, v, lengths, K, g_val, g_keys):
    """Outputs and input gradients of a loss that does not depend on the top keys' order:
    ``g_keys (B, H, C, N)`` weighs each selected key's weight by its position."""
    leaves = [t.clone().requires_grad_() for t in (cent, k, v)]
    values, top_w, top_idx = impl(*leaves, lengths, 0.3, K)
    loss = (values * g_val).sum() + (top_w * g_keys.gather(-1, top_idx)).sum()
    return values, top_w, top_idx, torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("B,H,C,N,E,Ev,K", [(3, 2, 5, 37, 20, 24, 7), (2, 3, 9, 45, 32, 32, 32),
                                            (3, 1, 4, 30, 16, 8, 0)])
def test_centroid_attention_equals_reference(B, H, C, N, E, Ev, K):
    g = _gen(B * N + E + K)
    cent, k, v, lengths = _centroid_case(B, H, C, N, E, Ev, K, g)
    g_val = torch.randn(B, H, C, Ev, generator=g)
    g_keys = torch.randn(B, H, C, N, generator=g)
    want = _centroid_run(reference.centroid_attention, cent, k, v, lengths, K, g_val, g_keys)
    got = _centroid_run(native.centroid_attention, cent, k, v, lengths, K, g_val, g_keys)
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
    # the same valid keys (as sets; padded keys that fill the list of a short sequence
    # may differ), with the same weights at them
    order_got, order_want = got[2].sort(-1), want[2].sort(-1)
    valid = order_want.values < lengths[:, None, None, None]
    assert torch.equal(order_got.values[valid], order_want.values[valid])
    torch.testing.assert_close(got[1].gather(-1, order_got.indices)[valid],
                               want[1].gather(-1, order_want.indices)[valid], atol=1e-4, rtol=1e-4)
    assert bool((got[1].gather(-1, order_got.indices)[~valid] == 0).all())
    for name, a, b in zip(("centroids", "k", "v"), got[3], want[3]):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3, msg=lambda m, n=name: f"d{n}: {m}")


def test_centroid_attention_empty_sequence_is_finite():
    g = _gen(5)
    cent, k, v, _ = _centroid_case(2, 2, 3, 10, 8, 8, 4, g)
    lengths = torch.tensor([10, 0])
    values, top_w, _ = native.centroid_attention(cent, k, v, lengths, 0.3, 4)
    want = reference.centroid_attention(cent, k, v, lengths, 0.3, 4)
    assert bool(torch.isfinite(values).all()) and bool(torch.isfinite(top_w).all())
    torch.testing.assert_close(values, want[0], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------- sparse part
def _sparse_case(B, H, N, E, Ev, C, K, g, dtype=torch.float32):
    lengths = _lengths(B, N, g)
    lengths[-1] = min(lengths[-1], K - 1) if K > 1 else lengths[-1]  # shorter than K
    valid = torch.arange(N)[None, :] < lengths[:, None]
    q, k = (torch.randn(B, H, N, E, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(B, H, N, Ev, generator=g, dtype=dtype)
    assign = torch.randint(0, C, (B, H, N), generator=g)
    assign = torch.minimum(assign, (lengths - 1).clamp(min=0)[:, None, None]).masked_fill(
        ~valid[:, None, :], -1
    )
    logits = torch.randn(B, H, C, N, generator=g, dtype=dtype).masked_fill(
        ~valid[:, None, None, :], float("-inf")
    )
    top_idx = logits.topk(K, dim=-1).indices
    top_w = torch.softmax(logits, -1).gather(-1, top_idx)
    values = torch.randn(B, H, C, Ev, generator=g, dtype=dtype)
    return q, k, v, values, top_w, top_idx, assign, lengths


SPARSE_CASES = [
    # B, H, N, E, Ev, C, K
    (2, 2, 37, 20, 24, 5, 7),  # run-time sizes
    (3, 2, 45, 32, 32, 6, 32),  # the fixed-size path, K > the shortest length
    (2, 1, 70, 64, 64, 4, 20),  # fixed E = 64, K padded to 32 slots
    (2, 2, 30, 32, 32, 40, 8),  # more clusters than positions
]


@pytest.mark.parametrize("B,H,N,E,Ev,C,K", SPARSE_CASES)
def test_improved_sparse_and_gradients_equal_reference(B, H, N, E, Ev, C, K):
    g = _gen(B * N + E + C + K)
    case = _sparse_case(B, H, N, E, Ev, C, K, g)
    grad = torch.randn(B, H, N, Ev, generator=g)
    results = []
    for impl in (reference.improved_sparse, native.improved_sparse):
        leaves = [t.clone().requires_grad_() for t in case[:5]]
        out = impl(*leaves, *case[5:], 0.25)
        results.append((out, torch.autograd.grad((out * grad).sum(), leaves)))
    (want, want_g), (got, got_g) = results
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    padded = case[6] < 0
    assert bool((got[padded] == 0).all())
    for name, a, b in zip(("q", "k", "v", "values", "top_w"), got_g, want_g):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3, msg=lambda m, n=name: f"d{n}: {m}")


def test_improved_sparse_float64_gradcheck():
    g = _gen(8)
    case = _sparse_case(2, 1, 9, 3, 4, 2, 4, g, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in case[:5]]
    assert torch.autograd.gradcheck(
        lambda *x: native.improved_sparse(*x, *case[5:], 0.5), leaves
    )


def test_improved_sparse_noncontiguous_and_half_inputs():
    g = _gen(9)
    q, k, v, values, top_w, top_idx, assign, lengths = _sparse_case(2, 3, 25, 16, 16, 4, 6, g)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)
    want = reference.improved_sparse(q, k, v, values, top_w, top_idx, assign, lengths, 0.25)
    got = native.improved_sparse(qt, k, v, values, top_w, top_idx, assign, lengths, 0.25)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    half = [t.bfloat16() for t in (q, k, v, values)]
    out = native.improved_sparse(*half, top_w, top_idx, assign, lengths, 0.25)
    assert out.dtype == torch.bfloat16


# ------------------------------------------------------------------ end to end
@pytest.mark.parametrize("spec", ["clustered-6", "i-clustered-6"])
def test_attention_native_equals_reference(spec, monkeypatch):
    """Every op of the variant on the C++ kernels vs on the reference; N = 45, padded."""
    g = _gen(21)
    B, H, N, E = 3, 2, 45, 16
    q, k, v = (torch.randn(B, H, N, E, generator=g) for _ in range(3))
    lengths = torch.tensor([45, 30, 4])
    grad = torch.randn(B, H, N, E, generator=g)
    results = {}
    for backend in ("reference", "native"):
        monkeypatch.setenv(ops.KERNELS_ENV, backend)
        attn = build_attention(spec, **({"topk": 12} if spec.startswith("i-") else {}), bits=31,
                               iterations=4, seed=3)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = attn(*leaves, lengths)
        results[backend] = (out, *torch.autograd.grad(out, leaves, grad))
    ref, got = results["reference"], results["native"]
    torch.testing.assert_close(got[0], ref[0], atol=1e-4, rtol=1e-4)
    for name, a, b in zip("qkv", got[1:], ref[1:]):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3, msg=lambda m, n=name: f"d{n}: {m}")


# ---------------------------------------------------------------- availability
def test_missing_library_falls_back_once_with_a_warning(monkeypatch):
    monkeypatch.setattr(native, "_load", lambda: "they are not built (test)")
    native._warn_once.cache_clear()
    monkeypatch.delenv(ops.KERNELS_ENV, raising=False)
    x = torch.zeros(1, 1, 2, 3)
    with pytest.warns(RuntimeWarning, match="not built.*make install"):
        assert ops.kernel_backend(x, "hamming_kmeans") == "reference"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second time: no warning
        assert ops.kernel_backend(x, "hamming_kmeans") == "reference"
    monkeypatch.setenv(ops.KERNELS_ENV, "native")
    with pytest.raises(native.NativeUnavailableError, match="not built.*make install"):
        ops.hash_codes(x, torch.zeros(4, 8))
    native._warn_once.cache_clear()


def test_stale_or_foreign_builds_are_refused(monkeypatch):
    monkeypatch.setattr(native, "_source_hash", lambda: "0" * 64)
    assert "older sources" in native._stale_reason()
    monkeypatch.undo()
    monkeypatch.setattr(native, "_cpu_features", lambda: ["fpu"])
    reason = native._stale_reason()
    assert reason is not None and "features this one lacks" in reason


def test_a_rebuild_replaces_the_library_and_never_rewrites_it(monkeypatch, tmp_path):
    """A process that has the library mapped (a training run beside `make install`) keeps the
    old file: the build renames a new one over it, so the old one's inode and bytes stay intact
    (rewriting it in place would crash that process with SIGBUS)."""
    import torch.utils.cpp_extension as cpp

    library, stamp = tmp_path / "fastasr_cpu.so", tmp_path / "fastasr_cpu.json"
    library.write_bytes(b"old library")
    stamp.write_text("{}")

    def fake_load(name, build_directory, **_):
        out = Path(build_directory) / f"{name}.so"
        out.write_bytes(b"new library")
        return str(out)

    monkeypatch.setattr(cpp, "load", fake_load)
    monkeypatch.setattr(native, "BUILD_DIR", tmp_path)
    monkeypatch.setattr(native, "LIBRARY", library)
    monkeypatch.setattr(native, "STAMP", stamp)
    with library.open("rb") as held:  # as a running process holds it
        old_inode = os.fstat(held.fileno()).st_ino
        assert native.build() == library
        assert held.read() == b"old library"  # the holder still reads the old bytes
    assert library.read_bytes() == b"new library" and library.stat().st_ino != old_inode
    assert json.loads(stamp.read_text())["source_sha256"] == native._source_hash()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fastasr_cpu.json", "fastasr_cpu.so"]  # no leftovers
    native._load.cache_clear()


def test_dispatch_picks_native_on_cpu(monkeypatch):
    monkeypatch.delenv(ops.KERNELS_ENV, raising=False)
    x = torch.zeros(1)
    assert ops.kernel_backend(x, "hamming_kmeans") == "native"
    assert ops.kernel_backend(x, "clustered_dot") == "reference"  # no C++ twin: fused instead
    monkeypatch.setenv(ops.KERNELS_ENV, "reference")
    assert ops.kernel_backend(x, "hamming_kmeans") == "reference"
