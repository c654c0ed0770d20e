"""The host's work for one encoder layer's training step, each attention: kernel launches and
host synchronisations, counted (no clock).

    python -m benchmarks.gpu.launches                       # CUDA where there is one, else the CPU
    python -m benchmarks.gpu.launches --specs full i-clustered-100 --length 800 --batch 2

One layer of the paper's model (``EncoderLayer``: 6 heads × 32 = 192, feed-forward 768, dropout
0.1, pre-norm; shared queries and keys for LSH) in training mode, its forward under bf16 autocast
(``--precision``; Lightning's ``bf16-mixed`` on a GPU) and its backward from a random gradient,
on ``--batch`` hidden-state sequences of ``--length`` positions, the last ``length // 2`` long
(so the padding paths run). Each attention of the registry is a row, the floor (the inner
attention replaced by the identity, ``step/cpu.py``'s) another, and full attention with torch's
layer norms (``bench_io.KERNEL_SWITCHES`` "torch layer norm") a third; a second table counts one
layer norm call by torch and by the Triton kernels. :class:`LaunchProbe` counts, forward and
backward apart:

* **aten launches**: the aten operators the step dispatches (``TorchDispatchMode``) that launch
  device work, one each: every operator but views (an output aliasing an input,
  ``OpOverload.is_view``), allocations and metadata (:data:`NO_KERNEL_OPS`), and the reads of
  :data:`SYNCING_OPS`. One operator may launch more than one kernel (cuBLAS, SDPA) and
  a fill or a copy is one: the count is of the host's calls into torch, what it pays per launch;
* **Triton launches**: the Triton kernels the project launches (``JITFunction.run``, or
  ``InterpretedFunction.run`` under the interpreter; aten operators inside a launch are the
  launcher's, not counted);
* **host syncs**: the reads that wait for the device, :data:`SYNCING_OPS` (``.item()``,
  ``.tolist()``, ``bool(t)``, ``int(t)``; data-dependent shapes: ``nonzero``, ``masked_select``,
  ``unique``, boolean-mask indexing, ``repeat_interleave`` without ``output_size``; ``equal``) and
  copies from the device to the host (``.cpu()``, ``.to("cpu")``), each with where in fastasr
  it was called.

On CUDA (``make gpu-check``) that is the GPU's own path. On a CPU the CPU stands in for the
device: the Triton kernels run in the interpreter (``TRITON_INTERPRET=1``, set here before
Triton loads) through ``FASTASR_KERNELS=triton`` (``bench_io.use_interpreted_kernels``, as the
kernel tests do), and :func:`as_on_cuda` makes the choices that read the device take CUDA's:
each op's switch (``auto_triton``) honoured, clustered's centroid values by one SDPA call, full
attention in half precision. What the stand-in cannot take is CUDA's lengths check: a host read
of CPU lengths where CUDA asserts on the device (:data:`CPU_ONLY_READS`, listed, not counted; its
four device kernels not counted either); its aten counts are the CPU's autocast's and SDPA's. A
``.cpu()`` of a CPU tensor dispatches nothing, so only a CUDA run sees those.

Writes ``benchmarks/results/launches_<machine>.{md,json}``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import bench_io

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402  (torch loads no Triton: TRITON_INTERPRET can still be set after it)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

#: aten operators that read a device value back to the host: a synchronisation on a GPU.
SYNCING_OPS = frozenset({
    "aten::_local_scalar_dense",  # .item(), .tolist(), bool(t), int(t), float(t)
    "aten::is_nonzero", "aten::equal",
    # an output whose shape is a device value
    "aten::nonzero", "aten::masked_select", "aten::_unique", "aten::_unique2", "aten::unique_dim",
    "aten::unique_consecutive", "aten::_unique_consecutive",
})
#: aten operators that launch no kernel besides the views (``OpOverload.is_view``): allocations,
#: metadata, the profiler's markers.
NO_KERNEL_OPS = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided",
    "aten::_unsafe_view", "aten::_reshape_alias", "aten::resize_", "aten::set_", "aten::sym_size",
    "aten::sym_stride", "aten::sym_numel", "aten::is_same_size", "aten::result_type", "aten::promote_types",
    "aten::_has_compatible_shallow_copy_type", "aten::record_stream",
    "profiler::_record_function_enter_new", "profiler::_record_function_exit",
})
#: Host reads that only the CPU stand-in makes (``function``: why): on CUDA the same code takes
#: another branch that reads nothing back.
CPU_ONLY_READS = {
    "check_lengths": "lengths on the CPU are checked on the host; on CUDA by a device-side assert",
}
FLOOR = "floor"
#: The rows: every variant of the registry (``auto`` as configured, ``conf/attention/auto.yaml``:
#: i-clustered from 512 positions), then the floor.
DEFAULT_SPECS = ("full", "lsh-1", "lsh-4", "clustered-100", "i-clustered-100", "topk-32", "auto-512", FLOOR)
#: Rows with kernel switches (``bench_io.KERNEL_SWITCHES``) besides the defaults.
SWITCHED_ROWS = (("full", ("torch layer norm",)),)
ATEN, TRITON = "aten", "triton"
#: The paper model's layer: 6 heads × 32, feed-forward 768.
D_MODEL, HEADS, FF_DIM = 192, 6, 768


def _location() -> str:
    """``file:line (function)`` of the innermost fastasr frame of the current stack."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/fastasr/" in frame.filename and "/benchmarks/" not in frame.filename:
            return f"{frame.filename.split('/fastasr/', 1)[1]}:{frame.lineno} ({frame.name})"
    return "outside fastasr"


