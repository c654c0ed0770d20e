"""One training step of the paper's model on a GPU: each attention against the floor.

    python -m benchmarks.step.gpu                          # N = 800 and 3200, 64,000 frames a batch
    python -m benchmarks.step.gpu --lengths 800 --profile i-clustered-100 clustered-100 floor
    TRITON_INTERPRET=1 python -m benchmarks.step.gpu --device cpu --lengths 64 --frames 128 \
        --layers 1 --rounds 1                                # the plumbing on the CPU

The model and batch are ``step/cpu.py``'s (9 layers of 6 heads × 32, ff 768, no subsampling,
absolute positions, dropout 0.1; ``B = frames // N`` utterances, the last ``N // 2`` long, random
targets of ``N // 8`` units). A step: forward under bf16 autocast (Lightning's ``bf16-mixed``),
CTC in fp32, backward, clipping at 10, RAdam (and, in a second table, the GPU's kernels of one step
alone: the step without the host's share; in a third, the step less its kernels: what the GPU waited
for the host). Variants: ``full`` (the path
``fastasr.attention.full`` chooses for the batch), ``full, key mask``, ``full, varlen``, ``full,
packed`` and ``full, dense`` (that path forced, ``forced_padded_path``), the clustered variants,
and the *floor* (the inner attention replaced by the identity), and last clustered-100 with its
centroid values by the split-key kernels, the hash inside K-means and the varlen centroid values,
and the floor and full attention with the model's layer norms and its linear layers' bias
gradients by the Triton kernels, with its pre-norm layer norms' outputs cast once to bf16 for
the projections that read them, and with its feed-forward's GELU and dropout in one Triton pass
(``bench_io.KERNEL_SWITCHES``; the switch and the forced path
hold for the whole step, forward and backward: a backward reads them when it runs), and last
full, clustered-100, i-clustered-100 and the floor with the step captured as CUDA graphs as
training captures it (:class:`CapturedStepper`: what the step takes without the host issuing its
launches), the floor and full with each of the model's own kernel switches captured likewise
(the step as training runs it on a GPU, where each switch is decided too), and
i-clustered-100 and the floor with the update alone replayed as one (:class:`UpdateGraphedStepper`:
what training can capture whatever its batches' shapes). Median of
``--rounds`` CUDA-synchronised steps after 2 warm-ups, each variant in turn (the graphed ones after
every eager one, so a capture that fails cannot spoil another column). ``--profile SPEC
[SPEC ...]``: torch.profiler's largest CUDA kernels of one step of each, on a GPU also its
operators by their host time (a step that waits for the host: where its CPU time goes).

Writes ``benchmarks/results/gpu_step_<gpu>.md`` (and ``gpu_step_profile_<gpu>.txt``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import statistics
import sys
import warnings
from pathlib import Path

from benchmarks import bench_io, timing
from benchmarks.step.cpu import (  # one training step for all the step benchmarks
    FLOOR,
    build_model,
    make_batch,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from fastasr.attention.full import forced_padded_path, padded_path  # noqa: E402
from fastasr.training.captured_step import CapturedSteps  # noqa: E402
from fastasr.training.graph_backends import CudaGraphs, EagerGraphs  # noqa: E402
from fastasr.training.update_guard import DeviceUpdateGuard  # noqa: E402

#: A column's suffix where the step is captured as CUDA graphs (:class:`CapturedStepper`), and
#: where its update alone is (:class:`UpdateGraphedStepper`): :data:`FORMS`.
AS_GRAPHS = ", as CUDA graphs"
UPDATE_AS_GRAPH = ", update as a CUDA graph"

#: column -> (attention spec, forced padded path of full attention or None, the kernels'
#: switches set, ``bench_io.KERNEL_SWITCHES``)
VARIANTS = {
    "full": ("full", None, ()),
    "full, key mask": ("full", "mask", ()),
    "full, varlen": ("full", "varlen", ()),
    "full, packed": ("full", "packed", ()),
    "full, dense": ("full", "dense", ()),
    "clustered-100": ("clustered-100", None, ()),
    "i-clustered-100": ("i-clustered-100", None, ()),
    FLOOR: (FLOOR, None, ()),
    # last: the kernels' alternatives to the defaults
    "clustered-100, split-key centroid values": ("clustered-100", None, ("split-key centroid values",)),
    "clustered-100, hash inside K-means": ("clustered-100", None, ("hash inside K-means",)),
    "clustered-100, varlen centroid values": ("clustered-100", None, ("varlen centroid values",)),
    # the model's own kernels: its layer norms by torch (Triton's by default), its bias gradients
    # by Triton, in the floor and with full attention
    "floor, torch layer norm": (FLOOR, None, ("torch layer norm",)),
    "full, torch layer norm": ("full", None, ("torch layer norm",)),
    "floor, Triton bias gradients": (FLOOR, None, ("Triton bias gradients",)),
    "full, Triton bias gradients": ("full", None, ("Triton bias gradients",)),
    "floor, norms cast once": (FLOOR, None, ("norms cast once",)),
    "full, norms cast once": ("full", None, ("norms cast once",)),
    "floor, Triton GELU dropout": (FLOOR, None, ("Triton GELU dropout",)),
    "full, Triton GELU dropout": ("full", None, ("Triton GELU dropout",)),
    # the defaults' step captured as CUDA graphs as training captures it (CapturedStepper)
    f"full{AS_GRAPHS}": ("full", None, ()),
    f"clustered-100{AS_GRAPHS}": ("clustered-100", None, ()),
    f"i-clustered-100{AS_GRAPHS}": ("i-clustered-100", None, ()),
    f"{FLOOR}{AS_GRAPHS}": (FLOOR, None, ()),
    # the model's own kernel switches in the captured step, which is what training runs on a GPU
    **{f"{spec}, {switch}{AS_GRAPHS}": (spec, None, (switch,))
       for switch in ("torch layer norm", "Triton bias gradients", "norms cast once", "Triton GELU dropout")
       for spec in (FLOOR, "full")},
    # the eager step with its update (clipping, RAdam) replayed as a CUDA graph: what training can
    # capture whatever its batches' shapes
    f"i-clustered-100{UPDATE_AS_GRAPH}": ("i-clustered-100", None, ()),
    f"{FLOOR}{UPDATE_AS_GRAPH}": (FLOOR, None, ()),
}


def _form(name: str) -> str:
    """A column's way of running the step besides eager (a suffix of :data:`FORMS`), or ""."""
    return next((suffix for suffix in FORMS if suffix and name.endswith(suffix)), "")


