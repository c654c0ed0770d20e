"""benchmarks/gpu/decisions.py: the kernel settings a GPU's tables decide, read off tables the
test writes in the benchmarks' formats (no GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_io
from benchmarks.gpu import decisions as gd

ROOT = Path(__file__).resolve().parents[1]

# attention/clustering_gpu.py's tables as it writes them (headings, "N × B" rows, cells that failed)
CLUSTERING = """# The clustering step on NVIDIA H200

## No host synchronisation in forward + backward

| attention | N × B | result |
|---|---|---|
| clustered-100 | 4096 × 16 | no synchronisation |

## Hamming K-means, 65,536 tokens a call, 6 heads, C = 100, 10 iterations (ms, median of 20; the launcher's tiles: one launch, N < 1024 64 positions × 4 warps)

| N × B | spans (auto) | auto | one launch | auto, tile 32 × 4 warps, 128 registers | auto, tile 64 × 8 warps | auto, 2 stages |
|---|---:|---:|---:|---:|---:|---:|
| 800 × 82 | 1 | 0.500 | 0.510 | 0.450 | 0.440 | 0.520 |
| 3200 × 20 | 1 | 0.700 | 0.690 | 0.700 | 0.600 | 0.600 |
| 16384 × 4 | 11 | 1.000 | 1.800 | 1.040 | 0.900 | **differs from the reference** |

## Attention call as one CUDA graph, forward + backward, bf16, 6 × 32, 65,536 tokens (ms, median of 10)

| N × B | clustered-100 | clustered-100, hash inside K-means | clustered-100, split-key centroid values |
|---|---:|---:|---:|
| 1024 × 64 | 1.40 | 1.30 | 1.45 |
| 16384 × 4 | 2.00 | 1.98 | 1.80 |
| 65536 × 1 | 3.00 | 3.02 | 2.40 |

## i-clustered's parts and clustered's centroid values, each against what it replaces (ms, median of 10)

| N × B | top-k: Triton | top-k: Triton, 1 rows × 1 warps | centroid attention: fused | centroid attention: fused, backward 64 keys × 8 warps | clustered's centroid values: SDPA | clustered's centroid values: split-key |
|---|---:|---:|---:|---:|---:|---:|
| 800 × 82 | 0.500 | 0.540 | 1.500 | 1.400 | 0.90 | 1.00 |
| 1024 × 64 | 0.400 | 0.400 | 1.400 | 1.250 | 0.90 | 0.80 |
| 16384 × 4 | 0.600 | 0.550 | 2.500 | 2.200 | 0.80 | 0.70 |
"""

# step/gpu.py's: the step under a dated line, then the kernels alone
STEP = """# One training step of the paper's model on NVIDIA H200

`python benchmarks/step/gpu.py`

2026-11-29, torch 2.11.0+cu130, commit abc1234. 9 layers of 6 heads × 32.

| N (batch) | full | full, varlen | clustered-100 | floor | clustered-100, hash inside K-means | floor, norms cast once | floor, Triton GELU dropout | full's path |
|---|---:|---:|---:|---:|---:|---:|---:|---|
| 800 (80) | 50.0 (1.60× floor) | 51.0 (1.63× floor) | 50.0 (1.60× floor) | 31.2 | 46.0 (1.47× floor) | 30.9 | 31.0 | varlen |
| 3200 (20) | 70.0 (2.00× floor) | 70.7 (2.02× floor) | 60.0 (1.71× floor) | 35.0 | 59.0 (1.69× floor) | 35.5 | 34.0 | varlen |

The same steps' GPU kernels alone, every eager variant (ms).

