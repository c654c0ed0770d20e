"""benchmarks/ by question: folders of scripts run as modules, one timer, one name a machine, no
developer paths in the committed results, and an index naming every script."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import bench_io, timing

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"
FOLDERS = {"attention", "step", "gpu", "pipeline", "models"}

#: The timer's own calls: only benchmarks/timing.py makes them.
TIMER_CALLS = re.compile(r"perf_counter\(|cuda\.Event\(|elapsed_time\(")
#: A developer machine's absolute path (a run directory, a checkout, a home).
DEVELOPER_PATH = re.compile(r"(?<![\w.~-])/(?:work|root|home|tmp|Users)/")
#: A file-name token that names a machine: a CPU's ``<model>-<cores>c`` or a GPU's maker first.
MACHINE_TOKEN = re.compile(r"^(?:[a-z0-9-]+-\d+c|(?:nvidia|amd|intel)-[a-z0-9-]+)$")


def scripts() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (BENCH / folder).glob("*.py") if p.name != "__init__.py")


def test_scripts_live_in_folders_by_question_as_packages():
    assert {p.name for p in BENCH.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))} == FOLDERS | {"results"}
    assert {p.name for p in BENCH.glob("*.py")} == {"__init__.py", "bench_io.py", "timing.py"}
    for folder in FOLDERS:
        assert (BENCH / folder / "__init__.py").is_file(), folder
    for path in scripts():
        text = path.read_text()
        assert 'sys.path.insert(0, str(Path(__file__).resolve().parent))' not in text, path
        assert not re.search(r"^import bench_io|^from bench_io ", text, re.MULTILINE), path


def test_only_the_timer_module_reads_a_clock():
    """Every timing goes through benchmarks.timing; a script that times imports it from there."""
    for path in [BENCH / "bench_io.py", *scripts()]:
        text = path.read_text()
        assert not TIMER_CALLS.search(text), f"{path.relative_to(ROOT)} times by hand: use benchmarks.timing"
        if re.search(r"(?<![\w.])timing\.\w+\(", text):
            assert re.search(r"^\s*from benchmarks import (?:.*\b)?timing\b", text, re.MULTILINE), path


def test_the_index_names_every_script_and_its_command():
    index = (BENCH / "README.md").read_text()
    for path in scripts():
        assert f"`{path.name}`" in index, f"benchmarks/README.md has no line for {path.relative_to(ROOT)}"
        if "def main(" in path.read_text():
            folder = path.parent.name
            assert f"python -m benchmarks.{folder}.{path.stem}" in index, path
    assert "bash benchmarks/gpu/check.sh" in index


def test_committed_results_hold_no_developer_paths():
    found = []
    for path in sorted(RESULTS.iterdir()):
        if path.suffix in (".png",):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if DEVELOPER_PATH.search(line):
                found.append(f"{path.name}:{number}: {line.strip()[:120]}")
    assert not found, "absolute paths in benchmarks/results (write them relative to the repository):\n" + "\n".join(found)


def test_one_spelling_a_machine():
    """Result file names and the machine slugs recorded in them are what ``machine_slug`` writes."""
    for path in sorted(RESULTS.iterdir()):
        for token in path.stem.split("_"):
            if MACHINE_TOKEN.match(token):
                assert bench_io.machine_slug(token) == token, f"{path.name}: {token!r} is spelled " \
                                                                f"{bench_io.machine_slug(token)!r}"
        if path.suffix == ".json":
            text = path.read_text()
            for slug in re.findall(r'"slug": "([^"]+)"', text):
                assert bench_io.machine_slug(slug) == slug and slug in path.name, (path.name, slug)
            json.loads(text)


@pytest.mark.parametrize("name,slug", [
    ("Intel(R) Xeon(R) Processor-2c", "intel-xeon-2c"),
    ("AMD EPYC-2c", "amd-epyc-2c"),
    ("AMD EPYC 7B13 64-Core Processor-16c", "amd-epyc-7b13-16c"),
    ("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz-8c", "intel-xeon-platinum-8480-8c"),
    ("Intel(R) Core(TM) i7-9700K CPU @ 3.60GHz-8c", "intel-core-i7-9700k-8c"),
    ("NVIDIA H200", "nvidia-h200"),
    ("cpu-interpreter", "cpu-interpreter"),  # gpu_table.py's --device cpu plumbing run
    ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"),
])
def test_machine_slug(name, slug):
    assert bench_io.machine_slug(name) == slug


def test_command_line_names_the_module(monkeypatch):
    monkeypatch.setattr("sys.argv", ["x", "--lengths", "800"])
    assert bench_io.command_line("step/cpu.py") == "`python -m benchmarks.step.cpu --lengths 800`"
    monkeypatch.setattr("sys.argv", ["x"])
    assert bench_io.command_line("gpu/decisions.py") == "`python -m benchmarks.gpu.decisions`"


def test_measure_warms_up_then_times_the_repeats():
    calls = []
    t = timing.measure(lambda: calls.append(1), warmup=2, repeats=4)
    assert len(calls) == 6 and t.count == 4 and len(t.samples) == 4
    assert 0 <= t.min_ms <= t.median_ms <= t.max_ms
    # a target time: at least `repeats`, then on to the target, `max_repeats` at most
    calls.clear()
    assert timing.measure(lambda: calls.append(1), warmup=0, repeats=3, target_s=60, max_repeats=7).count == 7
    assert timing.measure(lambda: None, warmup=0, repeats=3, target_s=0, max_repeats=7).count == 3
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        timing.measure(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="clock must be"):
        timing.time_once(lambda: None, clock="events")


def test_clock_reads_wall_seconds():
    clock = timing.Clock()
    first = clock.seconds()
    assert 0 <= first <= clock.seconds() and clock.ms() >= 1e3 * first
    assert not timing.is_cuda(None) and not timing.is_cuda("cpu") and timing.is_cuda("cuda:0")
