"""The C++ CPU kernels (``csrc/*.cpp``): building, loading, and their Python ops.

``make install`` builds them (``fastasr-kernels build``, about 40 s on
2 cores) into ``src/fastasr/kernels/_build/``: one shared library registering the
``torch.ops.fastasr_cpu`` operators and a stamp (source hash, torch version, compiler
flags, the CPU features of the build machine). Loading needs no compiler: the library
is loaded with ``torch.ops.load_library`` after the stamp is checked against this
checkout and this machine.

When the library is missing or stale, :func:`available` returns False and warns once,
saying why and how to build; the dispatcher (:mod:`fastasr.kernels.dispatch`) then runs the
PyTorch reference on CPU tensors (same results, several times slower). Asking for the
C++ kernels explicitly (``FASTASR_KERNELS=native``) raises
:class:`NativeUnavailableError` instead. The build itself fails loudly: a compiler
error stops ``make install`` with the compiler's message.

The clustering ops here are the C++ backend of
:class:`~fastasr.kernels.clustering.backend.ClusteringBackend` (its signatures and shapes; the
ops :data:`fastasr.kernels.dispatch.NATIVE_OPS` names) and give the reference's results (bit
for bit for hashing and K-means; to float rounding for the products). float32 and float64;
half-precision inputs are computed in float32 and returned in their own dtype. ``dropout`` is
:mod:`fastasr.kernels.layers.dropout`'s.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from fastasr.kernels.clustering import reference
from fastasr.kernels.clustering.backend import MAX_BITS

__all__ = [
    "NativeUnavailableError",
    "available",
    "require",
    "build",
    "unavailable_reason",
    "hash_codes",
    "hamming_kmeans",
    "topk_indices",
    "centroid_attention",
    "improved_sparse",
    "dropout",
]

CSRC = Path(__file__).with_name("csrc")
SOURCES = sorted(CSRC.glob("*.cpp"))
BUILD_DIR = Path(__file__).with_name("_build")
LIBRARY = BUILD_DIR / "fastasr_cpu.so"
STAMP = BUILD_DIR / "fastasr_cpu.json"
# -march=native: the AVX-512 popcount of the build machine makes K-means ~5x faster; the
# stamp records the machine's CPU features and loading refuses a CPU that lacks one.
#: Largest E, Ev and K of the fused sparse kernel (kMaxDim in csrc/improved_sparse.cpp);
#: larger sizes run the reference.
MAX_SPARSE_DIM = 256
# -fopenmp: ATen's parallel_for is a header template whose OpenMP pragma is compiled into
# this library; without the flag every kernel runs on one thread whatever
# torch.get_num_threads() says. The library then links libgomp.so.1, which resolves to
# the copy torch has already loaded (one OpenMP runtime, one thread pool).
CFLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fopenmp"]
LDFLAGS = ["-fopenmp"]


class NativeUnavailableError(RuntimeError):
    """The C++ CPU kernels cannot be loaded; the message says why and how to build them."""


# ----------------------------------------------------------------------------- build
def _source_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(CSRC.glob("*.cpp")) + sorted(CSRC.glob("*.h")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _cpu_features() -> list[str]:
    """The CPU feature flags of this machine (``/proc/cpuinfo``; empty where unreadable)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return sorted(line.split(":", 1)[1].split())
    except OSError:
        pass
    return []