def _syncs(func, args, kwargs, stand_in: bool) -> bool:
    """Whether ``func(*args, **kwargs)`` waits for the device (module doc): a read of
    :data:`SYNCING_OPS` or a copy to the host with a CUDA tensor among its arguments, or any
    tensor where the CPU stands in for the device (``stand_in``)."""
    name = func._schema.name
    if name in ("aten::_to_copy", "aten::copy_"):  # a device's values copied to the host
        src, dst = (args[0], kwargs.get("device")) if name == "aten::_to_copy" else (args[1], args[0].device)
        return (isinstance(src, torch.Tensor) and src.device.type == "cuda" and dst is not None
                and torch.device(dst).type == "cpu")
    if name == "aten::index":  # boolean-mask indexing: nonzero inside
        reads = any(t is not None and t.dtype == torch.bool for t in args[1])
    elif name == "aten::repeat_interleave":  # repeats given, its output's size not
        reads = func._overloadname in ("Tensor", "self_Tensor") and kwargs.get("output_size") is None
    else:
        reads = name in SYNCING_OPS
    return reads and (stand_in or any(isinstance(t, torch.Tensor) and t.is_cuda for t in tree_leaves(args)))


@dataclass
class Counts:
    """What one phase (forward or backward) issued."""

    aten: dict[str, int] = field(default_factory=dict)
    triton: dict[str, int] = field(default_factory=dict)
    syncs: list[tuple[str, str]] = field(default_factory=list)  # (operator, where)
    cpu_only: list[tuple[str, str]] = field(default_factory=list)  # CPU_ONLY_READS met

    def total(self, kind: str) -> int:
        return sum((self.aten if kind == ATEN else self.triton).values())