| N (batch) | full | full, varlen | clustered-100 | floor | floor, norms cast once | floor, Triton GELU dropout | full's path |
|---|---:|---:|---:|---:|---:|---:|---|
| 800 (80) | 40.0 (1.60× floor) | 40.4 (1.62× floor) | 45.0 (1.80× floor) | 25.0 | 24.0 | 24.6 | varlen |
| 3200 (20) | 50.0 (1.72× floor) | 49.8 (1.72× floor) | 48.0 (1.66× floor) | 29.0 | 27.9 | 28.0 | varlen |
"""


def _tables(clustering: str = CLUSTERING, step: str = STEP) -> dict[str, list[gd.Table]]:
    return {"clustering": gd.read_tables(clustering), "gpu_step": gd.read_tables(step)}


def test_tables_are_read_by_title_and_n_with_times_counts_and_failures_apart():
    tables = _tables()
    kmeans = gd.find_table(tables["clustering"], "Hamming K-means")
    assert sorted(kmeans.cells) == [800, 3200, 16384]
    assert kmeans.cells[16384]["spans (auto)"] == "11" and gd.milliseconds("11") is None  # a count
    assert gd.milliseconds(kmeans.cells[800]["auto"]) == 0.5
    assert gd.milliseconds("**differs from the reference**") is None and gd.milliseconds("failed: OOM") is None
    assert gd.milliseconds("51.0 (1.63× floor)") == 51.0 and gd.milliseconds(None) is None
    step = gd.find_table(tables["gpu_step"], "")  # the first table of times: the step, under a dated line
    assert step.columns[0] == "full" and sorted(step.cells) == [800, 3200]
    assert gd.short_title(step.title) == "" and gd.find_table(tables["clustering"], "").title.startswith("Hamming")
    kernels = gd.find_table(tables["gpu_step"], gd.STEP_KERNELS)
    assert gd.short_title(kernels.title) == gd.STEP_KERNELS and list(kernels.cells) == [800, 3200]
    assert gd.ratios(kmeans, "auto, 2 stages", "auto") == {800: pytest.approx(1.04), 3200: pytest.approx(6 / 7),
                                                          16384: None}


@pytest.mark.parametrize("rule,by_n,passes,start", [
    (gd.AT_800, {800: 0.90, 3200: 1.04}, True, None),
    (gd.AT_800, {800: 0.90, 3200: 1.06}, False, None),  # slower elsewhere
    (gd.AT_800, {800: 0.96, 3200: 0.80}, False, None),  # not at N = 800
    (gd.AT_800, {3200: 0.80}, False, None),
    (gd.EVERY_N, {800: 0.94, 3200: 0.90}, True, None),
    (gd.EVERY_N, {800: 0.94, 3200: None}, False, None),  # one untimed
    (gd.NO_LOSS, {800: 1.04, 3200: 0.70}, True, None),
    (gd.NO_LOSS, {800: 1.04, 3200: None}, False, None),
    (gd.FROM_N, {1024: 0.90, 4096: 1.00, 16384: 0.94, 65536: 0.80}, True, 16384),
    (gd.FROM_N, {1024: 0.90, 65536: 0.96}, False, None),
    (gd.AT_800, {800: None}, False, None),
    (gd.UP_TO_N, {800: 0.80, 1024: 0.90, 3200: 1.00, 16384: 1.20}, True, 1024),  # slower past it: allowed
    (gd.UP_TO_N, {800: 1.00, 1024: 0.80}, False, None),  # not at the shortest
])
def test_each_rule_on_the_margin(rule, by_n, passes, start):
    passed, why, got_start = gd.verdict(rule, by_n)
    assert (passed, got_start) == (passes, start), why
    if all(r is None for r in by_n.values()):
        assert why == "not timed"


def test_a_wider_margin_where_two_timings_of_the_same_kernels_differ_by_more():
    passed, why, _ = gd.verdict(gd.EVERY_N, {800: 0.93, 1024: 0.93}, margin=0.08)
    assert not passed and why == "within the margin at every N timed"
    for by_n in ({800: 0.5}, {800: None}):
        with pytest.raises(ValueError, match="unknown rule 'sometimes'"):
            gd.verdict("sometimes", by_n)
    tables = _tables()
    # K-means: "one launch" against "auto" where auto takes one launch (spans 1): 2 % apart at N = 800,
    # not at 16,384 (spans 11: not the same kernels)
    worst, where = gd.noise(tables, "clustering", "Hamming K-means")
    assert worst == pytest.approx(0.02) and where == "one launch against auto at N = 800"
    # the top-k's own tile timed twice at N <= 1,024: 8 % apart
    assert gd.noise(tables, "clustering", "i-clustered's parts")[0] == pytest.approx(0.08)
    # full attention's step against its forced path (the row names it)
    assert gd.noise(tables, "gpu_step", "")[0] == pytest.approx(1 - 50 / 51)
    assert gd.noise(tables, "gpu_step", gd.STEP_KERNELS) == (pytest.approx(1 - 40 / 40.4), "full against full, varlen at N = 800")
    assert gd.noise(tables, "clustering", "Attention call as one CUDA graph") == (0.0, "")


def test_what_the_tables_decide():
    rows, margins = gd.decide(_tables())
    by = {(r.candidate, r.table): r for r in rows}
    capped = by["auto, tile 32 × 4 warps, 128 registers", "clustering: Hamming K-means"]
    assert capped.rule == gd.AT_800 and capped.passed  # 10 % faster at 800, 4 % slower at 16,384: within 5 %
    wide = by["auto, tile 64 × 8 warps", "clustering: Hamming K-means"]
    assert wide.rule == gd.EVERY_N and wide.passed
    # the pipelining depth is two settings, K-means' one launch (spans 1) and its split sweeps,
    # each judged on its own rows
    stages = {r.setting.split(" (")[0]: r for r in rows if r.candidate == "auto, 2 stages"}
    one_launch = stages["num_stages of triton_kmeans.ONE_LAUNCH_TILES"]
    assert list(one_launch.by_n) == [800, 3200] and not one_launch.passed
    assert one_launch.why == "faster at N = 3,200; N = 16,384 left out (rows this setting does not run in)"
    split_sweeps = stages["num_stages of triton_kmeans.LLOYD_OPTIONS"]
    assert split_sweeps.by_n == {16384: None} and split_sweeps.why.startswith("not timed")
    # the parts table's margin is its noise, 8 %: the backward tile's 7 % at N = 800 is not a win
    bwd = by["centroid attention: fused, backward 64 keys × 8 warps", "clustering: i-clustered's parts"]
    assert not bwd.passed and bwd.why == "faster at N = 1,024, 16,384"
    assert margins["clustering: i-clustered's parts"].startswith("8% (two timings of the same kernels 8% apart")
    assert margins["clustering: Hamming K-means"].startswith("5%")
    # a switch changes where each of its rows passes: the hash inside K-means wins the step at 800
    # and loses no N of the call; the split-key values pass the call from 16,384 but the parts from 1,024
    hash_rows = [r for r in rows if r.setting == "triton_kmeans.HASH_IN_KMEANS = True"]
    assert [(r.table, r.passed) for r in hash_rows] == [("gpu_step: the step", True),
                                                        ("clustering: Attention call as one CUDA graph", True)]
    split = [r for r in rows if r.setting.startswith("ops.SPLIT_KEY_VALUES_FROM")]
    assert [(r.table, r.start) for r in split] == [("clustering: Attention call as one CUDA graph", 16384),
                                                   ("clustering: i-clustered's parts", 1024)]
    changed = gd.changes(rows)
    assert changed["ops.SPLIT_KEY_VALUES_FROM: the N the rows pass from"] == "from N = 16,384"
    assert "triton_kmeans.HASH_IN_KMEANS = True" in changed
    assert not any("backward" in setting for setting in changed)


def test_the_top_k_settings_are_judged_on_the_rows_the_triton_top_k_selects():
    """Rows longer than ``triton_topk.MAX_N`` go to ``torch.topk`` whatever the Triton top-k's
    settings: there a candidate times the default's kernels, and its rule reads the other rows."""
    from fastasr.kernels.clustering import triton_topk

    assert gd.TOPK_MAX_N == triton_topk.MAX_N
    whole_range = CLUSTERING.replace("| top-k: Triton | top-k: Triton, 1 rows × 1 warps |",
                                     "| top-k: Triton | top-k: Triton, whole int32 range |")
    whole_range = whole_range.replace("| 0.500 | 0.540 |", "| 0.500 | 0.400 |").replace(
        "| 0.400 | 0.400 |", "| 0.400 | 0.330 |").replace("| 0.600 | 0.550 |", "| 0.600 | 0.610 |")
    rows, _ = gd.decide(_tables(clustering=whole_range))
    row = next(r for r in rows if r.candidate == "top-k: Triton, whole int32 range")
    assert list(row.by_n) == [800, 1024] and row.passed
    assert row.why == "faster at N = 800, 1,024; N = 16,384 left out (rows this setting does not run in)"
    assert "triton_topk.BRACKET = False: top-k: Triton, whole int32 range" in gd.changes(rows)
    losing = whole_range.replace("| 0.400 | 0.330 |", "| 0.400 | 0.450 |")  # slower at 1,024
    assert not any(s.startswith("triton_topk.BRACKET") for s in gd.changes(gd.decide(_tables(clustering=losing))[0]))