#: Where the steps run: the GPU, or (--device cpu, under TRITON_INTERPRET=1) the CPU with the
#: Triton kernels interpreted, a plumbing check of this script whose times mean nothing.
DEVICE = torch.device("cuda")


class GpuStepper:
    #: Whether a CUDA graph captures the update: torch's ``capturable`` RAdam (on CUDA).
    CAPTURABLE = False

    def __init__(self, spec: str, path: str | None, switches: tuple[str, ...], layers: int):
        self.model = build_model(spec, layers).to(DEVICE)
        self.optim = torch.optim.RAdam(self.model.parameters(), lr=1e-4, weight_decay=0.01,
                                       capturable=self.CAPTURABLE and DEVICE.type == "cuda")
        self.path = path
        self.switches = switches
        self._host_of, self._host = None, None  # the batch's lengths and their host copies (ctc)

    def kernel_ms(self, batch) -> float | str:
        """Milliseconds the GPU's kernels of one step take in all (torch.profiler's sum of
        their self times): the step without the host's share, what a step captured as a CUDA
        graph would come near. "CUDA only" elsewhere."""
        if DEVICE.type != "cuda":
            return "CUDA only"
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            self.step(batch)
        return bench_io.kernel_ms(prof.key_averages())

    def settings(self) -> contextlib.ExitStack:
        """The variant's forced path of full attention and kernel switches, held while it runs
        (a backward reads them when it runs too)."""
        stack = contextlib.ExitStack()
        if self.path:
            stack.enter_context(forced_padded_path(self.path))
        stack.enter_context(bench_io.switched_on(self.switches))
        return stack

    def ctc(self, log_probs, batch) -> torch.Tensor:
        """Training's loss: CTC in fp32 over the model's log-probabilities, its lengths read on
        the host as training's (``lit.HostLengths``: given the device's, torch's CUDA CTC copies
        them back, a host synchronisation a step). The model has no subsampling: its output
        lengths are the batch's. The host copies are made at a batch's first step."""
        _, lengths, targets, target_lengths = batch
        if self._host_of is not lengths:
            self._host_of, self._host = lengths, (lengths.cpu(), target_lengths.cpu())
        return nn.functional.ctc_loss(log_probs.float().transpose(0, 1), targets, *self._host,
                                      blank=0, reduction="mean", zero_infinity=True)

    def _forward_backward(self, batch) -> None:
        feats, lengths = batch[:2]
        self.optim.zero_grad(set_to_none=True)
        with self.settings():
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
                log_probs, _ = self.model(feats, lengths)
            self.ctc(log_probs, batch).backward()

    def _update(self) -> None:
        """Clipping at 10 and the RAdam update."""
        nn.utils.clip_grad_norm_(self.model.parameters(), 10.0)
        self.optim.step()

    def step(self, batch) -> float:
        t0 = timing.Clock(DEVICE)  # the queue drained at the start and at the reading
        self._forward_backward(batch)
        self._update()
        return t0.seconds()