class LaunchProbe:
    """Counts what the host issues inside ``with LaunchProbe() as probe:`` (module doc): aten
    operators that launch a kernel (``probe.aten``, by operator), Triton launches
    (``probe.triton``, by kernel: ``module.name``), reads that synchronise (``probe.syncs``,
    operator names) and copies (``probe.copies``: operator and shape). ``probe.phase(name)``
    starts a new :class:`Counts` (``probe.counts[name]``). ``stand_in``: the CPU stands in for
    the device, so a read of any tensor synchronises (else a read of a CUDA tensor), and a host
    read inside a :data:`CPU_ONLY_READS` function is set apart, not counted."""

    def __init__(self, stand_in: bool = False):
        self.stand_in = stand_in
        self.counts: dict[str, Counts] = {}
        self.current = self.phase("all")
        self.copies: list[tuple[str, tuple[int, ...]]] = []
        self._in_triton = False
        self._patched: list[tuple[type, object]] = []
        probe = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if not probe._in_triton:
                    probe._record(func, args, kwargs)
                return func(*args, **kwargs)

        self._mode = _Mode()

    # the totals of every phase, for callers that count one
    @property
    def aten(self) -> dict[str, int]:
        return self.current.aten

    @property
    def triton(self) -> dict[str, int]:
        return self.current.triton

    @property
    def syncs(self) -> list[str]:
        return [name for name, _ in self.current.syncs]

    def phase(self, name: str) -> Counts:
        self.current = self.counts[name] = Counts()
        return self.current

    def _record(self, func, args, kwargs) -> None:
        name = func._schema.name
        counts = self.current
        if _syncs(func, args, kwargs, self.stand_in):
            where = _location()
            cpu_only = self.stand_in and any(f"({fn})" in where for fn in CPU_ONLY_READS)
            (counts.cpu_only if cpu_only else counts.syncs).append((name, where))
        elif not func.is_view and name not in NO_KERNEL_OPS:
            counts.aten[name] = counts.aten.get(name, 0) + 1
        if name in ("aten::copy_", "aten::clone", "aten::_to_copy", "aten::contiguous"):
            self.copies.append((name, tuple(args[0].shape)))

    def _launcher_types(self) -> list[type]:
        types = []
        with contextlib.suppress(ImportError):
            from triton.runtime.jit import JITFunction

            types.append(JITFunction)
        with contextlib.suppress(ImportError):
            from triton.runtime.interpreter import InterpretedFunction

            types.append(InterpretedFunction)
        return types

    def __enter__(self) -> LaunchProbe:
        probe = self
        for cls in self._launcher_types():
            run = cls.__dict__["run"]

            def counted(fn, *args, _run=run, **kwargs):
                if kwargs.get("warmup"):  # a compile without a launch
                    return _run(fn, *args, **kwargs)
                kernel = f"{getattr(fn, 'fn', fn).__module__.rsplit('.', 1)[-1]}.{fn.__name__}"
                probe.current.triton[kernel] = probe.current.triton.get(kernel, 0) + 1
                probe._in_triton = True
                try:
                    return _run(fn, *args, **kwargs)
                finally:
                    probe._in_triton = False

            cls.run = counted
            self._patched.append((cls, run))
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        for cls, run in self._patched:
            cls.run = run
        self._patched.clear()


@contextlib.contextmanager
def as_on_cuda():
    """On the CPU under ``FASTASR_KERNELS=triton``: the choices that read the device take CUDA's
    (module doc). Each fastasr module's ``kernel_backend`` honours the op's ``auto_triton``
    switch, as ``auto`` does on CUDA; clustered's centroid values are one SDPA call; full
    attention runs half-precision inputs as they are."""
    from fastasr.attention import full
    from fastasr.kernels import availability, dispatch
    from fastasr.kernels.clustering import ops

    for module in set(dispatch.TRITON_MODULES.values()):  # imported now: their import-time work uncounted
        availability.import_kernel_module(module)
    chosen = dispatch.kernel_backend

    def backend(x, op="hash_codes", *, auto_triton=True):
        return chosen(x, op) if auto_triton else "reference"

    def fused_values(k):
        return k.dtype in (torch.float16, torch.bfloat16, torch.float32) and dispatch.kernel_choice() != "reference"

    with contextlib.ExitStack() as stack:
        for name, module in list(sys.modules.items()):
            if module is not dispatch and getattr(module, "kernel_backend", None) is chosen and name.startswith("fastasr."):
                stack.enter_context(mock_attr(module, "kernel_backend", backend))
        stack.enter_context(mock_attr(ops, "fused_centroid_attention_applies", fused_values))
        stack.enter_context(mock_attr(full, "attends_in_float32", lambda q: False))
        yield


def mock_attr(obj, name: str, value):
    from unittest import mock

    return mock.patch.object(obj, name, value)


@dataclass
class Row:
    name: str
    forward: Counts
    backward: Counts


def build_layer(spec: str, device: torch.device, seed: int = 0):
    """The paper model's encoder layer with ``spec``'s inner attention (the identity for the
    floor), in training mode."""
    from benchmarks.step.cpu import IdentityAttention
    from fastasr.model.encoder import EncoderLayer

    torch.manual_seed(seed)
    floor = spec == FLOOR
    layer = EncoderLayer(D_MODEL, HEADS, FF_DIM, attention="full" if floor else spec, shared_qk=spec.startswith("lsh"),
                         dropout=0.1)
    if floor:
        layer.attn.inner = IdentityAttention()
    return layer.to(device).train()