def build(verbose: bool = False) -> Path:
    """Compile the C++ kernels into :data:`LIBRARY` and write :data:`STAMP`.

    Uses ``torch.utils.cpp_extension.load`` (ninja and a C++17 compiler). Raises the
    compiler's error if the build fails. Loads the new library into this process. Both files
    are replaced by rename, never rewritten, so that processes running the old library (a
    training run beside ``make install``) go on with it.
    """
    from torch.utils.cpp_extension import load

    BUILD_DIR.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BUILD_DIR, prefix="tmp-") as tmp:
        built = load(
            name="fastasr_cpu",
            sources=[str(p) for p in SOURCES],
            extra_cflags=CFLAGS,
            extra_ldflags=LDFLAGS,
            build_directory=tmp,
            is_python_module=False,
            verbose=verbose,
        )
        # a new file renamed over the old: a process that has the old library mapped (a training
        # run) keeps it, where writing into it in place would crash that process (SIGBUS)
        staged = Path(tmp) / f"staged-{LIBRARY.name}"
        shutil.copyfile(built, staged)
        os.replace(staged, LIBRARY)
        stamp = Path(tmp) / f"staged-{STAMP.name}"
        stamp.write_text(
            json.dumps(
                {
                    "source_sha256": _source_hash(),
                    "torch": torch.__version__,
                    "cflags": CFLAGS,
                    "machine": platform.machine(),
                    "cpu_features": _cpu_features(),
                },
                indent=1,
            )
            + "\n"
        )
        os.replace(stamp, STAMP)
    _load.cache_clear()
    return LIBRARY


# ------------------------------------------------------------------------------ load
_BUILD_HINT = "build them with `make install` or `fastasr-kernels build`"


def _stale_reason() -> str | None:
    """Why the built library must not be loaded here, or None."""
    if not LIBRARY.exists() or not STAMP.exists():
        return f"they are not built ({LIBRARY} missing)"
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError) as exc:
        return f"the build stamp {STAMP} is unreadable ({exc})"
    if stamp.get("source_sha256") != _source_hash():
        return f"the library was built from older sources than {CSRC}"
    if stamp.get("cflags") != CFLAGS:
        return f"the library was built with other compiler flags ({stamp.get('cflags')}, now {CFLAGS})"
    if stamp.get("torch") != torch.__version__:
        return f"the library was built against torch {stamp.get('torch')}, this is {torch.__version__}"
    if stamp.get("machine") != platform.machine():
        return f"the library was built on {stamp.get('machine')}, this is {platform.machine()}"
    missing = sorted(set(stamp.get("cpu_features", [])) - set(_cpu_features()))
    if missing and _cpu_features():
        return (
            "the library was built with -march=native on a CPU with features this one lacks "
            f"({', '.join(missing[:6])}{', ...' if len(missing) > 6 else ''})"
        )
    return None


def _registered() -> bool:
    try:
        torch.ops.fastasr_cpu.hamming_kmeans  # noqa: B018 - raises if not registered
    except (AttributeError, RuntimeError):
        return False
    return True


@functools.lru_cache(maxsize=1)
def _load() -> str | None:
    """Load the library once; None on success, else the reason it cannot be used."""
    if os.environ.get("FASTASR_NATIVE", "").strip() == "0":
        return "FASTASR_NATIVE=0 switches them off"
    if _registered():
        return None
    reason = _stale_reason()
    if reason is not None:
        return reason
    try:
        torch.ops.load_library(str(LIBRARY))
    except (OSError, RuntimeError) as exc:
        return f"loading {LIBRARY} failed ({exc})"
    return None


def unavailable_reason() -> str | None:
    """Why the C++ kernels cannot run here, or None if they can."""
    return _load()


@functools.lru_cache(maxsize=1)
def _warn_once(reason: str) -> None:
    warnings.warn(
        f"fastasr's C++ CPU attention kernels are unavailable: {reason}; {_BUILD_HINT}. "
        "CPU attention runs the PyTorch reference meanwhile (same results, several times slower).",
        RuntimeWarning,
        stacklevel=3,
    )


def available() -> bool:
    """True if the C++ kernels are loaded; else warns once (why, how to build) and returns False."""
    reason = _load()
    if reason is None:
        return True
    _warn_once(reason)
    return False