class CapturedStepper(GpuStepper):
    """Training's captured step (:class:`fastasr.training.captured_step.CapturedSteps`, what
    ``capture_steps`` runs): the forward, the backward and the clipping with the RAdam update
    (``capturable``) each replayed as a CUDA graph of the batch's shape, the batch copied into the
    graphs' inputs, CTC eager between them on the host's lengths, the update graph with the
    non-finite guard's device skip (``training.update_guard``). A shape's first step runs
    eagerly (the optimiser's state), its second captures, as in training. What a training step
    captured as graphs takes: the step's GPU work, less the launches' gaps. Off CUDA (the
    plumbing run) the stand-in backend runs what it recorded at each replay."""

    CAPTURABLE = True

    def __init__(self, spec: str, path: str | None, switches: tuple[str, ...], layers: int):
        super().__init__(spec, path, switches, layers)
        self.captured = CapturedSteps(self.model, True, warmup=1,
                                      backend=None if DEVICE.type == "cuda" else EagerGraphs())
        self.captured.start(DEVICE, self.optim)
        self.captured.clip = (10.0, "norm")  # the update graph's clipping, GpuStepper._update's
        self.captured.guard = DeviceUpdateGuard(DEVICE)  # as callbacks.nonfinite_loss sets it in training

    def _run(self, feats, lengths):
        log_probs, out_lengths = self.model(feats, lengths)
        return [log_probs], out_lengths

    def step(self, batch) -> float:
        feats, lengths = batch[:2]
        t0 = timing.Clock(DEVICE)  # the queue drained at the start and at the reading
        with self.settings():
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
                captured = self.captured.forward({"features": feats, "feature_lengths": lengths}, self._run)
            if captured is None:  # the shape's eager step
                self._forward_backward(batch)
                self._update()
            else:
                self.ctc(captured[0], batch).backward()
                self.captured.backward()
                self.captured.update(self.optim.step)
                self.captured.current = None
        return t0.seconds()


class UpdateGraphedStepper(GpuStepper):
    """:class:`GpuStepper`'s step with its update alone (clipping, the RAdam update, ``capturable``)
    replayed as a CUDA graph: the forward, CTC and backward eager. What training can capture
    whatever its batches' shapes, since the update's are the parameters': it removes the
    update's host work (torch's foreach RAdam reads each parameter's step count back, five
    ``.item()`` a parameter in torch 2.11: 750 a step of the paper's model's 150 parameters).

    The graph reads gradients of its own: the backward's are copied into them with one foreach
    copy before each replay (parameters without a gradient at the first step, such as the
    floor's queries' and keys' projections, stay out of the update, as in the eager step). Built
    after the first backward, three eager updates on a side stream first (the optimiser's
    state). Off CUDA (the plumbing run) the update runs eagerly on the copied gradients."""

    CAPTURABLE = True

    def __init__(self, spec: str, path: str | None, switches: tuple[str, ...], layers: int):
        super().__init__(spec, path, switches, layers)
        self.update = self.with_grad = self.grads = None

    def _build(self) -> None:
        self.with_grad = [p for p in self.model.parameters() if p.grad is not None]
        self.grads = [p.grad.detach().clone() for p in self.with_grad]
        for param, grad in zip(self.with_grad, self.grads):
            param.grad = grad  # what the capture reads, at every replay
        backend = CudaGraphs() if DEVICE.type == "cuda" else EagerGraphs()

        def warm():  # three eager updates on a side stream (none off CUDA)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*capturable=True.*")  # eager on purpose
                for _ in range(3):
                    self._update()

        backend.warm_up(warm)
        self.update = backend.capture(self._update)

    def step(self, batch) -> float:
        t0 = timing.Clock(DEVICE)  # the queue drained at the start and at the reading
        self._forward_backward(batch)
        if self.update is None:
            self._build()
        torch._foreach_copy_(self.grads, [p.grad for p in self.with_grad])
        if self.update.graph is None:  # the eager update reads the copies, as the graph does
            for param, grad in zip(self.with_grad, self.grads):
                param.grad = grad
        self.update.replay()
        return t0.seconds()


