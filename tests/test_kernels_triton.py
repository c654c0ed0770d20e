"""The Triton kernels against the PyTorch reference (``fastasr.kernels.clustering.reference``).

Runs on the CPU through the Triton interpreter. ``TRITON_INTERPRET=1`` must be set
before Triton is first imported (``triton.jit`` fixes each function's mode, Triton's
own library included, when it decorates it), so this module sets it at import unless
the caller already chose or Triton is already loaded. With ``TRITON_INTERPRET=0`` on a
CUDA machine the same tests run the compiled kernels on the GPU.

In a full test session another module may import Triton first, compiled (``import
lightning`` does). The kernels cannot be interpreted in that process, so the kernel
tests here skip and ``test_kernel_tests_in_fresh_process`` runs them in a child
process where this module comes first. The variable, once set, stays set: Triton
imports parts of itself lazily and checks it again then. It does not change which
implementation ``fastasr.kernels.clustering.ops`` picks (only ``FASTASR_KERNELS`` does).

Sizes are small and odd on purpose: lengths not divisible by the block sizes, padded
batches, more clusters than positions, ``K`` larger than a sequence's length.
"""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

if "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton and the kernels load

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from kernel_fixtures import clustered_codes  # noqa: E402

from fastasr.kernels import availability  # noqa: E402
from fastasr.kernels.clustering import reference  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    """Import a kernel module (``clustering.triton_topk``); re-import it if it was first built in the other mode."""
    module = importlib.import_module(f"fastasr.kernels.{name}")
    kernel = next(v for k, v in vars(module).items() if k.startswith("_") and k.endswith("_kernel"))
    if availability.kernels_interpreted(kernel) != availability.interpreter_requested():
        module = importlib.reload(module)
    return module


th = _load("clustering.triton_hashing")
tk = _load("clustering.triton_kmeans")
tc = _load("clustering.triton_clustered")
tt = _load("clustering.triton_topk")
tcen = _load("clustering.triton_centroid")
tb = _load("clustering.triton_broadcast")
ti = importlib.import_module("fastasr.kernels.clustering.triton_improved")  # no kernel of its own: it calls tcen's and tc's

INTERPRETED = availability.kernels_interpreted(th._hash_kernel)
DEVICE = "cpu" if INTERPRETED else "cuda"
#: Why the kernels cannot run in this process (None: they can).
NOT_HERE = availability.unavailable_reason(DEVICE, INTERPRETED)
# Tests that need no kernel launch in this process.
_ANY_PROCESS = {
    "test_kernel_tests_in_fresh_process",
    "test_unavailable_without_cuda_or_interpreter_says_why",
    "test_unavailable_without_triton_says_why",
    "test_ops_dispatch_rules",
    "test_availability_decides_by_interpreter_state_and_compute_capability",
}


@pytest.fixture(autouse=True)
def _kernels_runnable_here(request):
    if NOT_HERE is not None and request.node.originalname not in _ANY_PROCESS:
        pytest.skip(f"Triton kernels cannot run in this process ({NOT_HERE}); "
                    "the slow test_kernel_tests_in_fresh_process runs them (make test-full, CI)")


@pytest.mark.slow
@pytest.mark.timeout(1260)
def test_kernel_tests_in_fresh_process():
    """When Triton was loaded compiled before this module, run the kernel tests in a child."""
    if NOT_HERE is None:
        pytest.skip("the kernel tests ran in this process")
    env = {k: v for k, v in os.environ.items() if k != "FASTASR_KERNELS"}
    env["TRITON_INTERPRET"] = "1"
    deselect = "not fresh_process"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider", "-k", deselect,
         "-m", "slow or not slow"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " skipped" not in proc.stdout.splitlines()[-1], proc.stdout[-2000:]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _lengths(B: int, N: int, g: torch.Generator, full_first: bool = True) -> torch.Tensor:
    lengths = torch.randint(1, N + 1, (B,), generator=g)
    if full_first:
        lengths[0] = N
    return lengths


def _dev(*tensors):
    return [t.to(DEVICE) for t in tensors]


# ------------------------------------------------------------------ the interpreter
@triton.jit
def _sums_kernel(x_ptr, out_ptr, STEPS: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, 8))
    total = 0.0
    for _ in range(STEPS):
        total += tl.sum(x, 0)  # a device call (tl.sum is a @triton.jit function) a step
    tl.store(out_ptr, total)


def test_the_interpreter_patches_the_language_once_a_module_a_launch(monkeypatch):
    """``availability.prepare_interpreter``: a launch maps ``triton.language`` onto the
    interpreter's operations once for the kernel's module and once for Triton's library, not
    again at each device call: the same patching whether the kernel sums 2 or 20 times, and
    the sums right."""
    if not INTERPRETED:
        pytest.skip("the interpreter's patching: the kernels run compiled here")
    from triton.runtime import interpreter

    patched = []
    real = interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin", lambda pkg, *a: (patched.append(pkg), real(pkg, *a))[1])
    x = torch.arange(8, dtype=torch.float32)
    _sums_kernel[(1,)](x, torch.zeros(1), STEPS=1)  # the first call of a device function rewrites it
    counts = []
    for steps in (2, 20):
        out = torch.zeros(1)
        patched.clear()
        _sums_kernel[(1,)](x, out, STEPS=steps)
        assert out.item() == steps * 28.0
        counts.append(len(patched))
    assert counts[0] == counts[1] > 0, counts


