"""Helpers shared by the benchmark scripts (run as ``python -m benchmarks.<folder>.<script>`` from
the repository root): the machine's name, result files, the commit, kernel switches, time budgets.
Timing is :mod:`benchmarks.timing`'s."""

from __future__ import annotations

import contextlib
import csv
import importlib
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from unittest import mock


def is_oom(exc: BaseException) -> bool:
    """True for an out-of-memory error (CUDA or host); torch is imported lazily so a script
    can set TRITON_INTERPRET etc. before torch loads."""
    import torch

    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(exc).lower()


def write_csv(rows: list, path: Path, digits: int) -> None:
    """Write dataclass ``rows`` to ``path``, floats with ``digits`` significant digits."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.{digits}g}" if isinstance(v, float) else v) for k, v in asdict(r).items()})


def machine_info(device) -> dict:
    """CPU model, cores, torch threads and versions (and the GPU's name for a CUDA device),
    with ``slug``: a file-name-safe machine name for result files."""
    import torch

    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = {
        "cpu": cpu,
        "cores": cores,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        slug = info["gpu"]
    else:
        slug = f"{cpu}-{cores}c"
    info["slug"] = machine_slug(slug)
    return info


def slugify(name: str) -> str:
    """``name`` for a file name: lower case, each run of other characters one ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


#: What a CPU's or GPU's model name carries that does not tell machines apart: trademark signs,
#: "Processor", "N-Core", the clock ("CPU @ 2.20GHz").
_NAME_NOISE = re.compile(r"\((?:r|tm|c)\)|\bprocessor\b|\b\d+-core\b|(?:\bcpu\s*)?@\s*[\d.]+\s*[gm]hz", re.IGNORECASE)


def machine_slug(name: str) -> str:
    """The one file-name spelling of a machine (a GPU's name, or a CPU's model name and ``-<cores>c``):
    ``Intel(R) Xeon(R) Processor-2c`` -> ``intel-xeon-2c``, ``AMD EPYC 7B13 64-Core Processor-2c``
    -> ``amd-epyc-7b13-2c``, ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    return slugify(_NAME_NOISE.sub(" ", name))


def load_average() -> str:
    """1-minute load average, to show whether other jobs shared the machine."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "n/a"


def git_commit(root: Path) -> str:
    """``FASTASR_COMMIT`` where it is set, else the short commit hash of the repository at
    ``root`` with ``+changes`` where tracked files differ from it (a copy whose ``.git`` is older
    than its files, say); ``unknown`` outside a git checkout."""
    if os.environ.get("FASTASR_COMMIT"):
        return os.environ["FASTASR_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root)
        changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], capture_output=True, cwd=root)
    except OSError:
        return "unknown"
    commit = out.stdout.strip()
    return f"{commit}+changes" if commit and changed.returncode == 1 else commit or "unknown"