def count_layer(spec: str, switches: tuple[str, ...], args, device: torch.device) -> Row:
    """One forward + backward of the layer, counted."""
    layer = build_layer(spec, device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.length, D_MODEL, generator=g).to(device).requires_grad_()
    lengths = torch.full((args.batch,), args.length, dtype=torch.int64)
    if args.batch > 1:
        lengths[-1] = args.length // 2
    lengths = lengths.to(device)
    grad = torch.randn(args.batch, args.length, D_MODEL, generator=g).to(device)
    dtype = {"bf16": torch.bfloat16, "fp32": None}[args.precision]

    def step(probe: LaunchProbe | None = None):
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            if probe:
                probe.phase("forward")
            out = layer(x, lengths)
        if probe:
            probe.phase("backward")
        out.backward(grad.to(out.dtype))
        layer.zero_grad(set_to_none=True)
        x.grad = None

    with bench_io.switched_on(switches), _stand_in(device):
        for _ in range(args.warmup):  # Triton's compiles, the launchers' caches
            step()
        with LaunchProbe(stand_in=device.type != "cuda") as probe:
            step(probe)
    return Row(bench_io.switched_label(spec, switches), probe.counts["forward"], probe.counts["backward"])


def count_layer_norm(triton: bool, args, device: torch.device) -> Row:
    """One pre-norm layer norm (``cast_output``) of the layer's input, forward + backward."""
    from fastasr.kernels.layers.layer_norm import LayerNorm

    norm = LayerNorm(D_MODEL, cast_output=True).to(device)
    x = torch.randn(args.batch, args.length, D_MODEL).to(device).requires_grad_()
    dtype = {"bf16": torch.bfloat16, "fp32": None}[args.precision]
    switches = () if triton else ("torch layer norm",)
    with bench_io.switched_on(switches), _stand_in(device):
        for _ in range(args.warmup + 1):
            with LaunchProbe(stand_in=device.type != "cuda") as probe:
                probe.phase("forward")
                with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                    out = norm(x)
                probe.phase("backward")
                out.float().sum().backward()
    return Row("Triton layer norm" if triton else "torch layer norm", probe.counts["forward"], probe.counts["backward"])


def _stand_in(device: torch.device):
    return as_on_cuda() if device.type != "cuda" else contextlib.nullcontext()


def _cell(row: Row) -> list[str]:
    f, b = row.forward, row.backward
    syncs = len(f.syncs) + len(b.syncs)
    return [str(f.total(ATEN)), str(b.total(ATEN)), str(f.total(TRITON)), str(b.total(TRITON)), str(syncs)]


def _kernels(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} ×{n}" if n > 1 else k for k, n in sorted(counts.items())) or "none"


def _kmeans_line(args) -> str:
    """How K-means launches for this batch (``triton_kmeans.spans_per_sequence``): its launches
    depend on the sequences a call holds."""
    from fastasr.kernels.availability import import_kernel_module
    from fastasr.kernels.grid import cdiv

    tk = import_kernel_module("clustering.triton_kmeans")
    sequences = args.batch * HEADS
    if tk.spans_per_sequence(sequences, args.length) == 1:
        return f"K-means (clustered, i-clustered): {sequences} sequences, every Lloyd iteration in one launch."
    return (f"K-means (clustered, i-clustered): {sequences} sequences, under `triton_kmeans.ONE_LAUNCH_FROM` = "
            f"{tk.ONE_LAUNCH_FROM}: each split over programs, two launches an iteration; a batch of "
            f"{cdiv(tk.ONE_LAUNCH_FROM, HEADS)} or more (training's at N = 800: 80) takes one launch.")