#: Each way of running the step, by its column's suffix (:func:`_form`): its stepper.
FORMS = {"": GpuStepper, AS_GRAPHS: CapturedStepper, UPDATE_AS_GRAPH: UpdateGraphedStepper}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[800, 3200])
    p.add_argument("--frames", type=int, default=64000)
    p.add_argument("--layers", type=int, default=9)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--profile", nargs="+", default=None, metavar="SPEC",
                   help="specs (or floor): the largest CUDA kernels of one step of each")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: this script's plumbing under TRITON_INTERPRET=1 (tiny --lengths, --frames, --layers)")
    p.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--budget-s", type=float, default=None,
                   help=f"start no new variant after this many seconds (also ${bench_io.DEADLINE_ENV}, a Unix time)")
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = torch.device(args.device)
    if args.device == "cpu":
        if not bench_io.use_interpreted_kernels("step/gpu.py"):
            sys.exit(1)
        info = {**bench_io.machine_info(DEVICE), "gpu": "cpu-interpreter", "slug": "cpu-interpreter"}
    elif not torch.cuda.is_available():
        sys.exit("step/gpu.py times a GPU step: no GPU visible")
    else:
        info = bench_io.machine_info(DEVICE)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.profile:
        write_profile(args, info)
        return
    table: dict[int, dict[str, float | str]] = {}
    kernels: dict[int, dict[str, float | str]] = {}  # the kernels' time of a step
    taken: dict[int, str] = {}
    budget, notes = bench_io.Budget(args.budget_s), []
    batches = {}
    for n in args.lengths:
        batches[n] = tuple(t.to(DEVICE) for t in make_batch(n, args.frames))
        probe = torch.empty(1, 1, n, 32, device=DEVICE, dtype=torch.bfloat16)
        taken[n] = padded_path(probe, probe)
        table[n], kernels[n] = {}, {}
    # the graphed steps after every eager one: a capture that fails cannot spoil another column
    for n, name in [(n, name) for graphed in (False, True) for n in args.lengths for name in args.variants
                    if bool(_form(name)) == graphed]:
        if budget.spent(notes, f"{name} at N = {n}"):
            table[n][name] = kernels[n][name] = "not timed"
            continue
        try:
            stepper = FORMS[_form(name)](*VARIANTS[name], args.layers)
            for _ in range(2 if DEVICE.type == "cuda" else 0):  # the CPU's plumbing run: no warm-ups
                stepper.step(batches[n])
            table[n][name] = 1000 * statistics.median(stepper.step(batches[n]) for _ in range(args.rounds))
            if not _form(name):  # a graphed step runs its eager namesake's kernels
                kernels[n][name] = stepper.kernel_ms(batches[n])
        except Exception as exc:  # noqa: BLE001 - the table says which variant failed and why
            table[n][name] = f"failed: {bench_io.failure(exc)}"
        finally:
            stepper = None
        if DEVICE.type == "cuda":
            # what a failed capture's traceback or a cycle still holds (graphs, their memory pool)
            # goes before the next variant builds its own
            gc.collect()
            torch.cuda.empty_cache()
        print(f"N={n}, {name}: {_cell(table[n][name])}", flush=True)
    lines = [
        f"# One training step of the paper's model on {info['gpu']}",
        "",
        f"`python -m benchmarks.step.gpu {' '.join(sys.argv[1:])}`".replace(" `", "`"),
        "",
        f"{datetime.date.today()}, torch {info['torch']}, commit {bench_io.git_commit(ROOT)}. "
        f"{args.layers} layers of 6 heads × 32, ff 768, no subsampling, dropout 0.1; {args.frames} frames a batch "
        "(B = frames // N, the last utterance N / 2); bf16 autocast, CTC in fp32, clip 10, RAdam. Median of "
        f"{args.rounds} CUDA-synchronised steps after 2 warm-ups, ms. 'full' takes the path "
        "`fastasr.attention.full` chooses (named in the last column); 'key mask' and 'packed' force one. "
        "The floor: the inner attention replaced by the identity. '…, as CUDA graphs': training's captured "
        "step (`capture_steps`, `CapturedStepper`): the forward, the backward and the clipping with the RAdam "
        "update (capturable) each replayed as a CUDA graph, CTC eager between them: the step without the host's "
        "launches, for batches of one shape; its ratio is to the floor captured likewise. CTC reads the host's "
        "lengths in every column, as training's does. '…, update as a CUDA graph': the eager step "
        "with its clipping and RAdam update (capturable) replayed as a CUDA graph on a copy of the gradients "
        "(`UpdateGraphedStepper`); its ratio is to the floor run likewise.",
        "",
        "| N (batch) | " + " | ".join(args.variants) + " | full's path |",
        "|---|" + "---:|" * len(args.variants) + "---|",
    ]
    for n, cells in table.items():
        b = max(1, args.frames // n)
        lines.append(f"| {n} ({b}) | " + " | ".join(_cell(cells[k], _floor_of(k, cells)) for k in args.variants)
                     + f" | {taken[n]} |")
    columns = [name for name in args.variants if not _form(name)]
    lines += ["", "The same steps' GPU kernels alone, every eager variant (ms: torch.profiler's sum of the "
              "kernels' times in one step, each kernel once, after the timed ones): the step without the host "
              "issuing it, what a step captured as a CUDA graph would come near; the ratio to the floor's "
              "kernels. The model's own kernel switches are decided here (`gpu/decisions.py`).", "",
              "| N (batch) | " + " | ".join(columns) + " | full's path |", "|---|" + "---:|" * len(columns) + "---|"]
    for n, cells in kernels.items():
        lines.append(f"| {n} ({max(1, args.frames // n)}) | "
                     + " | ".join(_cell(cells.get(k, "failed"), _floor_of(k, cells)) for k in columns)
                     + f" | {taken[n]} |")
    lines += ["", "The step less its kernels (ms): the time the GPU waited for the host (its launches, "
              "autograd, the optimiser's and CTC's host work) where the host was behind.", "",
              "| N (batch) | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for n, cells in kernels.items():
        waits = [table[n].get(k) - cells[k] if all(isinstance(x, float) for x in (table[n].get(k), cells.get(k)))
                 else None for k in columns]
        lines.append(f"| {n} ({max(1, args.frames // n)}) | "
                     + " | ".join("–" if w is None else f"{w:.1f}" for w in waits) + " |")
    lines += notes
    out = args.out_dir / f"gpu_step_{info['slug']}.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out}")


def _floor_of(name: str, cells: dict[str, float | str]) -> float | str | None:
    """The floor a column's ratio is to: the floor run the same way (its form, :data:`FORMS`);
    None for a floor itself, or where the row has none."""
    floor = FLOOR + _form(name)
    return None if name == floor else cells.get(floor)


def _cell(ms: float | str, floor: float | str | None = None) -> str:
    """A step's milliseconds (and its ratio to the floor), or why the variant failed."""
    if isinstance(ms, str):
        return ms
    ratio = f" ({ms / floor:.2f}× floor)" if isinstance(floor, float) else ""
    return f"{ms:.1f}{ratio}"


def write_profile(args, info) -> None:
    from torch.profiler import ProfilerActivity, profile

    parts = []
    for n, spec in ((n, spec) for n in args.lengths for spec in args.profile):
        batch = tuple(t.to(DEVICE) for t in make_batch(n, args.frames))
        stepper = GpuStepper(spec, None, (), args.layers)
        for _ in range(2):
            stepper.step(batch)
        cuda = DEVICE.type == "cuda"
        with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])],
                     record_shapes=True) as prof:
            ms = 1000 * stepper.step(batch)
        sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        averages = prof.key_averages()
        parts.append(f"### {spec}, N = {n}: one step {ms:.1f} ms (kernels: "
                     f"{bench_io.kernel_ms(averages):.1f} ms; a record_function row's device time "
                     "is its span on the GPU, idle gaps included)\n")
        parts.append(averages.table(sort_by=sort, row_limit=30))
        if cuda:  # the host's side: where a step that waits for the host spends its CPU time
            parts.append(f"#### {spec}, N = {n}: the host's time, by self CPU time\n")
            parts.append(averages.table(sort_by="self_cpu_time_total", row_limit=25))
        # the copies and casts by their inputs' shapes: which tensors a step copies, and how often
        self_time = "self_device_time_total" if cuda else "self_cpu_time_total"
        copies = sorted(((getattr(e, self_time) / 1000, e) for e in prof.key_averages(group_by_input_shape=True)
                         if e.key in ("aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous")),
                        key=lambda pair: -pair[0])
        parts.append(f"#### {spec}, N = {n}: copies and casts by input shapes\n")
        parts.append("\n".join(f"{e.key:16} calls {e.count:5}  {'device' if cuda else 'cpu'} {ms:8.3f} ms  "
                                f"{e.input_shapes}" for ms, e in copies[:15]) + "\n")
    out = args.out_dir / f"gpu_step_profile_{info['slug']}.txt"
    out.write_text(f"{datetime.date.today()}, {info['gpu']}, torch {info['torch']}\n\n" + "\n".join(parts))
    print("\n".join(parts)[-6000:])
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