# ------------------------------------------------------------------ hashing
@pytest.mark.parametrize(
    "B,H,N,E,bits,dtype,padded",
    [
        (2, 3, 37, 20, 63, torch.float32, True),  # N, E not multiples of the blocks
        (1, 2, 130, 64, 13, torch.float32, False),  # several N blocks
        (3, 1, 5, 96, 1, torch.float32, True),  # several E chunks, one bit
        (2, 2, 33, 32, 63, torch.float16, True),
        (2, 2, 33, 32, 63, torch.bfloat16, True),
        (2, 1, 19, 24, 40, torch.float64, True),
    ],
)
def test_hash_codes_equal_reference(B, H, N, E, bits, dtype, padded):
    g = _gen(N * E + bits)
    x = torch.randn(B, H, N, E, generator=g).to(dtype)
    planes = torch.randn(E + 1, bits, generator=g, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    lengths = _lengths(B, N, g) if padded else None
    expected = reference.hash_codes(x, planes, lengths)
    got = th.hash_codes(*_dev(x, planes), None if lengths is None else lengths.to(DEVICE))
    assert got.dtype == torch.int64 and got.shape == (B, H, N)
    assert torch.equal(got.cpu(), expected)


def test_hash_codes_noncontiguous_input_and_offsets_only():
    g = _gen(5)
    x = torch.randn(2, 29, 3, 16, generator=g).transpose(1, 2)  # (B, H, N, E) view of (B, N, H, E)
    planes = torch.randn(17, 63, generator=g)
    lengths = torch.tensor([29, 11])
    assert torch.equal(th.hash_codes(*_dev(x, planes, lengths)).cpu(), reference.hash_codes(x, planes, lengths))
    # Zero vectors: only the offset row decides (bits 0 and 2 set); padding is 0.
    planes = torch.zeros(5, 3)
    planes[4] = torch.tensor([1.0, -1.0, 2.0])
    codes = th.hash_codes(*_dev(torch.zeros(1, 1, 3, 4), planes, torch.tensor([2])))
    assert codes.cpu().tolist() == [[[0b101, 0b101, 0]]]


def test_hash_codes_rejects_bad_shapes():
    with pytest.raises(ValueError, match="bits"):
        th.hash_codes(*_dev(torch.zeros(1, 1, 2, 3), torch.zeros(4, 64)))
    with pytest.raises(ValueError, match="E \\+ 1"):
        th.hash_codes(*_dev(torch.zeros(1, 1, 2, 3), torch.zeros(3, 8)))


# ------------------------------------------------------------------ K-means
def _codes(B, H, N, bits, g, lengths):
    x = torch.randn(B, H, N, 16, generator=g)
    return reference.hash_codes(x, torch.randn(17, bits, generator=g), lengths)


@pytest.mark.parametrize(
    "B,H,N,C,iterations,bits,padded",
    [
        (2, 3, 37, 5, 3, 63, True),
        pytest.param(2, 2, 100, 10, 10, 16, True, marks=pytest.mark.slow),  # ~5 s interpreted
        (3, 1, 7, 20, 2, 63, True),  # more clusters than positions
        (1, 2, 150, 100, 2, 63, False),  # C over one BLOCK_C chunk
        (2, 2, 90, 12, 4, 3, True),  # 3 bits: many equal codes, many distance ties
        (2, 1, 50, 3, 0, 63, True),  # no Lloyd iteration: initial centroids only
        (1, 1, 16, 1, 3, 63, False),  # one cluster
        (1, 2, 300, 200, 2, 63, True),  # the largest centroid tile (256)
        (1, 1, 400, 300, 2, 63, False),  # C over MAX_CLUSTERS: the reference on the device
    ],
)
def test_kmeans_equals_reference(B, H, N, C, iterations, bits, padded):
    g = _gen(N + C + iterations + bits)
    lengths = _lengths(B, N, g) if padded else None
    codes = _codes(B, H, N, bits, g, lengths)
    ref_a, ref_c = reference.hamming_kmeans(codes, lengths, C, iterations, bits=bits)
    got_a, got_c = tk.hamming_kmeans(
        codes.to(DEVICE), None if lengths is None else lengths.to(DEVICE), C, iterations, bits=bits
    )
    assert got_a.dtype == torch.int64 and got_c.dtype == torch.int64
    assert torch.equal(got_a.cpu(), ref_a)
    assert torch.equal(got_c.cpu(), ref_c)


@pytest.mark.slow
@pytest.mark.parametrize("spans", [1, 4])
def test_kmeans_several_programs_per_sequence_and_empty_sequence(spans):
    """All iterations in one launch (1 span) and spans shorter than the sequence (several
    programs add into one centroid, one launch pair per iteration); a length-0 sequence."""
    g = _gen(11)
    lengths = torch.tensor([200, 0, 77])
    codes = _codes(3, 2, 200, 63, g, lengths)
    ref_a, ref_c = reference.hamming_kmeans(codes, lengths, 7, 5)
    got_a, got_c = tk.hamming_kmeans(*_dev(codes, lengths), 7, 5, spans=spans)
    assert torch.equal(got_a.cpu(), ref_a) and torch.equal(got_c.cpu(), ref_c)
    assert bool((got_a[1] == -1).all()) and int(got_c[1].sum()) == 0


def test_launch_arithmetic_is_tritons_without_its_constexpr_wrapper():
    """``fastasr.kernels.grid``: the launchers' ``cdiv`` and ``next_power_of_2`` give Triton's
    values (its host calls cost ~2 µs each through the constexpr wrapper)."""
    from fastasr.kernels import grid

    for n in range(-3, 5000):
        assert grid.next_power_of_2(n) == triton.next_power_of_2(n), n
    for a in range(-70, 3000, 7):
        for b in (1, 2, 16, 64, 96, 4096):
            assert grid.cdiv(a, b) == triton.cdiv(a, b), (a, b)
    assert (grid.cdiv(65536, 64), grid.next_power_of_2(100), grid.next_power_of_2(128)) == (1024, 128, 128)
    device = torch.device(DEVICE)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    assert grid.multiprocessors(device) == sms


def test_kmeans_one_launch_tile_by_length():
    """One-launch sweeps take the measured tiles (64 positions below WIDE_TILE_FROM, 128 from
    there), split sweeps 32; a sequence over WIDE_TILE_FROM, one launch, equals the reference."""
    assert tk.lloyd_tile(100, True, 800)["BLOCK_N"] == 64
    assert tk.lloyd_tile(100, True, tk.WIDE_TILE_FROM)["BLOCK_N"] == 128
    assert tk.lloyd_tile(100, False, 16384)["BLOCK_N"] == tk.BLOCK_N == 32
    assert tk.lloyd_tile(256, True, 4096)["num_warps"] == 8  # the wide centroid tile
    g = _gen(13)
    N = tk.WIDE_TILE_FROM + 77
    lengths = torch.tensor([N, N - 200])
    codes = _codes(2, 1, N, 63, g, lengths)
    ref_a, ref_c = reference.hamming_kmeans(codes, lengths, 6, 2)
    got_a, got_c = tk.hamming_kmeans(*_dev(codes, lengths), 6, 2, spans=1)
    assert torch.equal(got_a.cpu(), ref_a) and torch.equal(got_c.cpu(), ref_c)


@pytest.mark.parametrize(
    "B,H,N,C,iterations,bits,spans,lengths",
    [
        (2, 2, 70, 6, 3, 63, 1, [70, 41]),  # one launch: its first sweep reads what it wrote
        (3, 2, 200, 7, 5, 63, 4, [200, 0, 77]),  # split: the first launch writes, the later read
        (1, 2, 90, 5, 0, 63, 2, [90]),  # split, no iteration: the final assignment writes
        (2, 1, 60, 9, 3, 3, 1, [60, 23]),  # 3 bits: ties broken as the reference's
    ],
)
def test_kmeans_stored_signs_equal_the_reference(B, H, N, C, iterations, bits, spans, lengths):
    """With stored signs (the one launch's default) the sweeps read the codes' signs from the
    scratch the first launch writes, and without (the split's) they unpack the codes: the
    reference's assignments and counts either way, one launch or split."""
    g = _gen(N + C + bits)
    lengths = torch.tensor(lengths)
    codes = _codes(B, H, N, bits, g, lengths)
    ref_a, ref_c = reference.hamming_kmeans(codes, lengths, C, iterations, bits=bits)
    for stored in (None, True, False):
        got_a, got_c = tk.hamming_kmeans(*_dev(codes, lengths), C, iterations, bits=bits, spans=spans,
                                         stored_signs=stored)
        assert torch.equal(got_a.cpu(), ref_a) and torch.equal(got_c.cpu(), ref_c), stored


def test_kmeans_ignores_bits_above_bits_and_validates():
    g = _gen(12)
    codes = torch.randint(0, 2**62, (1, 2, 40), generator=g)
    ref = reference.hamming_kmeans(codes, None, 4, 3, bits=10)
    got = tk.hamming_kmeans(codes.to(DEVICE), None, 4, 3, bits=10)
    assert torch.equal(got[0].cpu(), ref[0]) and torch.equal(got[1].cpu(), ref[1])
    with pytest.raises(ValueError, match="clusters"):
        tk.hamming_kmeans(codes.to(DEVICE), None, 0, 3)
    with pytest.raises(ValueError, match="iterations"):
        tk.hamming_kmeans(codes.to(DEVICE), None, 2, -1)


@pytest.mark.parametrize(
    "dtype,E,bits,C,lengths",
    [
        (torch.float32, 16, 63, 6, [45, 29, 3, 0]),  # a sequence shorter than C, an empty one
        (torch.bfloat16, 32, 63, 10, [45, 45, 12, 40]),  # every position of the first two valid
        (torch.float16, 40, 5, 4, [45, 20, 33, 1]),  # 5 bits (many ties), E over one product's 32
    ],
)
def test_hash_kmeans_in_one_launch_equals_hash_then_kmeans(dtype, E, bits, C, lengths, monkeypatch):
    """``hash_kmeans`` with ``HASH_IN_KMEANS``: where K-means takes one launch, that launch
    hashes head-split views of a projection itself (``HASH``: no ``_hash_kernel`` launch, no
    codes) and packs its initial centroids from the signs; the reference's K-means of the
    reference's codes. Split over spans (few sequences that are long), in float64 and without
    the switch (the default) it is the two ops."""
    g = _gen(E + bits + C)
    B, H, N = len(lengths), 2, 45
    x = torch.randn(B, N, H * E, generator=g).to(dtype).view(B, N, H, E).transpose(1, 2)
    planes = torch.randn(E + 1, bits, generator=g)
    lengths = torch.tensor(lengths)
    want = reference.hamming_kmeans(reference.hash_codes(x.float(), planes, lengths), lengths, C, 4, bits=bits)
    assert tk.HASH_IN_KMEANS is False  # the default: the two ops
    apart = tk.hash_kmeans(*_dev(x, planes, lengths), C, 4)
    assert torch.equal(apart[0].cpu(), want[0]) and torch.equal(apart[1].cpu(), want[1])
    monkeypatch.setattr(tk, "HASH_IN_KMEANS", True)
    launches = []
    run = tk._lloyd_kernel.run

    def counted(*args, **kwargs):
        launches.append(kwargs.get("HASH"))
        return run(*args, **kwargs)

    with mock.patch.object(tk._lloyd_kernel, "run", counted), \
            mock.patch.object(th._hash_kernel, "run", side_effect=AssertionError("hashed apart")):
        got = tk.hash_kmeans(*_dev(x, planes, lengths), C, 4)
    assert launches == [True]
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    with mock.patch.object(tk, "ONE_LAUNCH_FROM", 10**9), mock.patch.object(tk, "MIN_SPAN", 16):
        split = tk.hash_kmeans(*_dev(x, planes, lengths), C, 4)  # 3 spans a sequence
    assert torch.equal(split[0].cpu(), want[0]) and torch.equal(split[1].cpu(), want[1])
    with pytest.raises(ValueError, match="hash_kmeans: planes must be"):
        tk.hash_kmeans(*_dev(x, planes[1:], lengths), C, 4)
    with pytest.raises(ValueError, match="hash_kmeans: clusters=0"):
        tk.hash_kmeans(*_dev(x, planes, lengths), 0, 4)


# ------------------------------------------------------------------ clustered products
def _clustered_inputs(B, H, N, E, C, K, g, dtype=torch.float32, realistic=True):
    """q, k, v, lengths, assignments (-1 padded) and per-cluster top-k indices.

    ``realistic``: indices are the top-K of random masked logits, as improved clustered
    attention selects them (all valid keys first; padded keys fill when K > length);
    otherwise uniform random indices with repeats.
    """
    lengths = _lengths(B, N, g)
    valid = torch.arange(N)[None, :] < lengths[:, None]
    q, k, v = (torch.randn(B, H, N, E, generator=g).to(dtype) for _ in range(3))
    assign = torch.randint(0, C, (B, H, N), generator=g)
    assign = torch.minimum(assign, (lengths - 1).clamp(min=0)[:, None, None])  # C > length: fewer used
    assign = assign.masked_fill(~valid[:, None, :], -1)
    if realistic:
        logits = torch.randn(B, H, C, N, generator=g).masked_fill(~valid[:, None, None, :], float("-inf"))
        topk_idx = logits.topk(K, dim=-1).indices
    else:
        topk_idx = torch.randint(0, N, (B, H, C, K), generator=g)
    return q, k, v, lengths, assign, topk_idx


def _dot_and_sum(ops_module, q, k, v, w, topk_idx, assign, g_s, g_o):
    """Forward both ops, then gradients of a random linear function of their outputs."""
    s = ops_module.clustered_dot(q, k, topk_idx, assign)
    o = ops_module.clustered_weighted_sum(w, v, topk_idx, assign)
    grads = torch.autograd.grad((s * g_s).sum() + (o * g_o).sum(), (q, k, v, w))
    return s, o, grads


CLUSTERED_CASES = [
    # B, H, N, E, C, K, realistic
    (2, 2, 37, 16, 5, 8, True),
    (2, 3, 100, 32, 10, 32, True),  # several N blocks, K > the shortest length
    (1, 2, 20, 24, 30, 16, True),  # more clusters than positions
    (2, 1, 45, 64, 3, 20, False),  # repeated indices; K not a power of two
]


@pytest.mark.parametrize("B,H,N,E,C,K,realistic", CLUSTERED_CASES)
def test_clustered_products_and_gradients_equal_reference_fp32(B, H, N, E, C, K, realistic):
    g = _gen(B * N + E + C + K)
    q, k, v, lengths, assign, topk_idx = _clustered_inputs(B, H, N, E, C, K, g, realistic=realistic)
    w = torch.randn(B, H, N, K, generator=g)
    g_s = torch.randn(B, H, N, K, generator=g)
    g_o = torch.randn(B, H, N, E, generator=g)

    leaves = [t.clone().requires_grad_() for t in (q, k, v, w)]
    ref_s, ref_o, ref_g = _dot_and_sum(reference, *leaves[:3], leaves[3], topk_idx, assign, g_s, g_o)
    dev = [t.to(DEVICE).requires_grad_() for t in (q, k, v, w)]
    s, o, grads = _dot_and_sum(tc, *dev[:3], dev[3], *_dev(topk_idx, assign, g_s, g_o))

    torch.testing.assert_close(s.detach().cpu(), ref_s.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(o.detach().cpu(), ref_o.detach(), atol=1e-4, rtol=1e-4)
    for name, got, want in zip("qkvw", grads, ref_g):
        torch.testing.assert_close(got.cpu(), want, atol=1e-3, rtol=1e-3, msg=lambda m, n=name: f"d{n}: {m}")
    padded = (assign < 0).to(DEVICE)
    assert bool((s.detach()[padded] == 0).all()) and bool((o.detach()[padded] == 0).all())


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 1e-3), (torch.bfloat16, 1e-2)])
def test_clustered_products_half_precision(dtype, tol):
    """fp16/bf16 inputs, fp32 accumulation: relative L2 error to float64 within ``tol``."""
    B, H, N, E, C, K = 2, 2, 70, 32, 4, 16
    g = _gen(99)
    q, k, v, lengths, assign, topk_idx = _clustered_inputs(B, H, N, E, C, K, g, dtype=dtype)
    w = torch.softmax(torch.randn(B, H, N, K, generator=g), -1).to(dtype)
    g_s = torch.randn(B, H, N, K, generator=g).to(dtype)
    g_o = torch.randn(B, H, N, E, generator=g).to(dtype)

    exact = [t.double().requires_grad_() for t in (q, k, v, w)]
    ref_s, ref_o, ref_g = _dot_and_sum(reference, *exact, topk_idx, assign, g_s.double(), g_o.double())
    dev = [t.to(DEVICE).requires_grad_() for t in (q, k, v, w)]
    s, o, grads = _dot_and_sum(tc, *dev, *_dev(topk_idx, assign, g_s, g_o))
    assert s.dtype == dtype and o.dtype == dtype and all(t.dtype == dtype for t in grads)
    assert _rel(s.detach().cpu(), ref_s) < tol
    assert _rel(o.detach().cpu(), ref_o) < tol
    for name, got, want in zip("qkvw", grads, ref_g):
        assert _rel(got.cpu(), want) < tol, f"d{name}"


def test_clustered_products_noncontiguous_and_all_padded():
    g = _gen(7)
    B, H, N, E, C, K = 2, 3, 40, 16, 6, 8
    q, k, v, lengths, assign, topk_idx = _clustered_inputs(B, H, N, E, C, K, g)
    assign[1] = -1  # a sequence with no valid query at all
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, N, E) views of (B, N, H, E)
    kt = k.transpose(1, 2).contiguous().transpose(1, 2)
    w = torch.randn(B, H, K, N, generator=g).transpose(-1, -2)
    ref_s = reference.clustered_dot(qt, kt, topk_idx, assign)
    ref_o = reference.clustered_weighted_sum(w, v, topk_idx, assign)
    s = tc.clustered_dot(*_dev(qt, kt, topk_idx, assign))
    o = tc.clustered_weighted_sum(*_dev(w, v, topk_idx, assign))
    torch.testing.assert_close(s.cpu(), ref_s, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(o.cpu(), ref_o, atol=1e-4, rtol=1e-4)
    assert bool((s[1] == 0).all()) and bool((o[1] == 0).all())


def test_clustered_products_reject_bad_inputs():
    q = torch.zeros(1, 1, 4, 8, device=DEVICE)
    idx = torch.zeros(1, 1, 2, 3, dtype=torch.int64, device=DEVICE)
    a = torch.zeros(1, 1, 4, dtype=torch.int64, device=DEVICE)
    with pytest.raises(TypeError, match="float64"):
        tc.clustered_dot(q.double(), q.double(), idx, a)
    with pytest.raises(ValueError, match="assignments"):
        tc.clustered_dot(q, q, idx, a[..., :3])
    with pytest.raises(ValueError, match="K="):
        tc.clustered_weighted_sum(torch.zeros(1, 1, 4, 5, device=DEVICE), q, idx, a)


# ------------------------------------------------------------------ top-k selection
@pytest.mark.parametrize("shape,k", [((3, 5, 50), 7), ((2, 100), 32), ((4, 3, 33), 33), ((1, 7), 1),
                                     ((37, 1000), 32), ((2, 5000), 20)])
def test_topk_indices_equal_torch_topk_as_sets(shape, k):
    """Distinct scores: the same set of indices as ``torch.topk``, each row's ``k`` distinct."""
    g = _gen(sum(shape) + k)
    x = torch.randn(*shape, generator=g)
    got = tt.topk_indices(x.to(DEVICE), k).cpu()
    assert got.shape == (*shape[:-1], k) and got.dtype == torch.int64
    assert torch.equal(got.sort(-1).values, x.topk(k, -1).indices.sort(-1).values)


@pytest.mark.parametrize("tile", [(1, 1), (2, 2), (8, 4)])
def test_topk_indices_equal_for_every_tile(tile, monkeypatch):
    """The tiles a benchmark may time instead of the launcher's (rows a program, warps) select
    the keys ``torch.topk`` selects, with masked keys and rows beyond the last program, also
    when a program's rows stop their bisection at different steps."""
    x = torch.randn(2, 3, 37, generator=_gen(sum(tile)))
    x[1, :, 30:] = float("-inf")
    want = x.topk(9, -1).indices.sort(-1).values
    monkeypatch.setattr(tt, "topk_tile", lambda n, rows: tile)
    assert torch.equal(tt.topk_indices(x.to(DEVICE), 9).cpu().sort(-1).values, want)


def test_topk_indices_masked_keys_ties_and_signed_zeros():
    """``-inf`` (masked keys) rank below every score and fill the slots only when the valid
    ones run out; equal scores at the boundary take the lowest positions; -0.0 equals 0.0."""
    x = torch.randn(3, 40, generator=_gen(5))
    x[:, 10:] = float("-inf")
    got = tt.topk_indices(x.to(DEVICE), 16).cpu().sort(-1).values
    assert torch.equal(got[:, :10], torch.arange(10).expand(3, 10))  # every valid key
    assert bool((got[:, 10:] >= 10).all())  # then masked ones, each once
    assert all(len(set(row.tolist())) == 16 for row in got)
    ties = torch.zeros(2, 20)
    ties[0, 3] = 1.0
    ties[1, ::2] = -0.0
    got = tt.topk_indices(ties.to(DEVICE), 5).cpu().sort(-1).values
    assert got.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]