def write_table(rows: list[Row], norms: list[Row], args, info: dict, device: torch.device) -> Path:
    head = ["| row | aten launches fwd | aten launches bwd | Triton launches fwd | Triton launches bwd | host syncs |",
            "|---|---:|---:|---:|---:|---:|"]
    where = ("CUDA: the GPU's own path" if device.type == "cuda" else
             "the CPU standing in for CUDA: the Triton kernels interpreted, the device's choices CUDA's "
             "(`as_on_cuda`); aten counts by the CPU's autocast and SDPA")
    lines = [
        f"# Launches and host syncs: one encoder layer's training step, {info['slug']}", "",
        bench_io.command_line("gpu/launches.py"), "",
        f"{datetime.date.today()}, torch {torch.__version__}, commit {bench_io.git_commit(ROOT)}; {where}.",
        f"The paper model's layer (6 heads × 32, feed-forward 768, dropout 0.1, pre-norm), {args.batch} "
        f"sequences of {args.length} positions (the last {args.length // 2}), forward under "
        f"{'bf16 autocast' if args.precision == 'bf16' else 'float32'} and backward; counted, not timed "
        "(`benchmarks/gpu/launches.py`: which aten operators count, which reads are syncs).", "",
        *head, *(f"| {r.name} | " + " | ".join(_cell(r)) + " |" for r in rows), "",
        _kmeans_line(args), "",
        "One layer norm call (`LayerNorm(192, cast_output=True)`, a layer holds two):", "",
        *head, *(f"| {r.name} | " + " | ".join(_cell(r)) + " |" for r in norms), "",
        "Triton kernels by row (forward; backward):", "",
        *(f"- {r.name}: {_kernels(r.forward.triton)}; {_kernels(r.backward.triton)}" for r in rows + norms),
    ]
    synced = [(r.name, s) for r in rows + norms for s in r.forward.syncs + r.backward.syncs]
    lines += ["", "Host syncs: " + ("none." if not synced else "")]
    lines += [f"- {name}: `{op}` at {where}" for name, (op, where) in synced]
    cpu_only = sorted({s for r in rows + norms for s in r.forward.cpu_only + r.backward.cpu_only})
    if cpu_only:
        lines += ["", "Host reads of the CPU stand-in's own branches (not counted; `CPU_ONLY_READS`):"]
        lines += [f"- `{op}` at {where}" for op, where in cpu_only]
    stem = bench_io.result_stem(args.out_dir, "launches", info)
    stem.with_suffix(".json").write_text(json.dumps({
        "machine": info, "device": device.type, "batch": args.batch, "length": args.length,
        "precision": args.precision, "commit": bench_io.git_commit(ROOT),
        "layers": [_as_dict(r) for r in rows], "layer_norms": [_as_dict(r) for r in norms]}, indent=1) + "\n")
    path = stem.with_suffix(".md")
    path.write_text("\n".join(lines) + "\n")
    return path


def _as_dict(row: Row) -> dict:
    return {"name": row.name, **{phase: {"aten": c.aten, "triton": c.triton, "syncs": c.syncs, "cpu_only": c.cpu_only}
                                 for phase, c in (("forward", row.forward), ("backward", row.backward))}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="auto: CUDA where there is one, else the CPU standing in (the Triton interpreter)")
    p.add_argument("--specs", nargs="+", default=list(DEFAULT_SPECS), help=f"attention specs, or {FLOOR}")
    p.add_argument("--length", type=int, default=800)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--warmup", type=int, default=None, help="uncounted steps first (default: 1 on CUDA, 0 on a CPU)")
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args(argv)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise SystemExit("gpu/launches.py --device cuda: torch.cuda.is_available() is False")
    if not cuda:
        if "triton" not in sys.modules:
            os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton and the kernels load
        if not bench_io.use_interpreted_kernels("gpu/launches.py"):
            raise SystemExit(2)
    device = torch.device("cuda" if cuda else "cpu")
    if args.warmup is None:
        args.warmup = 1 if cuda else 0
    rows = []
    for spec, switches in [(s, ()) for s in args.specs] + [r for r in SWITCHED_ROWS if r[0] in args.specs]:
        rows.append(count_layer(spec, switches, args, device))
        print(f"{rows[-1].name}: " + " / ".join(_cell(rows[-1])), flush=True)
    norms = [count_layer_norm(triton, args, device) for triton in (False, True)]
    print(f"wrote {write_table(rows, norms, args, bench_io.machine_info(device), device)}")


if __name__ == "__main__":
    main()