def result_stem(out_dir: str | Path, name: str, info: dict) -> Path:
    """``OUT_DIR/<name>_<machine slug>`` (``OUT_DIR`` made): a script's result files, suffix to add."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out / f"{name}_{info['slug']}"


def command_line(script: str) -> str:
    """The command that wrote a table (``script`` under benchmarks/, ``step/cpu.py``, run as its
    module with this process's arguments), as a Markdown code span."""
    module = "benchmarks." + script.removesuffix(".py").replace("/", ".")
    return f"`python -m {module} {' '.join(sys.argv[1:])}`".replace(" `", "`")


def child_env() -> dict:
    """This process's environment for a benchmark's own subprocess (``python -m benchmarks...``):
    the repository root and its ``src/`` first on ``PYTHONPATH``."""
    root = Path(__file__).resolve().parents[1]
    paths = [str(root), str(root / "src"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def measure_and_write(measure: Callable, write_table: Callable, args) -> None:
    """``measure(args)``'s rows on this CPU, written by ``write_table(rows, args, info, load_before,
    load_after)`` with the machine and the load average before and after; prints the file written."""
    info = machine_info("cpu")
    before = load_average()
    rows = measure(args)
    print(f"wrote {write_table(rows, args, info, before, load_average())}")


#: The kernels' alternatives that a GPU times against their defaults: name -> (module,
#: attribute, the value the switch sets, which is not the default).
KERNEL_SWITCHES = {
    "split-key centroid values": ("fastasr.kernels.clustering.ops", "SPLIT_KEY_VALUES_FROM", 0),
    "hash inside K-means": ("fastasr.kernels.clustering.triton_kmeans", "HASH_IN_KMEANS", True),
    "varlen centroid values": ("fastasr.kernels.clustering.ops", "VARLEN_CENTROID_VALUES", True),
    "torch layer norm": ("fastasr.kernels.layers.layer_norm", "TRITON_LAYER_NORM", False),
    "Triton bias gradients": ("fastasr.kernels.layers.linear", "TRITON_BIAS_GRADIENTS", True),
    "norms cast once": ("fastasr.kernels.layers.layer_norm", "CAST_ONCE", True),
    "Triton GELU dropout": ("fastasr.kernels.layers.dropout", "TRITON_GELU_DROPOUT", True),
}


@contextlib.contextmanager
def switched_on(switches):
    """A context with each of ``switches`` (names in :data:`KERNEL_SWITCHES`) set to its value,
    from its entry to its exit (not from its making: a context made ahead of its ``with``
    changes nothing before)."""
    with contextlib.ExitStack() as stack:
        for name in switches:
            module, attribute, value = KERNEL_SWITCHES[name]
            stack.enter_context(mock.patch.object(importlib.import_module(module), attribute, value))
        yield


def kernel_ms(events) -> float:
    """Milliseconds of GPU kernels among a profile's ``events`` (``prof.key_averages()``), each
    kernel once: the device's events without the ``record_function`` ranges' device spans
    (user annotations, which cover the same kernels again), as torch's own table totals them."""
    from torch.autograd import DeviceType

    return sum(e.self_device_time_total for e in events
               if e.device_type == DeviceType.CUDA and not e.is_user_annotation) / 1000


def switched_label(spec: str, switches) -> str:
    """``spec`` and the switches it runs with: ``clustered-100, split-key centroid values``."""
    return ", ".join((spec, *switches))


def use_interpreted_kernels(script: str) -> bool:
    """For a GPU script's ``--device cpu`` plumbing run: route fastasr's ops to the Triton
    kernels on CPU tensors, which needs them interpreted (``TRITON_INTERPRET=1``, set before
    they are defined). False, having said so on stderr, where it is not set."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        print(f"{script}: --device cpu runs the Triton kernels in the interpreter: set TRITON_INTERPRET=1",
              file=sys.stderr)
        return False
    from fastasr.kernels.clustering import ops

    os.environ[ops.KERNELS_ENV] = "triton"
    return True


#: Unix time by which a benchmark script stops starting new rows (set by ``gpu/check.sh`` for
#: each step from its time cap, so a step ends with its tables written instead of being killed).
DEADLINE_ENV = "BENCH_DEADLINE"


class Budget:
    """A script's time left: ``seconds`` from its making, and no later than ``$BENCH_DEADLINE``
    (:data:`DEADLINE_ENV`); unlimited when neither is given."""

    def __init__(self, seconds: float | None = None):
        ends = [time.time() + seconds] if seconds is not None else []
        if os.environ.get(DEADLINE_ENV):
            try:
                ends.append(float(os.environ[DEADLINE_ENV]))
            except ValueError:
                raise SystemExit(f"${DEADLINE_ENV} must be a Unix time in seconds, got "
                                 f"{os.environ[DEADLINE_ENV]!r}") from None
        self.end = min(ends, default=math.inf)
        self.noted = False

    def spent(self, lines: list[str], what: str) -> bool:
        """True once the time is up; the first time, notes in ``lines`` that ``what`` (the row or
        table it stops at) and everything after it went untimed."""
        if time.time() < self.end:
            return False
        if not self.noted:
            lines += ["", f"Time budget reached: {what} and what follows it not timed."]
            print(lines[-1], flush=True)
            self.noted = True
        return True


def failure(exc: BaseException, width: int = 80) -> str:
    """``exc`` for a table cell: its type and the first ``width`` characters of its first line."""
    first = (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:width]}"