def test_topk_indices_come_in_increasing_position():
    """Each row's indices are written in increasing position (the centroid backward walks them
    so: ``triton_centroid``), ties and masked keys included."""
    x = torch.randn(4, 300, generator=_gen(31)).round()
    x[1, 100:] = float("-inf")
    idx = tt.topk_indices(x.to(DEVICE), 40).cpu()
    assert bool((idx[:, 1:] > idx[:, :-1]).all()), idx


@pytest.mark.parametrize("elements", [1, 4, None], ids=["1 a thread", "4 a thread", "whole row"])
def test_topk_stores_by_chunks_take_the_lowest_tied_positions_across_chunks(elements, monkeypatch):
    """Once a row's k-th largest key is known the kernel takes its entries ``STORE_ELEMENTS`` a
    thread at a time (one warp: 32 a chunk for 1): ties at the k-th score that straddle chunks,
    ``-inf`` (masked) keys filling a row short of valid ones and lanes past N give the same
    indices and weights as taking the whole row at once, the lowest tied positions first."""
    monkeypatch.setattr(tt, "STORE_ELEMENTS", elements)
    g = _gen(21)
    x = torch.randn(5, 150, generator=g).mul(2).round()  # many ties at every score
    x[1, 40:] = float("-inf")  # 40 valid keys: the rest from the masked ones, lowest first
    x[2] = 0.0
    x[2, 100:] = -0.0  # one key for both zeros: ties across the row
    x[3, ::3] = 5.0  # 50 ties above everything for k = 33: which are taken decides the slots
    lse = x.logsumexp(-1)
    for k in (1, 33, 64):
        want = torch.tensor([sorted(range(150), key=lambda i, row=row: (-float(row[i]), i))[:k] for row in x])
        idx, w = tt.topk_softmax(x.to(DEVICE), lse.to(DEVICE), k)
        assert torch.equal(idx.cpu().sort(-1).values, want.sort(-1).values), k
        assert torch.allclose(w.cpu(), (x.gather(-1, idx.cpu()) - lse[:, None]).exp(), atol=1e-6), k


def test_topk_bisection_stops_on_the_keys_torch_topk_takes():
    """Rows where the bisection's last steps matter (it stops once exactly k keys lie at or
    above its lower bound): scores one int32 key apart, both signs, ±inf, many ties at the
    k-th score, k = 1 and k = N: the same sets as ``torch.topk`` where no tie straddles k, and
    of tied scores the lowest positions."""
    g = _gen(11)
    base = 1.0 + torch.arange(64, dtype=torch.float32) * 2.0 ** -20  # one exponent, low bits differ
    rows = torch.stack([
        base[torch.randperm(64, generator=g)],
        -base[torch.randperm(64, generator=g)],
        torch.cat([base[:32], -base[:32]])[torch.randperm(64, generator=g)],
        torch.randn(64, generator=g).masked_fill(torch.rand(64, generator=g) < 0.5, float("-inf")),
        torch.randn(64, generator=g).round(),  # many ties
        torch.cat([torch.tensor([float("inf"), float("-inf")]), torch.randn(62, generator=g)]),
    ])
    for k in (1, 7, 32, 64):
        got = tt.topk_indices(rows.to(DEVICE), k).cpu().sort(-1).values
        want = torch.tensor([sorted(range(64), key=lambda i, row=row: (-float(row[i]), i))[:k] for row in rows])
        assert torch.equal(got, want.sort(-1).values), k
        for r in (0, 1, 2, 5):
            assert torch.equal(got[r], rows[r].topk(k).indices.sort().values), (r, k)


@pytest.mark.parametrize("tile", [None, (4, 2)], ids=["launcher's tile", "4 rows x 2 warps"])
def test_topk_bracket_takes_the_keys_the_whole_range_takes(tile, monkeypatch):
    """``triton_topk.BRACKET``: the bisection starting between the least of the strided groups'
    largest keys and the row's largest takes the same entries with the same weights as from the
    whole int32 range: rows one int32 key apart, both signs, ties straddling k, rows mostly
    ``-inf`` (the groups of masked keys bound nothing), a row of ``-inf`` alone, rows shorter than
    the groups (N = 20: 20 groups), k from 1 to N, and the lowest tied positions first."""
    if tile is not None:
        monkeypatch.setattr(tt, "topk_tile", lambda n, rows: tile)
    g = _gen(13)
    base = 1.0 + torch.arange(100, dtype=torch.float32) * 2.0 ** -20
    rows = torch.stack([
        base[torch.randperm(100, generator=g)],
        torch.cat([base[:50], -base[:50]])[torch.randperm(100, generator=g)],
        torch.randn(100, generator=g).round(),  # ties at every score
        torch.randn(100, generator=g).masked_fill(torch.arange(100) >= 12, float("-inf")),  # 12 valid keys
        torch.full((100,), float("-inf")),
        torch.cat([torch.tensor([float("inf"), -0.0, 0.0]), torch.randn(97, generator=g) * 1e4]),
        torch.randn(100, generator=g) * 1e-30,  # subnormal and tiny: keys close together
    ])
    for x, ks in ((rows, (1, 7, 32, 33, 100)), (rows[:, :20], (1, 5, 20))):
        lse = x.logsumexp(-1)
        for k in ks:
            monkeypatch.setattr(tt, "BRACKET", False)
            want_idx, want_w = tt.topk_softmax(x.to(DEVICE), lse.to(DEVICE), k)
            monkeypatch.setattr(tt, "BRACKET", True)
            got_idx, got_w = tt.topk_softmax(x.to(DEVICE), lse.to(DEVICE), k)
            assert torch.equal(got_idx.cpu(), want_idx.cpu()), k
            torch.testing.assert_close(got_w.cpu(), want_w.cpu(), rtol=0, atol=0, equal_nan=True)  # +inf's row: nan
            order = torch.tensor([sorted(range(x.shape[1]), key=lambda i, row=row: (-float(row[i]), i))[:k] for row in x])
            assert torch.equal(got_idx.cpu(), order.sort(-1).values), k


def test_topk_indices_other_rows_go_to_torch_and_k_is_checked():
    """float64 rows and rows longer than MAX_N take torch.topk; k outside [0, N] is refused."""
    x = torch.randn(2, 30, dtype=torch.float64, generator=_gen(6))
    assert torch.equal(tt.topk_indices(x.to(DEVICE), 4).cpu().sort(-1).values,
                       x.topk(4, -1).indices.sort(-1).values)
    with pytest.raises(ValueError, match="k=31 must be in"):
        tt.topk_indices(x.float().to(DEVICE), 31)


def test_topk_softmax_takes_the_top_keys_and_their_softmax_weights():
    """One launch: the indices ``topk_indices`` takes and ``exp(logit - lse)`` at them, masked
    keys included when a row has fewer valid ones than ``k``; a row without keys weighs 0."""
    x = torch.randn(2, 3, 37, generator=_gen(8))
    x[1, :, 5:] = float("-inf")
    x[0, 2, :] = float("-inf")
    lse = x.logsumexp(-1)
    idx, w = tt.topk_softmax(x.to(DEVICE), lse.to(DEVICE), 9)
    idx, w = idx.cpu(), w.cpu()
    assert torch.equal(idx, tt.topk_indices(x.to(DEVICE), 9).cpu())
    want = torch.nan_to_num(x.softmax(-1), nan=0.0).gather(-1, idx)
    torch.testing.assert_close(w, want, atol=1e-6, rtol=1e-6)
    assert bool((w[0, 2] == 0).all()) and bool((w[1, :, 5:].sum(-1) < 1.01).all())
    with pytest.raises(ValueError, match="lse"):
        tt.topk_softmax(x.to(DEVICE), lse[0].to(DEVICE), 9)


def test_topk_reads_rows_in_place_where_they_lie_evenly_apart(monkeypatch):
    """Rows a padded stride apart (the centroid logits' rows, ``LOGITS_ROW_ALIGN`` floats at
    least) are read where they lie, not copied: the launch gets their stride and selects what it
    selects on the rows made contiguous; rows not evenly spaced are copied first."""
    x = torch.randn(2, 3, 48, generator=_gen(21))
    x[1, :, 30:37] = float("-inf")
    view = x[..., :37]  # rows 48 floats apart
    lse = view.logsumexp(-1)
    strides = []  # the row stride each top-k launch gets (its eighth argument)
    getitem = type(tt._topk_kernel).__getitem__

    def launch(kernel, grid):
        run = getitem(kernel, grid)
        if kernel is not tt._topk_kernel:
            return run
        return lambda *args, **kwargs: (strides.append(args[7]), run(*args, **kwargs))[1]

    monkeypatch.setattr(type(tt._topk_kernel), "__getitem__", launch)
    # sliced on the device: copying a view that is not dense to another device makes it contiguous
    idx, w = tt.topk_softmax(x.to(DEVICE)[..., :37], lse.to(DEVICE), 9)
    want_idx, want_w = tt.topk_softmax(view.contiguous().to(DEVICE), lse.to(DEVICE), 9)
    assert strides == [48, 37]
    assert torch.equal(idx.cpu(), want_idx.cpu()) and torch.equal(w.cpu(), want_w.cpu())
    assert torch.equal(idx.cpu().sort(-1).values, view.topk(9, -1).indices.sort(-1).values)
    strides.clear()
    tt.topk_indices(x.transpose(1, 2).to(DEVICE), 2)  # positions along the rows not unit-strided: a copy
    assert strides == [3]
    strides.clear()  # the centroid forward's logits: rows of 37 keys, 48 floats apart
    centroids, k, v, lengths = _centroid_inputs(1, 2, 3, 37, 16, 16, _gen(22))
    tcen.centroid_forward(centroids.to(DEVICE), k.to(DEVICE), v.to(DEVICE), lengths.to(DEVICE), 0.25, 5)
    assert strides == [tcen.LOGITS_ROW_ALIGN * 3] == [48]


# ------------------------------------------------------------------ i-clustered's centroid attention
def _centroid_inputs(B, H, C, N, E, EV, g, dtype=torch.float32, padded=True):
    centroids = torch.randn(B, H, C, E, generator=g)
    k = torch.randn(B, H, N, E, generator=g).to(dtype)
    v = torch.randn(B, H, N, EV, generator=g).to(dtype)
    lengths = _lengths(B, N, g) if padded else None
    return centroids, k, v, lengths


def _centroid_and_grads(fn, leaves, lengths, K, g):
    """``fn``'s values, top weights, top keys and the gradients of a random loss on both
    outputs, the top keys and weights in the order of the keys (the ops leave them unordered)."""
    values, top_w, top_idx = fn(*leaves, lengths, leaves[0].shape[-1] ** -0.5, K)
    order = top_idx.argsort(-1)
    top_w, top_idx = top_w.gather(-1, order), top_idx.gather(-1, order)
    gv = torch.randn(values.shape, generator=g).to(values.device)
    gw = torch.randn(top_w.shape, generator=g).to(values.device)
    loss = (values.float() * gv).sum() + (top_w.float() * gw).sum()
    return (values, top_w, top_idx, *torch.autograd.grad(loss, leaves))


def _assert_centroid_outputs_equal(got, want) -> None:
    """:func:`_centroid_and_grads`' outputs: the same top keys, and values, top weights and
    gradients of the same dtype within the float32 contract (1e-4)."""
    assert torch.equal(got[2].cpu(), want[2])
    for name, a, b in zip(("values", "top_w", "top_idx", "dcentroids", "dk", "dv"), got, want):
        assert a.dtype == b.dtype, name
        torch.testing.assert_close(a.detach().cpu(), b.detach(), atol=1e-4, rtol=1e-4,
                                   msg=lambda m, n=name: f"{n}: {m}")


CENTROID_CASES = [
    # B, H, C, N, E, Ev, K, padded
    (2, 3, 7, 37, 16, 16, 5, True),
    (2, 2, 20, 600, 32, 24, 8, True),  # two key spans a sequence (SPLIT_KEYS = 512); Ev != E
    (2, 1, 120, 70, 20, 16, 3, False),  # more centroids than keys, no lengths
    (1, 2, 9, 40, 16, 16, 0, True),  # no top keys (clustered attention's call)
    (2, 1, 10, 530, 16, 16, 0, True),  # no top keys, two key spans, the second past the shorter sequence
    (2, 1, 6, 30, 16, 16, 30, True),  # every key a top key, masked ones in the shorter sequence
]


@pytest.mark.parametrize("B,H,C,N,E,EV,K,padded", CENTROID_CASES)
def test_fused_centroid_attention_equals_reference(B, H, C, N, E, EV, K, padded):
    """Three launches forward, one backward: values, top keys, top weights and the gradients
    of the centroids, keys and values equal the reference's (float32, the 1e-4 contract),
    repeated and masked top keys (every key a top key, the shorter sequence's padding among
    them) included."""
    g = _gen(B + C + N + E + EV + K)
    centroids, k, v, lengths = _centroid_inputs(B, H, C, N, E, EV, g, padded=padded)
    want = _centroid_and_grads(reference.centroid_attention,
                               [t.clone().requires_grad_() for t in (centroids, k, v)], lengths, K, _gen(1))
    got = _centroid_and_grads(tcen.centroid_attention, [t.to(DEVICE).requires_grad_() for t in (centroids, k, v)],
                              None if lengths is None else lengths.to(DEVICE), K, _gen(1))
    _assert_centroid_outputs_equal(got, want)