def require(op: str) -> None:
    """Raise :class:`NativeUnavailableError` if the C++ kernel ``op`` cannot run."""
    reason = _load()
    if reason is not None:
        raise NativeUnavailableError(
            f"fastasr C++ CPU kernel {op!r} cannot run: {reason}; {_BUILD_HINT} "
            "(or use FASTASR_KERNELS=auto to fall back to the PyTorch reference)"
        )


# ------------------------------------------------------------------------------- ops
def _compute(x: torch.Tensor) -> torch.Tensor:
    """float64 stays, float32 stays, half precisions are computed in float32."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _cpu_lengths(lengths: torch.Tensor | None) -> torch.Tensor | None:
    return None if lengths is None else lengths.to(device="cpu", dtype=torch.int64)


def _check_bits(op: str, bits: int) -> None:
    if not 1 <= bits <= MAX_BITS:
        raise ValueError(f"{op}: {bits} bits; expected 1..{MAX_BITS} (one int64 per code)")


def hash_codes(
    x: torch.Tensor, planes: torch.Tensor, lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """Sign-random-projection codes ``(B, H, N)`` int64 (``ClusteringBackend.hash_codes``)."""
    require("hash_codes")
    _check_bits("hash_codes", planes.shape[-1])
    return torch.ops.fastasr_cpu.hash_codes(x.detach(), planes, _cpu_lengths(lengths))


def hamming_kmeans(
    codes: torch.Tensor,
    lengths: torch.Tensor | None,
    clusters: int,
    iterations: int,
    generator: torch.Generator | None = None,
    *,
    bits: int = MAX_BITS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K-means in Hamming space (``ClusteringBackend.hamming_kmeans``), bit for bit the reference's."""
    del generator
    require("hamming_kmeans")
    _check_bits("hamming_kmeans", bits)
    return torch.ops.fastasr_cpu.hamming_kmeans(
        codes, _cpu_lengths(lengths), clusters, iterations, bits
    )


def topk_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``(..., k)`` of the ``k`` largest entries of each row, in no particular order."""
    require("topk_indices")
    return torch.ops.fastasr_cpu.topk_indices(_compute(scores.detach()), k)


class _CentroidAttention(torch.autograd.Function):
    """The fused per-(batch, head) centroid attention and its backward (csrc/centroid_attention.cpp)."""

    @staticmethod
    def forward(ctx, centroids, k, v, lengths, scale, topk):
        values, top_w, top_idx, lse = torch.ops.fastasr_cpu.centroid_attention_forward(
            centroids, k, v, lengths, scale, topk
        )
        ctx.save_for_backward(centroids, k, v, top_idx, lse)
        ctx.lengths, ctx.scale = lengths, scale
        ctx.mark_non_differentiable(top_idx)
        return values, top_w, top_idx

    @staticmethod
    def backward(ctx, d_values, d_top_w, _):
        centroids, k, v, top_idx, lse = ctx.saved_tensors
        if d_values is None:
            d_values = torch.zeros(*centroids.shape[:3], v.shape[-1], dtype=v.dtype)
        d_centroids, d_k, d_v = torch.ops.fastasr_cpu.centroid_attention_backward(
            d_values.contiguous(), d_top_w, centroids, k, v, ctx.lengths, ctx.scale, top_idx, lse
        )
        return d_centroids, d_k, d_v, None, None, None


def centroid_attention(
    centroids: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor | None,
    scale: float,
    topk: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each centroid's attention over the keys (``ClusteringBackend.centroid_attention``).

    Per (batch, head): BLAS products into a reused ``(C, N)`` buffer around one C++
    pass per row (scale, mask, top-k, softmax); the ``(B, H, C, N)`` matrix is never
    stored, the backward recomputes it from the saved log-sum-exp.
    """
    require("centroid_attention")
    dtype = v.dtype
    dt = torch.float64 if centroids.dtype == torch.float64 else torch.float32
    centroids, k, v = (t.to(dt).contiguous() for t in (centroids, k, v))
    values, top_w, top_idx = _CentroidAttention.apply(
        centroids, k, v, _cpu_lengths(lengths), float(scale), int(topk)
    )
    return values.to(dtype), top_w, top_idx


