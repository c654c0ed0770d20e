"""One training step of the paper's model on a GPU: each attention against the floor.

    python benchmarks/gpu_step.py                          # N = 800 and 3200, 64,000 frames a batch
    python benchmarks/gpu_step.py --lengths 800 --profile i-clustered-100 clustered-100 floor
    TRITON_INTERPRET=1 python benchmarks/gpu_step.py --device cpu --lengths 64 --frames 128 \
        --layers 1 --rounds 1                                # the plumbing on the CPU

The model and batch are ``step_time.py``'s (9 layers of 6 heads × 32, ff 768, no subsampling,
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
hold for the whole step, forward and backward: a backward reads them when it runs). Median of
``--rounds`` CUDA-synchronised steps after 2 warm-ups, each variant in turn. ``--profile SPEC
[SPEC ...]``: torch.profiler's largest CUDA kernels of one step of each.

Writes ``benchmarks/results/gpu_step_<gpu>.md`` (and ``gpu_step_profile_<gpu>.txt``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import statistics
import sys
import time
from pathlib import Path

import bench_io  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from step_time import FLOOR, build_model, make_batch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from fastasr.attention.full import forced_padded_path, padded_path  # noqa: E402

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
    # the model's own kernels: its layer norms, its bias gradients by Triton, in the floor and with full attention
    "floor, Triton layer norm": (FLOOR, None, ("Triton layer norm",)),
    "full, Triton layer norm": ("full", None, ("Triton layer norm",)),
    "floor, Triton bias gradients": (FLOOR, None, ("Triton bias gradients",)),
    "full, Triton bias gradients": ("full", None, ("Triton bias gradients",)),
    "floor, norms cast once": (FLOOR, None, ("norms cast once",)),
    "full, norms cast once": ("full", None, ("norms cast once",)),
    "floor, Triton GELU dropout": (FLOOR, None, ("Triton GELU dropout",)),
    "full, Triton GELU dropout": ("full", None, ("Triton GELU dropout",)),
}


#: Where the steps run: the GPU, or (--device cpu, under TRITON_INTERPRET=1) the CPU with the
#: Triton kernels interpreted, a plumbing check of this script whose times mean nothing.
DEVICE = torch.device("cuda")


class GpuStepper:
    def __init__(self, spec: str, path: str | None, switches: tuple[str, ...], layers: int):
        self.model = build_model(spec, layers).to(DEVICE)
        self.optim = torch.optim.RAdam(self.model.parameters(), lr=1e-4, weight_decay=0.01)
        self.path = path
        self.switches = switches

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

    def step(self, batch) -> float:
        feats, lengths, targets, target_lengths = batch
        bench_io.synchronize(DEVICE)
        t0 = time.perf_counter()
        self.optim.zero_grad(set_to_none=True)
        forced = forced_padded_path(self.path) if self.path else contextlib.nullcontext()
        with forced, bench_io.switched_on(self.switches):  # the backward reads them too
            with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
                log_probs, out_lengths = self.model(feats, lengths)
            loss = nn.functional.ctc_loss(log_probs.float().transpose(0, 1), targets, out_lengths,
                                          target_lengths, blank=0, reduction="mean", zero_infinity=True)
            loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), 10.0)
        self.optim.step()
        bench_io.synchronize(DEVICE)
        return time.perf_counter() - t0


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
        if not bench_io.use_interpreted_kernels("gpu_step.py"):
            sys.exit(1)
        info = {**bench_io.machine_info(DEVICE), "gpu": "cpu-interpreter", "slug": "cpu-interpreter"}
    elif not torch.cuda.is_available():
        sys.exit("gpu_step.py times a GPU step: no GPU visible")
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
    for n in args.lengths:
        batch = tuple(t.to(DEVICE) for t in make_batch(n, args.frames))
        probe = torch.empty(1, 1, n, 32, device=DEVICE, dtype=torch.bfloat16)
        taken[n] = padded_path(probe, probe)
        table[n], kernels[n] = {}, {}
        for name in args.variants:
            if budget.spent(notes, f"{name} at N = {n}"):
                table[n][name] = kernels[n][name] = "not timed"
                continue
            try:
                stepper = GpuStepper(*VARIANTS[name], args.layers)
                for _ in range(2 if DEVICE.type == "cuda" else 0):  # the CPU's plumbing run: no warm-ups
                    stepper.step(batch)
                table[n][name] = 1000 * statistics.median(stepper.step(batch) for _ in range(args.rounds))
                if not VARIANTS[name][2]:  # the defaults' kernels (a switch's cost shows in the steps)
                    kernels[n][name] = stepper.kernel_ms(batch)
                del stepper
            except Exception as exc:  # noqa: BLE001 - the table says which variant failed and why
                table[n][name] = f"failed: {bench_io.failure(exc)}"
            if DEVICE.type == "cuda":
                torch.cuda.empty_cache()
        print(f"N={n}: " + ", ".join(f"{k} {_cell(v)}" for k, v in table[n].items()), flush=True)
    floor = FLOOR in args.variants
    lines = [
        f"# One training step of the paper's model on {info['gpu']}",
        "",
        f"`python benchmarks/gpu_step.py {' '.join(sys.argv[1:])}`".replace(" `", "`"),
        "",
        f"{datetime.date.today()}, torch {info['torch']}, commit {bench_io.git_commit(ROOT)}. "
        f"{args.layers} layers of 6 heads × 32, ff 768, no subsampling, dropout 0.1; {args.frames} frames a batch "
        "(B = frames // N, the last utterance N / 2); bf16 autocast, CTC in fp32, clip 10, RAdam. Median of "
        f"{args.rounds} CUDA-synchronised steps after 2 warm-ups, ms. 'full' takes the path "
        "`fastasr.attention.full` chooses (named in the last column); 'key mask' and 'packed' force one. "
        "The floor: the inner attention replaced by the identity.",
        "",
        "| N (batch) | " + " | ".join(args.variants) + " | full's path |",
        "|---|" + "---:|" * len(args.variants) + "---|",
    ]
    for n, cells in table.items():
        b = max(1, args.frames // n)
        base = cells.get(FLOOR) if floor else None
        lines.append(f"| {n} ({b}) | " + " | ".join(_cell(v, None if k == FLOOR else base)
                                                  for k, v in cells.items()) + f" | {taken[n]} |")
    columns = [name for name in args.variants if not VARIANTS[name][2]]
    lines += ["", "The same steps' GPU kernels alone, the variants without kernel switches (ms: "
              "torch.profiler's sum of the kernels' times in one step, each kernel once, after the timed ones): the step "
              "without the host issuing it, what a step captured as a CUDA graph would come near; the "
              "ratio to the floor's kernels.", "",
              "| N (batch) | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for n, cells in kernels.items():
        base = cells.get(FLOOR) if floor else None
        lines.append(f"| {n} ({max(1, args.frames // n)}) | "
                     + " | ".join(_cell(cells.get(k, "failed"), None if k == FLOOR else base) for k in columns)
                     + " |")
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