@pytest.mark.parametrize("K", [16, 32])
def test_fused_centroid_attention_backward_with_top_keys_crowded_into_blocks(K):
    """The backward adds the top weights' gradients of a key block by a running index into each
    row's top keys (in increasing position, as the Triton top-k writes them): every row's top
    keys crowded into a few blocks, across the blocks' and the key spans' (``SPLIT_KEYS``)
    boundaries, some rows' around 300 and the others' around 512, give the reference's gradients."""
    g = _gen(K)
    centroids, k, v, lengths = _centroid_inputs(2, 1, 6, 700, 16, 16, g)
    lengths = torch.tensor([700, 650])
    bump = centroids / centroids.norm(dim=-1, keepdim=True) * 6  # (B, H, C, E): a key each centroid prefers
    for c in range(6):
        at = 290 if c % 2 else 500  # rows' top keys from 290 or from 500 on (a span ends at 512)
        k[:, :, at:at + K + 4] += bump[:, :, c, None, :]
    want = _centroid_and_grads(reference.centroid_attention,
                               [t.clone().requires_grad_() for t in (centroids, k, v)], lengths, K, _gen(3))
    got = _centroid_and_grads(tcen.centroid_attention, [t.to(DEVICE).requires_grad_() for t in (centroids, k, v)],
                              lengths.to(DEVICE), K, _gen(3))
    assert bool(((want[2] >= 290) & (want[2] < 300 + K)).any()) and bool((want[2] >= 500).any())
    _assert_centroid_outputs_equal(got, want)


def test_fused_centroid_attention_long_rows_by_torch_topk(monkeypatch):
    """Rows longer than the Triton top-k holds (here ``MAX_N`` lowered to 32) take
    ``torch.topk`` on the kernels' logits: the same values, top keys, weights and gradients as
    the reference."""
    monkeypatch.setattr(tcen, "MAX_N", 32)
    g = _gen(5)
    centroids, k, v, lengths = _centroid_inputs(2, 2, 6, 40, 16, 16, g)
    leaves = [t.to(DEVICE).requires_grad_() for t in (centroids, k, v)]
    assert tcen.applies(*leaves, 4)
    want = _centroid_and_grads(reference.centroid_attention,
                               [t.clone().requires_grad_() for t in (centroids, k, v)], lengths, 4, _gen(1))
    got = _centroid_and_grads(tcen.centroid_attention, leaves, lengths.to(DEVICE), 4, _gen(1))
    _assert_centroid_outputs_equal(got, want)


@pytest.mark.parametrize("C,E", [(130, 32), (64, 64)])  # a 256-row tile; heads of 64
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 1e-2), (torch.bfloat16, 2e-2)])
def test_fused_centroid_attention_half_precision(dtype, tol, C, E):
    """fp16/bf16 keys and values (fp32 logits, softmax and accumulation): against the reference
    in float64 on the same values and **the kernel's top keys**, relative L2 error within
    ``tol``; values and the key and value gradients in the input dtype.

    The kernel's logits are products of the centroids rounded to the keys' dtype, so where a
    row's k-th and k+1-th logits lie within that rounding it may pick another k-th key than
    float64 does, and the gradients of the top weights then go to that key. Here bf16 at
    C = 130, E = 32: the 8th and 9th logits of 6 of the 260 rows are 1e-4 apart (relative),
    bf16 rounds the centroids by up to 4e-3. A GPU rounds them to nearest and picks another key
    than float64 in those 6 rows; float64 on those keys is 0.043 from float64 on its own in
    ``dcentroids`` (0.038 in ``dk``), which is the whole of the compiled kernel's measured
    distance, 0.0434 (the interpreter rounds toward zero and happens to agree everywhere). So
    the arithmetic is compared on the kernel's selection, and the selection is checked apart:
    most rows pick float64's keys, and every key a row picks where it does not lies within the
    half-precision rounding of that row's k-th largest float64 logit."""
    g = _gen(77)
    centroids, k, v, _ = _centroid_inputs(2, 1, C, 90, E, E, g, dtype=dtype, padded=False)
    lengths = torch.tensor([90, 61])  # a full and a padded sequence
    K = 8
    got = _centroid_and_grads(tcen.centroid_attention, [t.to(DEVICE).requires_grad_() for t in (centroids, k, v)],
                              lengths.to(DEVICE), K, _gen(2))
    picked = got[2].cpu()

    def on_kernel_keys(c, kk, vv, lens, scale, topk):
        return reference.centroid_attention(c, kk, vv, lens, scale, topk, select=lambda logits, n: picked.clone())

    want = _centroid_and_grads(on_kernel_keys, [t.double().requires_grad_() for t in (centroids, k, v)],
                               lengths, K, _gen(2))
    assert got[0].dtype == dtype and got[4].dtype == dtype and got[5].dtype == dtype
    for i, name in ((0, "values"), (1, "top_w"), (3, "dcentroids"), (4, "dk"), (5, "dv")):
        assert _rel(got[i].cpu(), want[i]) < tol, name
    logits = reference.centroid_logits(centroids.double(), k.double(), lengths, E ** -0.5)
    own = reference.topk_indices(logits, K).sort(-1).values
    same = (picked == own).all(-1)
    assert float(same.float().mean()) > 0.9  # rows whose top keys agree with float64's
    kth = logits.topk(K, -1).values[..., -1:]  # each row's k-th largest float64 logit
    chosen = logits.gather(-1, picked)
    # what rounding the centroids (relative 2^-8 in bf16, 2^-11 in fp16) can move a logit by
    rounding = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    moved = rounding * E ** -0.5 * (centroids.double().abs() @ k.double().abs().transpose(-1, -2))
    assert bool((kth - chosen <= 2 * moved.amax(-1, keepdim=True)).all()), "a key outside the k-th logit's rounding"


def test_centroid_backward_takes_four_warps_on_short_rows_of_the_paper_shape():
    """The half-precision backward of 65-128 centroids on heads of 32 runs 4 warps on rows shorter
    than ``SHORT_BACKWARD_BELOW`` keys and 8 on longer ones (and where the length is not given),
    32 keys a block either way; the forward, float32 and other widths keep their tiles."""
    short, long_ = tcen.SHORT_BACKWARD_BELOW - 1, tcen.SHORT_BACKWARD_BELOW
    tile = lambda C, E, dot, backward, keys: tcen.centroid_tiles(C, E, E, dot, backward, keys)  # noqa: E731
    assert tile(100, 32, tl.bfloat16, True, 800) == {**tile(100, 32, tl.bfloat16, True, None), "num_warps": 4}
    assert tile(100, 32, tl.bfloat16, True, short)["BLOCK_N"] == 32 and tile(100, 32, tl.float16, True, short)["num_warps"] == 4
    assert tile(100, 32, tl.bfloat16, True, long_)["num_warps"] == tile(100, 32, tl.bfloat16, True, None)["num_warps"] == 8
    for C, E, dot, backward in ((100, 32, tl.bfloat16, False), (100, 32, tl.float32, True), (64, 64, tl.bfloat16, True),
                                (200, 32, tl.bfloat16, True), (50, 32, tl.bfloat16, True)):
        assert tile(C, E, dot, backward, 800) == tile(C, E, dot, backward, None), (C, E, dot, backward)


def test_fused_centroid_attention_refuses_what_it_does_not_serve():
    c, k = torch.zeros(1, 1, 3, 8, device=DEVICE), torch.zeros(1, 1, 5, 8, device=DEVICE)
    with pytest.raises(ValueError, match="topk=6 must be in"):
        tcen.centroid_attention(c, k, k, None, 1.0, 6)
    with pytest.raises(ValueError, match=f"C <= {tcen.MAX_CENTROIDS // 2}"):  # float32: half the rows
        tcen.centroid_attention(torch.zeros(1, 1, tcen.MAX_CENTROIDS // 2 + 1, 8, device=DEVICE), k, k, None, 1.0, 2)
    assert tcen.applies(torch.zeros(1, 1, tcen.MAX_CENTROIDS, 8), k.half(), k.half(), 2)
    wide = torch.zeros(1, 1, 5, 64, dtype=torch.bfloat16)  # heads of 64: 64 centroids in half precision
    assert tcen.applies(torch.zeros(1, 1, 64, 64), wide, wide, 2)
    assert not tcen.applies(torch.zeros(1, 1, 65, 64), wide, wide, 2)
    assert not tcen.applies(torch.zeros(1, 1, 8, 64), wide.float(), wide.float(), 2)
    with pytest.raises(ValueError, match="must be"):
        tcen.centroid_attention(c, torch.zeros(1, 1, 5, 6, device=DEVICE), k, None, 1.0, 2)
    assert not tcen.applies(c, k.double(), k.double(), 2)
    long_keys = torch.zeros(1, 1, tcen.MAX_N + 1, 8)  # rows the top-k cannot hold: torch.topk's keys
    assert tcen.applies(c, long_keys, long_keys, 0) and tcen.applies(c, long_keys, long_keys, 1)


# ------------------------------------------------------------------ clustered's broadcast
def _assignments(B, H, N, C, lengths):
    """Random clusters in ``[0, C)``, -1 past each sequence's length."""
    a = torch.randint(0, C, (B, H, N), generator=_gen(N + C))
    return a.masked_fill(torch.arange(N)[None, None, :] >= lengths[:, None, None], -1)


@pytest.mark.parametrize("B,H,C,N,D,dtype,split", [
    (2, 3, 7, 45, 16, torch.float32, False),
    (1, 2, 100, 300, 32, torch.float32, True),  # spans summed with atomics
    (2, 1, 5, 70, 24, torch.bfloat16, False),  # D not a power of two
    (1, 1, 130, 200, 32, torch.float16, True),  # a 256-cluster tile
    (1, 2, 60, 90, 64, torch.float32, False),  # rows of 64
])
def test_broadcast_clusters_equals_reference(B, H, C, N, D, dtype, split, monkeypatch):
    """Forward bit for bit the reference's rows (zeros where padded); the backward's sums by
    cluster against the reference's in float64 (float32: the 1e-4 contract; half precision:
    one rounding of the float32 sum), one span a sequence or split over several."""
    if split:
        monkeypatch.setattr(tb, "MIN_SPAN", 64)
    g = _gen(B + C + N + D)
    lengths = _lengths(B, N, g)
    assign = _assignments(B, H, N, C, lengths)
    x = torch.randn(B, H, C, D, generator=g).to(dtype)
    grad = torch.randn(B, H, N, D, generator=g).to(dtype)
    assert (tb.cluster_sum_spans(B * H, N) > 1) == split
    xd = x.to(DEVICE).requires_grad_()
    got = tb.broadcast_clusters(xd, assign.to(DEVICE))
    (dx,) = torch.autograd.grad(got, xd, grad.to(DEVICE))
    want = reference.broadcast_clusters(x, assign)
    x64 = x.double().requires_grad_()
    (dx64,) = torch.autograd.grad(reference.broadcast_clusters(x64, assign), x64, grad.double())
    assert got.dtype == dtype and dx.dtype == dtype
    assert torch.equal(got.cpu(), want)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(dx.cpu().double(), dx64, atol=tol, rtol=tol)
    # cluster_means: the same two kernels the other way round, each row over its count (means
    # float32, whatever the rows); an empty cluster's mean is 0
    assign = assign.masked_fill(assign == 0, 1)  # cluster 0 empty
    counts = torch.zeros(B, H, C + 1, dtype=torch.int64).scatter_add_(
        2, assign.remainder(C + 1), torch.ones_like(assign))[..., :C]
    assert bool((counts[..., 0] == 0).all()) and bool((counts > 1).any())
    rows = grad.to(DEVICE).requires_grad_()
    means = tb.cluster_means(rows, assign.to(DEVICE), counts.to(DEVICE), C)
    dmeans = torch.randn(B, H, C, D, generator=g)
    (drows,) = torch.autograd.grad(means, rows, dmeans.to(DEVICE))
    assert means.dtype == torch.float32 and drows.dtype == dtype
    torch.testing.assert_close(means.cpu().double(), reference.cluster_means(grad.double(), assign, counts, C),
                               atol=1e-5, rtol=1e-5)
    rows32 = grad.float().requires_grad_()  # the reference's gradient in float32, rounded once to the rows' dtype
    (want_rows,) = torch.autograd.grad(reference.cluster_means(rows32, assign, counts, C), rows32, dmeans)
    torch.testing.assert_close(drows.cpu().float(), want_rows, atol=0, rtol=0 if dtype == torch.float32 else 2**-7)


def test_broadcast_clusters_refuses_what_it_does_not_serve():
    a = torch.zeros(1, 1, 4, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match=f"C <= {tb.MAX_CLUSTERS}"):
        tb.broadcast_clusters(torch.zeros(1, 1, tb.MAX_CLUSTERS + 1, 8, device=DEVICE), a)
    with pytest.raises(ValueError, match="must be"):
        tb.broadcast_clusters(torch.zeros(1, 2, 3, 8, device=DEVICE), a)
    assert not tb.applies(torch.zeros(1, 1, 3, tb.MAX_WIDTH + 1))
    assert not tb.applies(torch.zeros(1, 1, 3, 8, dtype=torch.float64))
    assert tb.applies(torch.zeros(1, 1, 100, 64)) and tb.applies(torch.zeros(1, 1, 256, 32))
    assert not tb.applies(torch.zeros(1, 1, 130, 64))  # a 256 x 64 sum: past MAX_TILE
    assert tb.applies(torch.zeros(1, 1, 500, 32), clusters=100) and not tb.applies(torch.zeros(1, 1, 5, 32), 300)
    counts = torch.ones(1, 1, 300, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="C <= 256"):
        tb.cluster_means(torch.zeros(1, 1, 4, 8, device=DEVICE), a, counts, 300)
    with pytest.raises(ValueError, match="must be"):
        tb.cluster_means(torch.zeros(1, 1, 5, 8, device=DEVICE), a, counts[..., :3], 3)
    with pytest.raises(ValueError, match=r"counts \(1, 1, 300\)"):
        tb.cluster_means(torch.zeros(1, 1, 4, 8, device=DEVICE), a, counts, 3)


# ------------------------------------------------------------------ the fused sparse part
def _sparse_inputs(B, H, N, E, EV, C, K, g, dtype=torch.float32, noncontiguous=False):
    """Inputs of ``improved_sparse``: q, k (E), v (Ev), centroid values and top weights."""
    q, k, _, lengths, assign, topk_idx = _clustered_inputs(B, H, N, E, C, K, g, dtype=dtype)
    v = torch.randn(B, H, N, EV, generator=g).to(dtype)
    if noncontiguous:  # (B, H, N, E) views of (B, N, H, E), as the model's heads are
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    values = torch.randn(B, H, C, EV, generator=g).to(dtype)
    top_w = (torch.rand(B, H, C, K, generator=g) / K).to(dtype)
    return (q, k, v, values, top_w), topk_idx, assign, lengths


def _sparse_and_grads(fn, leaves, topk_idx, assign, lengths, grad):
    out = fn(*leaves, topk_idx, assign, lengths, leaves[0].shape[-1] ** -0.5)
    return (out, *torch.autograd.grad((out.float() * grad).sum(), leaves))


SPARSE_CASES = [
    # B, H, N, E, Ev, C, K, noncontiguous
    (2, 2, 45, 16, 16, 6, 12, False),
    (2, 3, 100, 32, 32, 10, 32, True),  # several blocks a cluster, K > the shortest length
    (1, 2, 20, 24, 8, 30, 16, False),  # more clusters than positions; Ev != E
]


# each case; one also with the other query rows a block that ``make gpu-check`` times
# (``attention/clustering_gpu.py --sparse-tiles``: more blocks a cluster)
SPARSE_RUNS = [(*case, None) for case in SPARSE_CASES] + [(*SPARSE_CASES[1], rows) for rows in (16, 32)]


@pytest.mark.parametrize("B,H,N,E,EV,C,K,noncontiguous,rows", SPARSE_RUNS)
def test_fused_sparse_part_equals_reference(B, H, N, E, EV, C, K, noncontiguous, rows, monkeypatch):
    """One launch forward, one backward: the output and the gradients of q, k, v, the
    centroid values and the top weights equal the reference's, padded rows 0; ``dk`` and
    ``dv`` added at the top keys by atomics; ``rows`` query rows a block instead of the
    launcher's."""
    if rows is not None:
        blocks = tc._sparse_blocks
        monkeypatch.setattr(tc, "_sparse_blocks", lambda *a, **k: (rows, *blocks(*a, **k)[1:]))
    g = _gen(B * N + E + EV + C + K)
    inputs, topk_idx, assign, lengths = _sparse_inputs(B, H, N, E, EV, C, K, g, noncontiguous=noncontiguous)
    grad = torch.randn(B, H, N, EV, generator=g)
    want = _sparse_and_grads(reference.improved_sparse, [t.clone().requires_grad_() for t in inputs],
                             topk_idx, assign, lengths, grad)
    got = _sparse_and_grads(tc.improved_sparse, [t.to(DEVICE).requires_grad_() for t in inputs],
                            *_dev(topk_idx, assign, lengths, grad))
    for name, a, b in zip(("out", "dq", "dk", "dv", "dvalues", "dtop_w"), got, want):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), atol=1e-4, rtol=1e-4,
                                   msg=lambda m, n=name: f"{n}: {m}")
    padded = ~(torch.arange(N)[None, :] < lengths[:, None])
    assert bool((got[0].detach().cpu().transpose(1, 2)[padded] == 0).all())


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 1e-2), (torch.bfloat16, 2e-2)])
def test_fused_sparse_part_half_precision(dtype, tol):
    """fp16/bf16 inputs (fp32 scores, softmax and accumulation): relative L2 error to
    float64 within ``tol``, results and gradients in the input dtype."""
    g = _gen(98)
    inputs, topk_idx, assign, lengths = _sparse_inputs(2, 2, 70, 32, 32, 4, 16, g, dtype=dtype)
    grad = torch.randn(2, 2, 70, 32, generator=g)
    want = _sparse_and_grads(reference.improved_sparse, [t.double().requires_grad_() for t in inputs],
                             topk_idx, assign, lengths, grad.double())
    got = _sparse_and_grads(tc.improved_sparse, [t.to(DEVICE).requires_grad_() for t in inputs],
                            *_dev(topk_idx, assign, lengths, grad))
    assert all(t.dtype == dtype for t in got)
    for name, a, b in zip(("out", "dq", "dk", "dv", "dvalues", "dtop_w"), got, want):
        assert _rel(a.cpu(), b) < tol, name