class _ImprovedSparse(torch.autograd.Function):
    """Autograd of the fused sparse part; the backward reads the saved softmax."""

    @staticmethod
    def forward(ctx, q, k, v, values, top_w, top_idx, assignments, lengths, scale):
        out, p = torch.ops.fastasr_cpu.improved_sparse_forward(
            q, k, v, values, top_w, top_idx, assignments, lengths, scale
        )
        ctx.save_for_backward(q, k, v, top_w, top_idx, assignments, p)
        ctx.lengths, ctx.scale = lengths, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, top_w, top_idx, assignments, p = ctx.saved_tensors
        dq, dk, dv, dvalues, dtop_w = torch.ops.fastasr_cpu.improved_sparse_backward(
            grad, q, k, v, top_w, top_idx, assignments, ctx.lengths, p, ctx.scale
        )
        return dq, dk, dv, dvalues, dtop_w, None, None, None, None


def improved_sparse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    values: torch.Tensor,
    top_w: torch.Tensor,
    top_idx: torch.Tensor,
    assignments: torch.Tensor,
    lengths: torch.Tensor | None,
    scale: float,
    *,
    counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """The fused per-query part of improved clustered attention (``ClusteringBackend.improved_sparse``)
    (``counts``: unused, the C++ kernel groups the queries itself)."""
    require("improved_sparse")
    if max(q.shape[-1], v.shape[-1], top_idx.shape[-1]) > MAX_SPARSE_DIM:
        return reference.improved_sparse(
            q, k, v, values, top_w, top_idx, assignments, lengths, scale
        )
    dtype = v.dtype
    q, k, v, values, top_w = (_compute(t) for t in (q, k, v, values, top_w))
    dt = torch.promote_types(q.dtype, top_w.dtype)
    q, k, v, values, top_w = (t.to(dt) for t in (q, k, v, values, top_w))
    out = _ImprovedSparse.apply(
        q, k, v, values, top_w, top_idx, assignments, _cpu_lengths(lengths), float(scale)
    )
    return out.to(dtype)


class _Dropout(torch.autograd.Function):
    """Dropout with the counter-based mask of csrc/dropout.cpp; the backward reads the saved mask."""

    @staticmethod
    def forward(ctx, x, p, seed):
        out, keep = torch.ops.fastasr_cpu.dropout_forward(x, p, seed)
        ctx.save_for_backward(keep)
        ctx.p = p
        return out

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return torch.ops.fastasr_cpu.dropout_backward(grad, keep, ctx.p), None, None


def dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """``x * keep / (1 - p)`` with ``keep`` = ``fastasr.kernels.layers.dropout.keep_mask(x.shape, p, seed)``.

    On all of torch's threads; the mask (one byte an element) is what the backward keeps.
    ``p`` in ``[0, 1)``, ``seed`` any int64.
    """
    require("dropout")
    return _Dropout.apply(x, float(p), int(seed))


# ------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    """``fastasr-kernels build|check`` (:mod:`fastasr.cli.kernels`)."""
    parser = argparse.ArgumentParser(prog="fastasr-kernels", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["build", "check"], help="build the kernels, or say whether they load")
    parser.add_argument("--verbose", action="store_true", help="show the compiler commands")
    args = parser.parse_args(argv)
    if args.command == "build":
        print(f"building fastasr C++ CPU kernels ({len(SOURCES)} files, {' '.join(CFLAGS)}) ...", flush=True)
        path = build(verbose=args.verbose)
        print(f"built {path}")
    reason = unavailable_reason()
    if reason is not None:
        print(f"fastasr C++ CPU kernels unavailable: {reason}", file=sys.stderr)
        return 1
    print("fastasr C++ CPU kernels: loaded")
    return 0