def test_the_models_own_switches_are_decided_on_the_steps_kernels_and_lose_no_step():
    """A switch of the model's own layers saves a few per cent of a step's kernels: it passes on
    the kernel sums' margin (2 %, or their noise where larger: 1 % here) at every N and must not
    make the step slower (the step's margin: 5 %). The cast once saves 4 % of the kernels at both
    N and passes; the GELU dropout saves 1.6 % at N = 800, inside the margin, and does not."""
    rows, margins = gd.decide(_tables())
    assert margins["gpu_step: " + gd.STEP_KERNELS] == (
        "2% (two timings of the same kernels 1% apart: full against full, varlen at N = 800)")
    cast = [(r.table, r.rule, r.passed) for r in rows if r.setting == "layer_norm.CAST_ONCE = True"]
    assert cast == [("gpu_step: " + gd.STEP_KERNELS, gd.EVERY_N, True), ("gpu_step: the step", gd.NO_LOSS, True)]
    changed = gd.changes(rows)
    assert "layer_norm.CAST_ONCE = True" in changed and "dropout.TRITON_GELU_DROPOUT = True" not in changed
    slower_step = STEP.replace("| 31.2 | 46.0 (1.47× floor) | 30.9 |", "| 31.2 | 46.0 (1.47× floor) | 33.0 |")
    assert "layer_norm.CAST_ONCE = True" not in gd.changes(gd.decide(_tables(step=slower_step))[0])