def test_fused_sparse_part_rejects_bad_inputs():
    q = torch.zeros(1, 1, 4, 8, device=DEVICE)
    idx = torch.zeros(1, 1, 2, 3, dtype=torch.int64, device=DEVICE)
    a = torch.zeros(1, 1, 4, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="q and k must agree"):
        tc.improved_sparse(q, torch.zeros(1, 1, 4, 6, device=DEVICE), q, torch.zeros(1, 1, 2, 8, device=DEVICE),
                           torch.zeros(1, 1, 2, 3, device=DEVICE), idx, a, None, 1.0)


# ------------------------------------------------------------------ availability
def test_unavailable_without_cuda_or_interpreter_says_why(monkeypatch):
    monkeypatch.setattr(availability, "_cuda_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reason = availability.unavailable_reason("cpu", interpreted=False)
    assert reason is not None and "CUDA" in reason and "TRITON_INTERPRET" in reason
    with pytest.raises(availability.TritonUnavailableError, match="hash_codes.*TRITON_INTERPRET"):
        availability.require_triton("hash_codes", "cpu", interpreted=False)
    # A kernel says so at its first call, before touching Triton.
    monkeypatch.setattr(th, "kernels_interpreted", lambda kernel: False)
    with pytest.raises(availability.TritonUnavailableError, match="CUDA"):
        th.hash_codes(torch.zeros(1, 1, 2, 3), torch.zeros(4, 8))
    monkeypatch.setattr(tc, "kernels_interpreted", lambda kernel: False)
    with pytest.raises(availability.TritonUnavailableError, match="clustered_dot"):
        tc.clustered_dot(torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, 3),
                         torch.zeros(1, 1, 1, 1, dtype=torch.int64), torch.zeros(1, 1, 2, dtype=torch.int64))
    # A CUDA tensor on a machine where CUDA is gone is also named.
    assert "cuda" in availability.unavailable_reason("cuda", interpreted=False)


def test_unavailable_without_triton_says_why(monkeypatch):
    monkeypatch.setattr(availability, "triton_import_error", lambda: "ModuleNotFoundError: No module named 'triton'")
    with pytest.raises(availability.TritonUnavailableError, match="import triton"):
        availability.require_triton("hamming_kmeans", "cuda", interpreted=True)
    with pytest.raises(availability.TritonUnavailableError, match="import triton"):
        availability.import_kernel_module("clustering.triton_kmeans")


@pytest.fixture
def _fresh_capability_cache():
    availability._capability_reason.cache_clear()
    yield
    availability._capability_reason.cache_clear()


def test_availability_decides_by_interpreter_state_and_compute_capability(monkeypatch, _fresh_capability_cache):
    """Interpreted kernels run only if Triton's own library was built for the interpreter;
    compiled ones only on a GPU of compute capability >= 7.5, and the reason names the GPU."""
    monkeypatch.setattr(availability, "triton_import_error", lambda: None)
    monkeypatch.setattr(availability, "_triton_stdlib_interpreted", lambda: False)
    reason = availability.unavailable_reason("cpu", interpreted=True)
    assert reason is not None and "imported before TRITON_INTERPRET=1" in reason
    monkeypatch.setattr(availability, "_triton_stdlib_interpreted", lambda: True)
    assert availability.unavailable_reason("cpu", interpreted=True) is None
    assert availability.unavailable_reason("cuda", interpreted=True) is None  # copied to the CPU

    monkeypatch.setattr(availability, "_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "Tesla V100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (7, 0))
    reason = availability.unavailable_reason("cuda:0", interpreted=False)
    assert reason == "GPU Tesla V100 has compute capability 7.0; Triton needs >= 7.5"
    with pytest.raises(availability.TritonUnavailableError, match="hamming_kmeans.*capability 7.0"):
        availability.require_triton("hamming_kmeans", "cuda:0", interpreted=False)
    availability._capability_reason.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    assert availability.unavailable_reason("cuda:0", interpreted=False) is None


# ------------------------------------------------------------------ dispatch (ops.py)
def test_ops_dispatch_rules(monkeypatch):
    from fastasr.kernels.clustering import ops

    cpu = torch.zeros(1)
    monkeypatch.delenv(ops.KERNELS_ENV, raising=False)
    assert ops.kernel_backend(cpu, "clustered_dot") == "reference"  # CPU: never Triton
    if torch.cuda.is_available():
        cuda = cpu.cuda()
        assert ops.kernel_backend(cuda, "clustered_dot") == "triton"
        assert ops.kernel_backend(cuda.double(), "clustered_dot") == "reference"
        assert ops.kernel_backend(cuda.double(), "hash_codes") == "triton"
    monkeypatch.setenv(ops.KERNELS_ENV, "Reference")
    assert ops.kernel_backend(cpu) == "reference"
    monkeypatch.setenv(ops.KERNELS_ENV, "triton")
    assert ops.kernel_backend(cpu) == "triton"
    monkeypatch.setenv(ops.KERNELS_ENV, "cuda")
    with pytest.raises(ValueError, match="FASTASR_KERNELS='cuda'.*auto, reference, native, triton"):
        ops.kernel_backend(cpu)
    monkeypatch.setenv(ops.KERNELS_ENV, "triton")
    monkeypatch.setattr(availability, "triton_import_error", lambda: "ModuleNotFoundError: No module named 'triton'")
    with pytest.raises(availability.TritonUnavailableError, match="import triton"):
        ops.hash_codes(torch.zeros(1, 1, 2, 3), torch.zeros(4, 8))


@pytest.mark.parametrize("spec,split_from", [
    ("i-clustered-6", None),  # the fused centroid attention, the Triton cluster sums
    ("clustered-6", None),  # one SDPA call for the centroid values; sums and broadcast by Triton
    ("clustered-6", 0),  # the split-key kernels for the centroid values
])
def test_clustered_attention_through_triton_equals_reference(spec, split_from, monkeypatch):
    """End to end: (i-)clustered attention with every op on Triton vs on the reference
    (clustered's centroid values by SDPA, or by the split-key kernels from
    ``ops.SPLIT_KEY_VALUES_FROM`` keys)."""
    from fastasr.attention import build_attention
    from fastasr.kernels.clustering import ops

    if split_from is not None:
        monkeypatch.setattr(ops, "SPLIT_KEY_VALUES_FROM", split_from)
    g = _gen(21)
    B, H, N, E = 2, 2, 45, 16
    q, k, v = (torch.randn(B, H, N, E, generator=g) for _ in range(3))
    lengths = torch.tensor([45, 30])
    grad = torch.randn(B, H, N, E, generator=g)
    results = {}
    for backend in ("reference", "triton"):
        monkeypatch.setenv(ops.KERNELS_ENV, backend)
        attn = build_attention(spec, bits=31, iterations=4, seed=3, **({"topk": 12} if spec.startswith("i-") else {}))
        leaves = [t.clone().to(DEVICE).requires_grad_() for t in (q, k, v)]
        out = attn(*leaves, lengths.to(DEVICE))
        results[backend] = (out.detach().cpu(), *(t.cpu() for t in torch.autograd.grad(out, leaves, grad.to(DEVICE))))
    assert ops.kernel_backend(q.to(DEVICE), "clustered_dot") == "triton"
    ref, got = results["reference"], results["triton"]
    with torch.inference_mode():  # decoding's mode (evaluate.py, Lightning's test step)
        decoded = attn(*(t.to(DEVICE) for t in (q, k, v)), lengths.to(DEVICE)).cpu()
    torch.testing.assert_close(decoded, got[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[0], ref[0], atol=1e-4, rtol=1e-4)
    for name, a, b in zip("qkv", got[1:], ref[1:]):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3, msg=lambda m, n=name: f"d{n}: {m}")


# ------------------------------------------------------------------ GPU-ready properties
def test_cluster_order_blocks_hold_one_cluster_each():
    """Every block covers rows of one cluster only, all valid rows exactly once, and the
    table is built on the device (no host-side count of the blocks)."""
    g = _gen(31)
    B, H, N, C = 2, 3, 29, 6
    lengths = torch.tensor([29, 11])
    assign = torch.randint(0, C - 1, (B, H, N), generator=g)  # cluster C-1 stays empty
    assign = assign.masked_fill(torch.arange(N) >= lengths[:, None, None], -1)
    order = tc.cluster_order(assign.to(DEVICE), C)
    for block_n in (4, 16):
        table, P = order.blocks(block_n)
        table, perm = table.cpu(), order.perm.cpu().view(B * H, N)
        assert P == -(-N // block_n) + C and table.shape == (B * H, P, 3)
        for bh in range(B * H):
            a = assign.view(B * H, N)[bh]
            seen = []
            for c, row0, rows in table[bh].tolist():
                if c < 0:
                    assert rows == 0
                    continue
                assert 0 < rows <= block_n
                members = perm[bh, row0 : row0 + rows]
                assert bool((a[members] == c).all()), "a block mixes clusters"
                seen += members.tolist()
            assert sorted(seen) == sorted((a >= 0).nonzero().squeeze(1).tolist())


@pytest.mark.parametrize("C, block_ns", [(6, (4, 16)), (100, (16, 64)), (256, (16, 128))])
def test_block_table_equals_its_reference(C, block_ns):
    """The block table's Triton launch gives the PyTorch twin's rows exactly (empty clusters,
    sequences shorter than C, a cluster holding every position), and counts handed in (as
    K-means returns them) give the same order as counts counted."""
    from fastasr.kernels.clustering.cluster_order import block_table_reference

    g = _gen(32)
    B, H, N = 3, 2, 300
    lengths = torch.tensor([300, 37, 3])
    assign = torch.randint(0, max(1, C // 2), (B, H, N), generator=g)  # the upper half stays empty
    assign[0, 1] = C - 1  # one cluster holds the whole sequence
    assign = assign.masked_fill(torch.arange(N) >= lengths[:, None, None], -1)
    counted = tc.cluster_order(assign.to(DEVICE), C)
    counts = torch.stack([(assign == c).sum(-1) for c in range(C)], dim=-1)
    given = tc.cluster_order(assign.to(DEVICE), C, counts.to(DEVICE))
    assert torch.equal(counted.perm, given.perm) and torch.equal(counted.counts, given.counts)
    assert torch.equal(counted.counts.cpu(), counts.view(B * H, C))
    for block_n in block_ns:
        want, P = block_table_reference(counts.view(B * H, C), N, block_n)
        for order in (counted, given):
            table, got_p = order.blocks(block_n)
            assert got_p == P and torch.equal(table.cpu(), want), block_n


def test_improved_clustered_sorts_once_per_call(monkeypatch):
    """One argsort of the cluster order serves the forward and backward products."""
    from fastasr.attention import build_attention
    from fastasr.kernels.clustering import ops

    monkeypatch.setenv(ops.KERNELS_ENV, "triton")
    calls = []
    argsort = torch.argsort

    def counting(*args, **kwargs):
        calls.append(1)
        return argsort(*args, **kwargs)

    monkeypatch.setattr(torch, "argsort", counting)
    g = _gen(32)
    q, k, v = (torch.randn(2, 2, 30, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    out = build_attention("i-clustered-4", topk=8, iterations=2, seed=1)(q, k, v)
    out.square().sum().backward()
    assert len(calls) == 1


def test_half_precision_reaches_the_triton_dots(monkeypatch):
    """bf16 inputs are not upcast before the sparse part: its two fused kernels get bf16
    q, k, v (fp32 accumulation inside), and the result stays close to fp32's."""
    from fastasr.attention import build_attention
    from fastasr.kernels.clustering import ops

    monkeypatch.setenv(ops.KERNELS_ENV, "triton")
    seen = []
    launch = tc._launch_sparse

    def recording(kernel, q, k, v, *args, **kwargs):
        seen.append((kernel.__name__, q.dtype, k.dtype, v.dtype))
        return launch(kernel, q, k, v, *args, **kwargs)

    monkeypatch.setattr(tc, "_launch_sparse", recording)
    g = _gen(33)
    q, k, v = (torch.randn(2, 2, 30, 16, generator=g).to(DEVICE) for _ in range(3))
    attn = build_attention("i-clustered-4", topk=8, iterations=2, seed=1)
    leaves = [x.bfloat16().requires_grad_() for x in (q, k, v)]
    half = attn(*leaves)
    assert half.dtype == torch.bfloat16
    half.float().square().sum().backward()  # the backward takes bf16 too
    assert all(t.grad.dtype == torch.bfloat16 and bool(torch.isfinite(t.grad).all()) for t in leaves)
    assert [name for name, *_ in seen] == ["_sparse_fwd_kernel", "_sparse_bwd_kernel"]
    assert all(dtypes == [torch.bfloat16] * 3 for _, *dtypes in seen)
    exact = attn(*(x.bfloat16().float() for x in (q, k, v)))
    assert float((half.detach().float() - exact).abs().max()) < 3e-2


# ------------------------------------------------------------------ launches and synchronisation
def _probe():
    """``benchmarks.gpu.launches.LaunchProbe`` with the CPU standing in for the device: a read
    of any tensor is a synchronisation."""
    from benchmarks.gpu.launches import LaunchProbe

    return LaunchProbe(stand_in=True)


# Triton launches of one forward + backward on a padded batch with few sequences (one K-means
# launch: every Lloyd iteration runs in it), and a ceiling on the torch kernels around them: the
# counts today (benchmarks/gpu/notes.md, "Launches"), so a change that adds one fails here.
_LAUNCHES = {
    # the centroids' sums of their queries and the broadcast of their values, each one launch
    # forward and one backward (the other's kernel)
    "clustered-10": ({"triton_hashing._hash_kernel": 1, "triton_kmeans._lloyd_kernel": 1,
                      "triton_broadcast._broadcast_kernel": 2, "triton_broadcast._cluster_sum_kernel": 2}, 26),
    # with ops.SPLIT_KEY_VALUES_FROM reached: the centroid values in two launches forward, one backward
    "clustered-10 split-key values": ({"triton_hashing._hash_kernel": 1, "triton_kmeans._lloyd_kernel": 1,
                                       "triton_centroid._centroid_fwd_kernel": 1,
                                       "triton_centroid._centroid_combine_kernel": 1,
                                       "triton_centroid._centroid_bwd_kernel": 1,
                                       "triton_broadcast._broadcast_kernel": 2,
                                       "triton_broadcast._cluster_sum_kernel": 2}, 10),
    # the centroid attention in three launches forward, one backward; the centroids' sums as
    # clustered's; two block tables: in float32 the sparse backward takes half the forward's rows
    # a block (_sparse_blocks); half precision shares one table
    "i-clustered-10": ({"triton_hashing._hash_kernel": 1, "triton_kmeans._lloyd_kernel": 1,
                        "triton_centroid._centroid_fwd_kernel": 1, "triton_centroid._centroid_combine_kernel": 1,
                        "triton_topk._topk_kernel": 1, "cluster_order._block_table_kernel": 2,
                        "triton_clustered._sparse_fwd_kernel": 1, "triton_clustered._sparse_bwd_kernel": 1,
                        "triton_centroid._centroid_bwd_kernel": 1, "triton_broadcast._cluster_sum_kernel": 1,
                        "triton_broadcast._broadcast_kernel": 1}, 15),
}


_INTERPRETER_ONLY = pytest.mark.skipif(
    not INTERPRETED, reason="counts launches in the Triton interpreter; on a GPU "
    "benchmarks/attention/clustering_gpu.py checks synchronisation with torch.cuda.set_sync_debug_mode")


@_INTERPRETER_ONLY
@pytest.mark.parametrize("spec", sorted(_LAUNCHES))
def test_attention_launch_counts_and_no_host_synchronisation(spec, monkeypatch):
    """One forward + backward through the kernels (``FASTASR_KERNELS=triton``) counted in the
    interpreter: the Triton launches per kernel are exact, the torch kernels stay under a
    ceiling, and nothing reads a value back to the host (``.item()``, ``.tolist()``,
    ``nonzero()``, boolean-mask indexing, ``unique``). ``lengths`` are validated before, as
    ``InnerAttention.forward`` does (on a GPU with a device-side assert, no synchronisation)."""
    from fastasr.attention import build_attention
    from fastasr.attention.masking import check_lengths
    from fastasr.kernels.clustering import ops

    monkeypatch.setenv(ops.KERNELS_ENV, "triton")
    if spec.endswith(" split-key values"):
        monkeypatch.setattr(ops, "SPLIT_KEY_VALUES_FROM", 0)
    overrides = {"topk": 8} if spec.startswith("i-") else {}
    attn = build_attention(spec.split()[0], seed=0, iterations=3, **overrides)
    g = _gen(40)
    q, k, v = (torch.randn(2, 3, 45, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    lengths = check_lengths(torch.tensor([45, 29]).to(DEVICE), 2, 45)
    with _probe() as probe:
        out = attn._forward(q, k, v, lengths)
        out.square().sum().backward()
    want_triton, torch_ceiling = _LAUNCHES[spec]
    assert probe.syncs == []
    assert probe.triton == want_triton
    assert sum(probe.aten.values()) <= torch_ceiling, sorted(probe.aten.items())


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_improved_clustered_one_op_equals_its_two_ops(dtype, tol):
    """``triton_improved.improved_clustered`` (one backward for the centroid attention and the
    sparse part) against ``centroid_attention`` then ``improved_sparse``: the same output and the
    same gradients of q, k, v and the centroids (to rounding: the sums of dk, dv meet in float32
    before one rounding), on head-split views of projections, with padding."""
    B, H, N, E, C, K = 2, 3, 45, 16, 6, 8
    g = _gen(77)
    lengths = torch.tensor([45, 29])
    proj = [torch.randn(B, N, H * E, generator=g) for _ in range(3)]
    assign = _assignments(B, H, N, C, lengths)
    counts = torch.zeros(B, H, C + 1, dtype=torch.int64).scatter_add_(
        2, assign.remainder(C + 1), torch.ones_like(assign))[..., :C]
    cent = torch.randn(B, H, C, E, generator=g)
    grad = torch.randn(B, H, N, E, generator=g)
    results = []
    for one_op in (True, False):
        leaves = [p.to(DEVICE, dtype).clone().requires_grad_() for p in proj]
        q, k, v = (x.view(B, N, H, E).transpose(1, 2) for x in leaves)
        c = cent.to(DEVICE).clone().requires_grad_()
        args = (assign.to(DEVICE), lengths.to(DEVICE), 0.25)
        if one_op:
            out = ti.improved_clustered(q, k, v, c, args[0], counts.to(DEVICE), args[1], args[2], K)
        else:
            values, top_w, top_idx = tcen.centroid_attention(c, k, v, args[1], args[2], K)
            out = tc.improved_sparse(q, k, v, values, top_w, top_idx, *args, counts=counts.to(DEVICE))
        out.backward(grad.to(DEVICE, dtype))
        assert out.dtype == dtype
        results.append([out.detach().float().cpu(), *(x.grad.float().cpu() for x in (*leaves, c))])
    for name, got, want in zip(("out", "dq", "dk", "dv", "dcentroids"), *results):
        scale = float(want.abs().max())  # bf16: one rounding of each gradient's largest entry
        torch.testing.assert_close(got, want, atol=tol * scale, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
    with pytest.raises(ValueError, match="topk=0"):
        ti.improved_clustered(q, k, v, c, args[0], None, args[1], args[2], 0)
    half = torch.zeros(1, 1, 300, 32, dtype=torch.bfloat16)  # C = 129 and more: the two ops
    assert ti.applies(torch.zeros(1, 1, 128, 32), half, half, 8)
    assert not ti.applies(torch.zeros(1, 1, 129, 32), half, half, 8) and not ti.applies(torch.zeros(1, 1, 8, 32), half, half, 0)


@_INTERPRETER_ONLY
@pytest.mark.parametrize("spec", ["i-clustered-10", "clustered-10 split-key values"])
def test_attention_copies_no_rows_of_the_model_layout(spec, monkeypatch):
    """Queries, keys and values as an attention layer passes them, head-split views of its
    ``(B, N, H·E)`` projections: one forward + backward through the kernels, with the output's
    heads merged back (``transpose(1, 2).reshape``, a view), copies no per-position rows, and
    gives the numbers of the same call on contiguous ``(B, H, N, E)`` inputs. (Clustered
    attention's centroid values below ``ops.SPLIT_KEY_VALUES_FROM`` keys are SDPA's on a GPU,
    the reference's here: not the kernels'.)"""
    from fastasr.attention import build_attention
    from fastasr.kernels.clustering import ops

    monkeypatch.setenv(ops.KERNELS_ENV, "triton")
    if spec.endswith(" split-key values"):
        monkeypatch.setattr(ops, "SPLIT_KEY_VALUES_FROM", 0)
    overrides = {"topk": 8} if spec.startswith("i-") else {}
    B, H, N, E = 2, 3, 45, 16
    g = _gen(41)
    projections = [torch.randn(B, N, H * E, generator=g) for _ in range(3)]
    lengths = torch.tensor([45, 29]).to(DEVICE)
    grad = torch.randn(B, N, H * E, generator=g).to(DEVICE)
    results = {}
    for layout in ("heads inner", "contiguous"):
        attn = build_attention(spec.split()[0], seed=0, iterations=3, **overrides)
        leaves = [p.clone().to(DEVICE).requires_grad_() for p in projections]
        q, k, v = (x.view(B, N, H, E).transpose(1, 2) for x in leaves)
        if layout == "contiguous":
            q, k, v = (x.contiguous() for x in (q, k, v))
        with _probe() as probe:
            out = attn(q, k, v, lengths)
            merged = out.transpose(1, 2).reshape(B, N, H * E)
            (merged * grad).sum().backward()
        results[layout] = (merged.detach(), *(x.grad for x in leaves))
        if layout == "heads inner":
            assert [c for c in probe.copies if math.prod(c[1]) >= B * N * H * E] == []
    for name, got, want in zip(("out", "dq", "dk", "dv"), results["heads inner"], results["contiguous"]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_clustered_centroid_values_take_the_split_key_kernels_from_a_length(monkeypatch):
    """Without top keys the Triton centroid kernels serve sequences of at least
    ``ops.SPLIT_KEY_VALUES_FROM`` keys; with top keys they serve every length (rows longer than
    the Triton top-k holds by ``torch.topk``); with ``FASTASR_KERNELS=reference`` none."""
    from fastasr.kernels.clustering import ops

    monkeypatch.setenv(ops.KERNELS_ENV, "triton")
    c = torch.zeros(1, 1, 3, 8, device=DEVICE)
    k, long_keys = torch.zeros(1, 1, 20, 8, device=DEVICE), torch.zeros(1, 1, tcen.MAX_N + 1, 8, device=DEVICE)
    assert ops.SPLIT_KEY_VALUES_FROM == 32768
    assert ops._triton_centroid_kernels(c, k, k, 0) is None
    for threshold, taken in ((21, False), (20, True), (0, True)):
        monkeypatch.setattr(ops, "SPLIT_KEY_VALUES_FROM", threshold)
        assert (ops._triton_centroid_kernels(c, k, k, 0) is tcen) == taken, threshold
    assert ops._triton_centroid_kernels(c, k, k, 2) is tcen
    assert ops._triton_centroid_kernels(c, long_keys, long_keys, 2) is tcen
    monkeypatch.setenv(ops.KERNELS_ENV, "reference")
    assert ops._triton_centroid_kernels(c, k, k, 0) is None


@_INTERPRETER_ONLY
def test_launch_probe_sees_a_synchronisation():
    """The probe itself: ``.item()`` and boolean-mask indexing are caught."""
    x = torch.arange(5.0)
    with _probe() as probe:
        float(x.sum())
        x[x > 2].sum()
    assert probe.syncs == ["aten::_local_scalar_dense", "aten::index"]


@_INTERPRETER_ONLY
def test_kmeans_is_one_launch_when_the_sequences_fill_the_gpu():
    """Enough sequences: every Lloyd iteration in one launch; few long ones: a sweep and an
    update per iteration plus the final sweep (2 × iterations + 1)."""
    codes = torch.randint(0, 2**62, (1, 2, 40), generator=_gen(41)).to(DEVICE)
    assert tk.spans_per_sequence(tk.ONE_LAUNCH_FROM, 65536) == 1
    assert tk.spans_per_sequence(6, 65536) == -(-tk.FILL_PROGRAMS // 6)  # enough to fill it
    assert tk.spans_per_sequence(6, 1000) == 2  # spans of at least MIN_SPAN
    for spans, want in ((1, {"triton_kmeans._lloyd_kernel": 1}),
                        (2, {"triton_kmeans._lloyd_kernel": 5, "triton_kmeans._update_kernel": 4})):
        with _probe() as probe:
            tk.hamming_kmeans(codes, None, 4, 4, spans=spans)
        assert probe.triton == want and probe.syncs == []


@_INTERPRETER_ONLY
def test_kmeans_stops_at_a_fixed_point(monkeypatch):
    """A sequence whose vote moves no centroid stops sweeping (every later iteration would
    repeat that sweep exactly): clustered codes reach that point within a few of 50 iterations,
    with the reference's assignments and counts; random codes over 3 iterations take all
    4 sweeps (3 and the final assignment)."""
    votes = []
    vote = tk._vote

    def counted(*args, **kwargs):
        votes.append(1)
        return vote.fn(*args, **kwargs)

    monkeypatch.setattr(tk, "_vote", counted)  # the interpreter calls the module's global
    g = _gen(42)
    codes = clustered_codes(1, 2, 60, 5, 0.05, g)
    lengths = torch.tensor([60])
    got = tk.hamming_kmeans(codes.to(DEVICE), lengths.to(DEVICE), 5, 50, spans=1)
    want = reference.hamming_kmeans(codes, lengths, 5, 50)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(got, want))
    assert 2 <= len(votes) <= 2 * 6, len(votes)  # 2 programs (heads), each a handful of sweeps
    votes.clear()
    codes = torch.randint(0, 2**62, (1, 1, 200), generator=g)
    got = tk.hamming_kmeans(codes.to(DEVICE), None, 20, 3, spans=1)
    assert len(votes) == 4
    assert all(torch.equal(a.cpu(), b) for a, b in zip(got, reference.hamming_kmeans(codes, None, 20, 3)))

def test_split_kmeans_stops_at_a_fixed_point(monkeypatch):
    """Split over spans (two launches an iteration), a sequence's sweeps and votes exit at once
    after the vote that moved none of its centroids: exactly the reference's first still
    iteration's count of votes a sequence (every iteration where none is still), with the
    reference's assignments and counts. The votes are counted in the interpreter (a compiled
    kernel's calls cannot be wrapped); compiled, the results are checked alone."""
    votes = []
    if INTERPRETED:
        vote = tk._vote

        def counted(*args, **kwargs):
            votes.append(1)
            return vote.fn(*args, **kwargs)

        monkeypatch.setattr(tk, "_vote", counted)
    g = _gen(43)
    codes = torch.cat([clustered_codes(1, 2, 60, 5, 0.05, g), torch.randint(0, 2**62, (1, 1, 60), generator=g)], 1)
    lengths = torch.tensor([57])
    first = reference.fixed_point_iteration(codes, lengths, 5, 4)
    assert (first[0, :2] > 0).all() and first[0, 2] == -1, first  # two reach a fixed point, one does not
    got = tk.hamming_kmeans(codes.to(DEVICE), lengths.to(DEVICE), 5, 4, spans=3)
    want = reference.hamming_kmeans(codes, lengths, 5, 4)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(got, want))
    if INTERPRETED:
        assert len(votes) == int(first[0, :2].sum()) + 4



# ------------------------------------------------------------------ layer norm
tln = _load("layers.triton_layer_norm")


def _layer_norm_case(shape, dtype, seed):
    g = _gen(seed)
    d = shape[-1]
    x = (torch.randn(shape, generator=g) * 3 + 1).to(dtype)
    w, b = torch.randn(d, generator=g), torch.randn(d, generator=g)
    return x, w, b, torch.randn(shape, generator=g).to(dtype)


def _layer_norm_and_grads(x, w, b, dy, norm=None):
    """``norm``'s (default: the Triton kernels') output and gradients of ``x``, ``w``, ``b`` on
    :data:`DEVICE`, on the CPU."""
    leaves = [t.to(DEVICE).requires_grad_() for t in (x, w, b)]
    out = (norm or (lambda *a: tln.layer_norm(*a, 1e-5)))(*leaves)
    return [t.cpu() for t in (out.detach(), *torch.autograd.grad(out, leaves, dy.to(DEVICE)))]


@pytest.mark.parametrize("shape", [(3, 37, 192), (70, 20), (2, 3, 1000), (4, 1)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 1.6e-2), (torch.float16, 2e-3)])
def test_layer_norm_equals_torch(shape, dtype, tol):
    """Values and gradients against torch's layer norm in float64 of the same inputs (rounded to
    the input's dtype where the kernels round: the output and the input's gradient); rows over
    more tiles than programs (111 rows of 192: 14 tiles), widths not a power of two, one value a
    row (the output is the bias)."""
    x, w, b, dy = _layer_norm_case(shape, dtype, 50)
    out, dx, dw, db = _layer_norm_and_grads(x, w, b, dy)
    assert (out.dtype, dx.dtype, dw.dtype, db.dtype) == (dtype, dtype, torch.float32, torch.float32)
    assert out.shape == dx.shape == x.shape
    ref = _layer_norm_and_grads(x.double(), w.double(), b.double(), dy.double(),
                                lambda *a: torch.nn.functional.layer_norm(a[0], a[0].shape[-1:], *a[1:]))
    torch.testing.assert_close(out.double(), ref[0].to(dtype).double(), atol=tol, rtol=tol)
    torch.testing.assert_close(dx.double(), ref[1].to(dtype).double(), atol=4 * tol, rtol=tol)
    for name, got, want in (("weight", dw, ref[2]), ("bias", db, ref[3])):  # float32 sums over the rows
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4, msg=lambda m, n=name: f"d{n}: {m}")


def test_layer_norm_writes_the_output_dtype_asked_for():
    """Float32 rows normalised into bfloat16: torch's float32 output rounded once (at most one
    unit in the last place apart, where float32 sums round the other way), the input's gradient
    float32 from the bfloat16 gradient."""
    x, w, b, _ = _layer_norm_case((3, 37, 192), torch.float32, 57)
    dy = torch.randn(x.shape, generator=_gen(58)).to(torch.bfloat16)
    out, dx, dw, db = _layer_norm_and_grads(x, w, b, dy, lambda *a: tln.layer_norm(*a, 1e-5, torch.bfloat16))
    ref = _layer_norm_and_grads(x, w, b, dy.float(), lambda *a: torch.nn.functional.layer_norm(a[0], (192,), *a[1:]))
    assert (out.dtype, dx.dtype) == (torch.bfloat16, torch.float32)
    torch.testing.assert_close(out, ref[0].to(torch.bfloat16), atol=1e-6, rtol=2**-7)
    for got, want in zip((dx, dw, db), ref[1:]):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_layer_norm_reads_rows_through_their_stride_and_walks_any_share_of_tiles(monkeypatch):
    """Rows 256 apart (a slice of wider rows: read in place), rows of a transposed view (copied
    to rows), and a backward of a few programs (each walking several tiles): the numbers of
    contiguous rows."""
    x, w, b, dy = _layer_norm_case((3, 37, 192), torch.float32, 51)
    want = _layer_norm_and_grads(x, w, b, dy)
    wide = torch.zeros(3, 37, 256)
    wide[..., :192] = x
    transposed = x.transpose(0, 1).contiguous().transpose(0, 1)
    assert not transposed.is_contiguous()
    monkeypatch.setattr(tln, "multiprocessors", lambda device: 1)  # 3 programs walk the 111 one-row tiles
    monkeypatch.setattr(tln, "BACKWARD_WARPS_PER_SM", 3)
    tln._backward_launch.cache_clear()
    try:
        assert tln.backward_programs(111, 192, torch.device(DEVICE)) == 3
        assert tln._backward_launch(111, 192, torch.device(DEVICE))[0] == 3
        for strided in (wide[..., :192], transposed):
            dy_strided = dy.transpose(0, 1).contiguous().transpose(0, 1)
            for got, expected in zip(_layer_norm_and_grads(strided, w, b, dy_strided), want):
                torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    finally:
        tln._backward_launch.cache_clear()  # the launches of the patched SMs and warps


def test_layer_norm_module_dispatch_and_autocast(monkeypatch):
    """``LayerNorm`` is ``nn.LayerNorm`` (its parameters and state dict) and takes the Triton
    kernels by ``FASTASR_KERNELS``' rules and ``TRITON_LAYER_NORM`` (on by default); under autocast, as torch's
    layer norm: float32 out of half-precision activations on CUDA, their dtype on the CPU."""
    from fastasr.kernels import dispatch
    from fastasr.kernels.layers import layer_norm as ln

    norm = ln.LayerNorm(20).to(DEVICE)
    torch_norm = torch.nn.LayerNorm(20).to(DEVICE)
    torch_norm.load_state_dict(norm.state_dict())
    assert isinstance(norm, torch.nn.LayerNorm) and list(norm.state_dict()) == ["weight", "bias"]
    x = torch.randn(5, 20, device=DEVICE)
    w, b = norm.weight, norm.bias
    monkeypatch.delenv(dispatch.KERNELS_ENV, raising=False)
    cuda = x.device.type == "cuda"
    assert ln.TRITON_LAYER_NORM and ln.uses_triton(x, (20,), w, b) == cuda  # auto: CUDA tensors only
    monkeypatch.setattr(ln, "TRITON_LAYER_NORM", False)
    assert not ln.uses_triton(x, (20,), w, b)  # the switch off: torch's
    monkeypatch.setenv(dispatch.KERNELS_ENV, "reference")
    assert not ln.uses_triton(x, (20,), w, b)
    monkeypatch.setenv(dispatch.KERNELS_ENV, "triton")
    assert ln.uses_triton(x, (20,), w, b)
    assert not ln.uses_triton(x, (20,), None, b)  # no weight, rows too wide, float64, two dims: torch's
    assert not ln.uses_triton(torch.zeros(2, tln.MAX_WIDTH + 1, device=DEVICE), (tln.MAX_WIDTH + 1,),
                              torch.ones(tln.MAX_WIDTH + 1, device=DEVICE), torch.zeros(tln.MAX_WIDTH + 1, device=DEVICE))
    assert not ln.uses_triton(x.double(), (20,), w.double(), b.double())
    assert not ln.uses_triton(x.view(5, 4, 5), (4, 5), w.view(4, 5), b.view(4, 5))
    calls = []
    monkeypatch.setattr(tln._LayerNorm, "apply", lambda *a, apply=tln._LayerNorm.apply: calls.append(1) or apply(*a))
    half = x.to(torch.bfloat16)
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        got, want = norm(half), torch_norm(half)
    assert calls and got.dtype == want.dtype == (torch.float32 if cuda else torch.bfloat16)
    torch.testing.assert_close(got, want, atol=1e-5 if cuda else 1.6e-2, rtol=1e-5 if cuda else 1.6e-2)
    # cast_output: under autocast the Triton kernels' output in autocast's dtype, outside it and
    # by torch's path as nn.LayerNorm's
    norm.cast_output = True
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        assert norm(x).dtype == torch.bfloat16
    assert norm(x).dtype == torch.float32
    monkeypatch.setenv(dispatch.KERNELS_ENV, "reference")
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        assert norm(x).dtype == torch_norm(x).dtype


# ------------------------------------------------------------------ column sums (bias gradients)
tcs = _load("layers.triton_column_sums")


@pytest.mark.parametrize("shape", [(1000, 192), (5, 48), (300, 768), (70, 300)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2), (torch.float16, 2e-3)])
def test_column_sums_equal_torch(shape, dtype, tol):
    """Each column's sum over the rows against float64's, rounded to the rows' dtype: rows over
    more tiles than programs (1,000 rows: 32 tiles), columns over several blocks (768, and 300:
    the last block partly outside)."""
    x = torch.randn(shape, generator=_gen(53)).to(dtype)
    got = tcs.column_sums(x.to(DEVICE)).cpu()
    assert got.dtype == dtype and got.shape == shape[-1:]
    torch.testing.assert_close(got.double(), x.double().sum(0).to(dtype).double(), atol=tol * shape[0] ** 0.5, rtol=tol)


def test_column_sums_read_rows_through_their_stride_and_walk_any_share_of_tiles(monkeypatch):
    """Rows 256 apart (a slice of wider rows: read in place) and a few programs (each walking
    several tiles): the sums of contiguous rows."""
    x = torch.randn(500, 192, generator=_gen(54))
    want = tcs.column_sums(x.to(DEVICE)).cpu()
    wide = torch.zeros(500, 256)
    wide[:, :192] = x
    monkeypatch.setattr(tcs, "multiprocessors", lambda device: 1)  # 3 programs walk the 16 tiles
    assert tcs.column_programs(500, 192, torch.device(DEVICE)) == 3
    torch.testing.assert_close(tcs.column_sums(wide[:, :192].to(DEVICE)).cpu(), want, atol=1e-5, rtol=1e-5)


def test_linear_module_dispatch_and_autocast(monkeypatch):
    """``Linear`` is ``nn.Linear`` (its parameters and state dict); by ``FASTASR_KERNELS``' rules
    and ``TRITON_BIAS_GRADIENTS`` it takes the Triton bias gradient, with torch's numbers: the
    same product forward, the same products backward, the bias's gradient summed in float32;
    under autocast in autocast's dtype, the parameters' gradients float32."""
    from fastasr.kernels import dispatch
    from fastasr.kernels.layers import linear as lin

    layer = lin.Linear(20, 7).to(DEVICE)
    torch_layer = torch.nn.Linear(20, 7).to(DEVICE)
    torch_layer.load_state_dict(layer.state_dict())
    assert isinstance(layer, torch.nn.Linear) and list(layer.state_dict()) == ["weight", "bias"]
    x = torch.randn(3, 5, 20, generator=_gen(56)).to(DEVICE)
    w, b = layer.weight, layer.bias
    monkeypatch.delenv(dispatch.KERNELS_ENV, raising=False)
    cuda = x.device.type == "cuda"
    assert not lin.uses_triton(x, w, b)  # the switch is off
    monkeypatch.setattr(lin, "TRITON_BIAS_GRADIENTS", True)
    assert lin.uses_triton(x, w, b) == cuda  # auto: CUDA tensors only
    monkeypatch.setattr(lin, "TRITON_BIAS_GRADIENTS", False)
    monkeypatch.setenv(dispatch.KERNELS_ENV, "reference")
    assert not lin.uses_triton(x, w, b)
    monkeypatch.setenv(dispatch.KERNELS_ENV, "triton")
    assert lin.uses_triton(x, w, b)
    assert not lin.uses_triton(x, w, None)  # no bias, float64, no rows: torch's
    assert not lin.uses_triton(x.double(), w.double(), b.double())
    assert not lin.uses_triton(x[:0], w, b)
    sums = []
    monkeypatch.setattr(tcs, "column_sums", lambda d, f=tcs.column_sums: sums.append(d.shape) or f(d))
    for autocast in (False, True):
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
            outs = [m(x) for m in (layer, torch_layer)]
        grad = torch.randn(outs[0].shape, generator=_gen(55)).to(DEVICE, outs[0].dtype)
        (got, *got_grads), (want, *want_grads) = (
            [out.detach(), *torch.autograd.grad(out, [m.weight, m.bias], grad)] for out, m in zip(outs, (layer, torch_layer)))
        assert got.dtype == want.dtype == (torch.bfloat16 if autocast else torch.float32)
        assert [g.dtype for g in got_grads] == [torch.float32] * 2
        # the same products (a GPU's library may order the weight gradient's sums otherwise):
        # to the output dtype's rounding
        tol = 2**-7 if autocast else 1e-6
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
        torch.testing.assert_close(got_grads[0], want_grads[0], atol=tol, rtol=tol)
        torch.testing.assert_close(got_grads[1], want_grads[1], atol=1e-2 if autocast else 1e-5, rtol=1e-2)
    assert sums == [(15, 7), (15, 7)]


@pytest.mark.parametrize("autocast", [False, True])
def test_model_through_triton_layer_norm_and_bias_gradients_equals_torch(autocast, monkeypatch):
    """A model whose layer norms and linear layers' bias gradients run the Triton kernels
    (``FASTASR_KERNELS=triton``) gives torch's outputs and parameter gradients; under bfloat16
    autocast too, where its pre-norm layers' norms write bfloat16 for their projections (the
    values the projections cast their float32 output to)."""
    from fastasr.kernels import dispatch
    from fastasr.model import CTCModel

    g = _gen(52)
    feats, lengths = torch.randn(2, 30, 12, generator=g), torch.tensor([30, 17])
    results = {}
    launches = []
    apply, column_sums = tln._LayerNorm.apply, tcs.column_sums
    monkeypatch.setattr(tln._LayerNorm, "apply", lambda *a: launches.append("apply") or apply(*a))
    monkeypatch.setattr(tcs, "column_sums", lambda d: launches.append("column_sums") or column_sums(d))
    for backend in ("reference", "triton"):
        monkeypatch.setenv(dispatch.KERNELS_ENV, backend)
        torch.manual_seed(0)
        model = CTCModel(vocab_size=9, feat_in=12, d_model=32, heads=2, ff_dim=64, layers=2, dropout=0.0,
                         attention="full", subsampling=1, positions="absolute").to(DEVICE)
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
            log_probs, _ = model(feats.to(DEVICE), lengths.to(DEVICE))
        log_probs.float().sum().backward()
        results[backend] = (log_probs.detach().float().cpu(), {n: p.grad.cpu() for n, p in model.named_parameters()})
        if backend == "reference":
            assert not launches
    # 2 layers: 2 norms each and the final one; 6 linear layers each, the input's projection and the head
    assert (launches.count("apply"), launches.count("column_sums")) == (5, 14)
    (ref, ref_grads), (got, got_grads) = results["reference"], results["triton"]
    if not autocast:
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
        for name, grad in got_grads.items():
            torch.testing.assert_close(grad, ref_grads[name], atol=1e-4, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
        return
    # bfloat16: each gradient within 2 % of torch's norm (sums rounded in bfloat16 differ), or of
    # the largest's where torch's is rounding noise (the keys' bias: zero in exact arithmetic)
    torch.testing.assert_close(got, ref, atol=3e-2, rtol=3e-2)
    largest = max(float(grad.norm()) for grad in ref_grads.values())
    errors = {name: float((grad - ref_grads[name]).norm()) / max(float(ref_grads[name].norm()), 1e-3 * largest)
              for name, grad in got_grads.items()}
    assert max(errors.values()) < 0.02, sorted(errors.items(), key=lambda kv: -kv[1])[:3]


# ------------------------------------------------------------------ GELU and dropout in one pass
tgd = _load("layers.triton_gelu_dropout")


@pytest.mark.parametrize("shape", [(3, 7, 40), (2, 1500)])  # the last program partly outside; two programs
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2), (torch.float16, 2e-3)])
def test_gelu_dropout_equals_gelu_times_the_streams_mask(shape, dtype, tol):
    """Values: ``gelu(x) · keep / (1 - p)`` with ``keep_mask``'s mask for the seed (the C++ CPU
    kernel's stream, bit for bit: a dropped element is exactly 0, a kept one its scaled GELU);
    gradients: that expression's, the mask drawn again by the backward (nothing stored), against
    autograd's in float64 (the kept values' zeros are the GELU's own, below about -5.5). A seed past 2^32 (its high word in the stream) and a non-contiguous
    incoming gradient."""
    from fastasr.kernels.layers.dropout import keep_mask

    p, seed = 0.3, 2**40 + 12345
    g = _gen(61)
    x = (2 * torch.randn(shape, generator=g)).to(dtype)
    dy = torch.randn(shape[::-1], generator=g).to(dtype).transpose(0, -1) if len(shape) == 2 else \
        torch.randn(shape, generator=g).to(dtype)
    keep = keep_mask(shape, p, seed)
    x64 = x.double().requires_grad_()
    want = torch.nn.functional.gelu(x64) * keep / (1 - p)
    want.backward(dy.double())
    leaf = x.to(DEVICE).requires_grad_()
    got = tgd.gelu_dropout(leaf, p, seed)
    got.backward(dy.to(DEVICE))
    assert got.dtype == dtype and not bool(got.detach().cpu()[~keep].any())  # dropped: exactly 0
    torch.testing.assert_close(got.detach().cpu().double(), want.detach(), atol=tol, rtol=tol)
    torch.testing.assert_close(leaf.grad.cpu().double(), x64.grad, atol=tol, rtol=tol)
    assert torch.equal(leaf.grad.cpu()[~keep], torch.zeros_like(leaf.grad.cpu()[~keep]))
    with pytest.raises(ValueError, match="p must be in"):
        tgd.gelu_dropout(leaf, 1.0, seed)


def test_gelu_dropout_module_takes_the_kernels_by_the_switch(monkeypatch):
    """``GeluDropout`` runs the kernels by ``FASTASR_KERNELS``' rules and ``TRITON_GELU_DROPOUT``,
    its seed from torch's generator (``manual_seed`` reproduces the mask), GELU alone in eval;
    under autocast in the activations' dtype, as torch's GELU and dropout."""
    from fastasr.kernels import dispatch
    from fastasr.kernels.layers import dropout as dropout_mod

    x = torch.randn(4, 300, generator=_gen(62)).to(DEVICE)
    module = dropout_mod.GeluDropout(0.25)
    calls = []
    monkeypatch.setattr(tgd, "gelu_dropout", lambda *a, run=tgd.gelu_dropout: calls.append(1) or run(*a))
    monkeypatch.setenv(dispatch.KERNELS_ENV, "auto")
    module(x)
    monkeypatch.setattr(dropout_mod, "TRITON_GELU_DROPOUT", True)
    module(x)
    assert len(calls) == (1 if x.device.type == "cuda" else 0)  # auto: CUDA tensors with the switch on
    monkeypatch.setattr(dropout_mod, "TRITON_GELU_DROPOUT", False)
    monkeypatch.setenv(dispatch.KERNELS_ENV, "triton")
    calls.clear()
    torch.manual_seed(3)
    a = module(x)
    torch.manual_seed(3)
    assert torch.equal(module(x), a) and len(calls) == 2
    assert not torch.equal(module(x), a)
    assert torch.equal(module.eval()(x), torch.nn.functional.gelu(x)) and len(calls) == 3
    module.train()
    # while a CUDA graph is captured, torch's (a host-drawn seed would be one mask every replay)
    monkeypatch.setattr(dropout_mod, "_capturing_cuda_graph", lambda: True)
    torch.manual_seed(4)
    captured = module(x)
    torch.manual_seed(4)
    assert len(calls) == 3 and torch.equal(captured, dropout_mod.dropout(torch.nn.functional.gelu(x), 0.25))
    monkeypatch.setattr(dropout_mod, "_capturing_cuda_graph", lambda: False)
    half = x.to(torch.bfloat16)
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        assert module(half).dtype == torch.bfloat16