def test_the_models_own_switches_lose_no_captured_step_either():
    """A GPU trains the captured step (``capture_steps: auto``), where a switch's launches cost
    nothing: each switch is judged there too, its ``<spec>, <switch>, as CUDA graphs`` column
    against ``<spec>, as CUDA graphs``, with no loss allowed."""
    def with_captured(floor_cast: str) -> str:
        step = STEP.replace(" | full's path |\n|---|---:|---:|---:|---:|---:|---:|---:|---|",
                            " | floor, as CUDA graphs | floor, norms cast once, as CUDA graphs | full's path |\n"
                            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|", 1)
        step = step.replace(" | 31.0 | varlen |", f" | 31.0 | 20.0 | {floor_cast} | varlen |", 1)
        return step.replace(" | 34.0 | varlen |", " | 34.0 | 24.0 | 23.5 | varlen |", 1)

    rows, _ = gd.decide(_tables(step=with_captured("19.8")))
    cast = [(r.candidate, r.default, r.passed) for r in rows
            if r.setting == "layer_norm.CAST_ONCE = True" and r.table == "gpu_step: the step"]
    assert cast == [("floor, norms cast once", "floor", True),
                    ("floor, norms cast once, as CUDA graphs", "floor, as CUDA graphs", True)]
    assert "layer_norm.CAST_ONCE = True" in gd.changes(rows)
    rows, _ = gd.decide(_tables(step=with_captured("21.5")))  # 7.5 % slower captured at N = 800
    assert "layer_norm.CAST_ONCE = True" not in gd.changes(rows)


def test_the_step_as_cuda_graphs_is_built_where_every_graphed_step_wins_at_800():
    """step/gpu.py's "<spec>, as CUDA graphs" columns against their eager steps: a training step
    captured as graphs is worth building where each wins at N = 800 and none loses elsewhere."""
    graphed = STEP.replace(" | full's path |\n|---|---:|---:|---:|---:|---:|---:|---:|---|",
                           " | floor, as CUDA graphs | clustered-100, as CUDA graphs | full's path |\n"
                           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    graphed = graphed.replace(" | 31.0 | varlen |", " | 31.0 | 26.0 | 44.0 (1.69× floor) | varlen |")
    graphed = graphed.replace(" | 34.0 | varlen |", " | 34.0 | 33.0 | 57.0 (1.73× floor) | varlen |")
    build = next(iter(gd.STEP_FORMS.values()))[0]
    rows, _ = gd.decide(_tables(step=graphed))
    forms = {r.candidate: r.passed for r in rows if r.setting == build}
    assert forms == {"floor, as CUDA graphs": True, "clustered-100, as CUDA graphs": True}
    assert build in gd.changes(rows)
    lagging = graphed.replace("| 33.0 | 57.0 (1.73× floor) |", "| 37.0 | 57.0 (1.73× floor) |")
    assert build not in gd.changes(gd.decide(_tables(step=lagging))[0])  # the graphed floor slower at 3,200


def test_a_switch_that_loses_a_row_does_not_change():
    losing = CLUSTERING.replace("| 65536 × 1 | 3.00 | 3.02 |", "| 65536 × 1 | 3.00 | 3.30 |")
    rows, _ = gd.decide(_tables(clustering=losing))
    assert "triton_kmeans.HASH_IN_KMEANS = True" not in gd.changes(rows)


def test_every_kernel_switch_has_its_rule():
    assert set(gd.SWITCH_RULES) == set(bench_io.KERNEL_SWITCHES)


def test_the_script_writes_its_verdicts_and_compares_with_a_commit(tmp_path):
    """The command line: the report under --results; --baseline sets each column beside the same
    file at a commit (a scratch git repository here), --same pairs renamed columns."""
    repo = tmp_path / "repo"
    results = repo / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / "clustering_fake-gpu.md").write_text(CLUSTERING.replace("| 800 × 82 | 1 | 0.500 |", "| 800 × 82 | 1 | 0.400 |"))
    (results / "gpu_step_fake-gpu.md").write_text(STEP)

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                       capture_output=True)

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "tables then")
    (results / "clustering_fake-gpu.md").write_text(CLUSTERING.replace("| auto |", "| auto, renamed |"))
    script = [sys.executable, "-m", "benchmarks.gpu.decisions", "--gpu", "fake-gpu", "--results", str(results)]
    on_path = {"PYTHONPATH": str(ROOT)}  # the script runs as a module of the repository's benchmarks package
    proc = subprocess.run([*script, "--baseline", "HEAD", "--same", "auto, renamed=auto"], capture_output=True,
                          text=True, cwd=repo, env={"PATH": "/usr/bin:/bin", "FASTASR_COMMIT": "abc1234", **on_path})
    assert proc.returncode == 0, proc.stderr
    text = (results / "gpu_decisions_fake-gpu.md").read_text()
    assert "\n- `ops.SPLIT_KEY_VALUES_FROM: the N the rows pass from`: from N = 16,384\n" in text
    assert "\n- `triton_kmeans.HASH_IN_KMEANS = True`: gpu_step: the step: faster at N = 800; " in text
    assert "lloyd_tile" not in text.split("## Every candidate")[0]  # no default column "auto" in the new table
    assert "commit abc1234" in text and "## Each column against commit HEAD's" in text
    # 0.500 now against 0.400 then, by its new name
    assert "| auto, renamed | auto | clustering: Hamming K-means | 800: 1.25 · 3,200: 1.00 · 16,384: 1.00 | slower at N = 800 |" in text
    proc = subprocess.run([*script, "--same", "auto"], capture_output=True, text=True, cwd=repo,
                          env={**os.environ, **on_path})
    assert proc.returncode == 2 and "--same takes NOW=THEN pairs; got ['auto']" in proc.stderr
    proc = subprocess.run([*script[:-4], "--gpu", "other-gpu", "--results", str(results)], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 2 and "no clustering_other-gpu.md or gpu_step_other-gpu.md under" in proc.stderr
