"""The Triton kernels built for the GPU without one: the real compiler (bundled ptxas) for
sm_90, and ``benchmarks/attention/gpu_table.py``'s plumbing on the CPU. Each runs in a subprocess
without ``TRITON_INTERPRET`` (the interpreted kernels are ``tests/test_kernels_triton.py``)."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(660)
def test_kernels_compile_for_sm90_without_spills(tmp_path):
    """The real compiler (bundled ptxas, no GPU needed) accepts every kernel configuration.

    The interpreter checks values, not that the kernels compile: dtype rules, dot shapes
    and register spills only show here. With ``--loops``: K-means' sweeps reading stored
    signs (the one launch's) issue at most 0.65 times the instructions a tile of those
    unpacking the codes (the split's), in each tile the launcher uses (0.46-0.60 with Triton
    3.6, benchmarks/gpu/notes.md), and hashing the queries in that launch leaves its sweeps'
    tile as it is (within 8 instructions: 405 against 403 for 64 x 4).
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    proc = subprocess.run(
        [sys.executable, "-m", "fastasr.cli.kernels", "compile-check", "--arch", "90", "--loops"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compile without spills, GPU-wide fences or int-to-float conversions in a loop" in proc.stdout
    loops = dict(re.findall(r"ok    (kmeans lloyd C=100 [^:]+):.*, ([\d,]+) instructions a loop iteration",
                            proc.stdout))
    unpacking = {name: int(n.replace(",", "")) for name, n in loops.items() if "stored signs" not in name}
    assert len(unpacking) == 4, proc.stdout
    for name, instructions in unpacking.items():
        assert int(loops[name + " stored signs"].replace(",", "")) <= 0.65 * instructions, (name, loops)
    # the one launch hashing its queries (hash_kmeans): the same sweeps as on stored signs of codes
    hashed = {name: int(n.replace(",", "")) for name, n in loops.items() if " hashed " in name}
    assert len(hashed) == 4, proc.stdout
    for name, instructions in hashed.items():
        stored = int(loops[name.split(" hashed ")[0]].replace(",", ""))
        assert instructions <= stored + 8, (name, loops)


def test_hot_loop_is_the_innermost_loop_with_tensor_core_products():
    """``compile_check.hot_loop`` on SASS text: a branch back closes a loop; the
    shortest loop with an ``HGMMA`` counts, else the longest innermost loop, with the loops in it;
    no loop: None."""
    from fastasr.kernels.compile_check import hot_loop, innermost_loops, loop_conversions

    def sass(*ops):
        return "\n".join(f"        /*{16 * i:04x}*/                   {op} ;   /* 0x0 */" for i, op in enumerate(ops))

    nested = sass("MOV R1, R2", "LDG.E R4, [R2.64]",  # 0x00, 0x10: the outer loop starts at 0x10
                  "HGMMA.64x128x16.F32 R24, R152, gdesc[UR4], RZ", "FMNMX R5, R4, R5, !PT",
                  "@P0 BRA 0x20",  # 0x40: the inner loop, 0x20-0x40: 3 instructions
                  "IADD3 R6, R6, 0x1, RZ", "@P1 BRA 0x10",  # 0x60: the outer loop, 0x10-0x60: 6
                  "EXIT")
    assert hot_loop(nested) == (3, ())
    assert hot_loop(nested.replace("HGMMA", "IMAD")) == (3, ())  # no products: the innermost
    around = sass("MOV R1, R2", "HMMA.16816.F32.BF16 R4, R8, R12, R4", "ISETP.GE.AND P0, PT, R1, R3, PT",  # 0x10-
                  "FSEL R5, R5, RZ, P0", "@P0 BRA 0x20",  # 0x40: a loop inside, 0x20-0x40
                  "@P1 BRA 0x10", "EXIT")  # 0x50: the loop with the product, 0x10-0x50
    assert hot_loop(around) == (5, (3,))
    assert hot_loop(around.replace("@P0 BRA 0x20", "@P0 BRA P2, 0x20")) == (5, (3,))  # a second predicate
    no_products = sass("MOV R1, R2", "IADD3 R1, R1, 0x1, RZ", "ISETP.NE.AND P0, PT, R1, R3, PT",
                       "@P0 BRA 0x10", "LOP3.LUT R5, R5, R6, RZ, 0x3c, !PT", "@P1 BRA 0x40", "EXIT")
    assert hot_loop(no_products) == (3, ())  # the longer of two disjoint innermost loops
    assert hot_loop(sass("MOV R1, R2", "@P0 BRA 0x40", "EXIT")) is None  # forward only
    assert innermost_loops(no_products) == (3, 2)  # both, in address order
    assert innermost_loops(nested) == (3,) and innermost_loops(around) == (3,)  # not those around them
    assert innermost_loops(sass("MOV R1, R2", "EXIT")) == ()
    # int-to-float conversions counted in innermost loops only, I2FP (full rate) not
    onehot = sass("MOV R1, R2", "SEL R4, RZ, 0x1, !P4", "I2F.F16.U32 R4, R4", "I2FP.F32.S32 R5, R5",
                  "@P0 BRA 0x10", "I2F.F16.U32 R6, R6", "@P1 BRA 0x10", "EXIT")
    assert loop_conversions(onehot) == 1
    assert loop_conversions(onehot.replace("I2F.F16", "FSET.BF.EQ.AND")) == 0


def test_a_report_fails_on_a_compile_error_a_spill_a_fence_or_a_conversion():
    """``KernelReport.fails``, which ``compile_check``'s exit status and ``gpu/kernel_resources.py``
    both read: a configuration that did not compile, spills, holds a GPU-wide fence or converts
    integers to floats in a loop fails."""
    from fastasr.kernels.compile_check import KernelReport

    assert not KernelReport("k", True, 72, 0).fails
    assert KernelReport("k", False, error="CompilationError").fails
    assert KernelReport("k", True, 255, 24).fails
    assert KernelReport("k", True, 124, 0, fences=36).fails
    assert KernelReport("k", True, 124, 0, conversions=64).fails


def test_ctas_per_sm_by_registers_shared_memory_and_threads():
    """``compile_check.ctas_per_sm`` as CUDA's occupancy calculator counts: registers by whole
    warps from four sub-partitions (a thread's rounded up to 8), shared memory with 1 KB
    reserved a CTA, the threads' and CTAs' caps; None for an architecture it has no limits for."""
    from fastasr.kernels.compile_check import ctas_per_sm

    assert ctas_per_sm(230, 40960, 4) == 2  # K-means' 64 x 4 tile: 7,424 registers a warp, 2 a sub-partition
    assert ctas_per_sm(225, 40960, 4) == 2 and ctas_per_sm(168, 40960, 4) == 3  # 232 and 168 a thread
    assert ctas_per_sm(72, 0, 1) == 28  # the top-k's one-warp program: 7 warps a sub-partition
    assert ctas_per_sm(32, 100 * 1024, 4) == 2  # 233,472 B // (102,400 + 1,024)
    assert ctas_per_sm(16, 0, 32) == 2  # 2,048 threads
    assert ctas_per_sm(16, 0, 1) == 32  # the CTAs' cap
    assert ctas_per_sm(255, 0, 4, arch=80) == 2 and ctas_per_sm(64, 100 * 1024, 4, arch=80) == 1
    assert ctas_per_sm(64, 0, 4, arch=75) is None


def test_launch_specialisation_of_the_sparse_backward_and_the_hash():
    """Compiled as a launch on contiguous tensors specialises the kernels: each tensor's last
    stride 1 (but rows whose last stride is their positions': the features' is implicit), its other strides and the row widths multiples of 16, lengths and counts
    unmarked, the hash planes' rows (63 wide) unmarked, constexprs and pointers left out."""
    from fastasr.kernels.compile_check import launch_specialisation

    names = ["q_ptr", "H", "N", "K", "E", "EV", "C", "scale", "s_qb", "s_qh", "s_qn", "s_qe",
             "s_ib", "s_ih", "s_ic", "s_it", "BLOCK_N"]
    unit, multiples = launch_specialisation(names, excluded={"q_ptr", "BLOCK_N"})
    assert unit == ["s_it", "s_qe"]
    assert sorted(multiples) == ["E", "EV", "K", "s_ib", "s_ic", "s_ih", "s_qb", "s_qh", "s_qn"]
    unit, multiples = launch_specialisation(["x_ptr", "N", "E", "stride_xb", "stride_xh", "stride_xn", "stride_xe",
                                             "stride_pe", "stride_pb"], excluded={"x_ptr"})
    assert unit == ["stride_pb", "stride_xe"]
    assert sorted(multiples) == ["E", "stride_xb", "stride_xh", "stride_xn"]
    # rows through (batch, head, position) strides, the features' unit stride implicit: no stride is 1
    unit, multiples = launch_specialisation(["k_ptr", "N", "s_kb", "s_kh", "s_kn", "s_ob", "s_oh", "s_on", "s_oe"],
                                            excluded={"k_ptr"})
    assert unit == ["s_oe"]
    assert sorted(multiples) == ["s_kb", "s_kh", "s_kn", "s_ob", "s_oh", "s_on"]


def test_gpu_fences_are_counted_as_acq_rel_atomics_compile():
    """``compile_check.gpu_fences``: an atomic add with Triton's default ``acq_rel`` semantics
    compiles to a GPU-scope ``MEMBAR`` before it and an L1 invalidation after (two), a relaxed
    one to a bare ``REDG`` (none); a CTA-scope fence is not counted."""
    from fastasr.kernels.compile_check import gpu_fences

    acq_rel = """
        /*67c0*/                   MEMBAR.ALL.GPU ;                                /* 0x0 */
        /*67f0*/                   ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU PT, R4, desc[UR4][R2.64], R5 ;   /* 0x0 */
        /*6800*/                   CCTL.IVALL ;                                    /* 0x0 */
        /*6810*/                   MEMBAR.ALL.CTA ;                                /* 0x0 */"""
    relaxed = "        /*67f0*/                   REDG.E.ADD.F32.FTZ.RN.STRONG.GPU desc[UR4][R2.64], R5 ;   /* 0x0 */"
    assert gpu_fences(acq_rel) == 2
    assert gpu_fences(relaxed) == 0


def _run_gpu_bench_quick(tmp_path, *extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FASTASR_KERNELS")}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.attention.gpu_table", "--quick", "--device", "cpu", "--out-dir", str(tmp_path),
         *extra],
        capture_output=True, text=True, env=env, timeout=900, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "check ok" in proc.stdout
    rows = list(csv.DictReader((tmp_path / "gpu_cpu-interpreter.csv").open()))
    assert rows and all(r["status"] == "ok" and float(r["median_ms"]) > 0 for r in rows), rows
    assert {r["kernels"] for r in rows if r["variant"].startswith("i-clustered")} == {"triton", "reference"}
    md = (tmp_path / "gpu_cpu-interpreter.md").read_text()
    assert "torch" in md and "triton" in md and "| 32 |" in md
    assert (tmp_path / "gpu_cpu-interpreter.png").stat().st_size > 0
    return rows


def test_gpu_bench_sweeps_the_lengths_and_dtypes_it_is_given():
    """gpu_table.py's arguments: ``--quick`` sweeps both quick lengths and both dtypes (what the
    slow test below runs), ``--ns`` and ``--dtypes`` narrow the sweep to theirs."""
    from benchmarks.attention import gpu_table

    quick = gpu_table.parse_args(["--quick", "--device", "cpu"])
    assert (quick.ns, quick.dtypes, quick.tokens, quick.max_repeats) == ([32, 64], ["float32", "bfloat16"], 128, 1)
    narrowed = gpu_table.parse_args(["--quick", "--device", "cpu", "--ns", "32", "--dtypes", "float32"])
    assert (narrowed.ns, narrowed.dtypes) == ([32], ["float32"])


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_gpu_bench_quick_cpu_full(tmp_path):
    """benchmarks/attention/gpu_table.py plumbing on the CPU, the whole --quick sweep: check, time,
    write csv/md/png for both dtypes and both lengths."""
    rows = _run_gpu_bench_quick(tmp_path)
    assert {r["dtype"] for r in rows} == {"float32", "bfloat16"}
    assert {int(r["n"]) for r in rows} == {32, 64}


def test_kernel_switches_name_settings_they_change():
    """Every switch the GPU benchmarks set (``bench_io.KERNEL_SWITCHES``) names a setting that
    exists and whose default is not the switch's value, and ``switched_on`` sets each for its
    context only: a renamed setting fails here, not after a GPU has started."""
    import importlib

    from benchmarks import bench_io
    from benchmarks.attention import clustering_gpu
    from benchmarks.step import gpu as gpu_step
    used = {s for _, switches in clustering_gpu.CALLS for s in switches}
    used |= {s for *_, switches in gpu_step.VARIANTS.values() for s in switches}
    assert used == set(bench_io.KERNEL_SWITCHES)
    names = list(bench_io.KERNEL_SWITCHES)
    assert names == ["split-key centroid values", "hash inside K-means", "varlen centroid values", "torch layer norm",
                     "Triton bias gradients", "norms cast once", "Triton GELU dropout"]
    settings = [(importlib.import_module(m), a) for m, a, _ in bench_io.KERNEL_SWITCHES.values()]
    defaults = [32768, False, False, True, False, False, False]
    assert [getattr(m, a) for m, a in settings] == defaults
    made = bench_io.switched_on(names)  # made ahead of its `with` (as a table's settings are): nothing set yet
    assert [getattr(m, a) for m, a in settings] == defaults
    with made:
        assert [getattr(m, a) for m, a in settings] == [0, True, True, False, True, True, True]
    assert [getattr(m, a) for m, a in settings] == defaults
    assert bench_io.switched_label("clustered-100", names[:1]) == "clustered-100, split-key centroid values"


def _run_cpu_plumbing(module: str, tmp_path, *args) -> str:
    """``python -m benchmarks.<module> --device cpu ...`` under the Triton interpreter; its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "FASTASR_KERNELS"}
    env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", "--device", "cpu",
                           "--out-dir", str(tmp_path), *args],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(660)
def test_clustering_gpu_cpu_plumbing(tmp_path):
    """benchmarks/attention/clustering_gpu.py end to end on the CPU (tiny sizes, 4 clusters): every
    section written, every call (and the one with the kernel switch) run, nothing failed or
    differing, so that a GPU's few minutes are not lost to the script."""
    _run_cpu_plumbing("attention.clustering_gpu", tmp_path, "--ns", "64", "--tokens", "128", "--repeats", "1",
                      "--check-n", "64", "--clusters", "4", "--heads", "1", "--topk-tiles", "1:1", "--kmeans-stages", "2", "--tiles", "16:2:128", "--sparse-tiles", "16:2",
                      "--centroid-bwd-tiles", "64:8")
    md = (tmp_path / "clustering_cpu-interpreter.md").read_text()
    for section in ("No host synchronisation", "Hamming K-means", "Attention call, forward + backward",
                    "i-clustered's parts", "CPU ops of one clustered-4 call",
                    "Attention call as one CUDA graph"):
        assert section in md, section
    assert md.count("ran (the CPU has no synchronisation check)") == 5  # clustering_gpu.CALLS
    assert "| clustered-4, rows broadcast |" in md and "centroid attention: fused, 256-key spans |" in md
    assert "| centroid attention: torch |" in md
    assert "centroid attention: fused, backward 64 keys × 8 warps |" in md
    assert "| clustered-4, hash inside K-means |" in md
    assert "| clustered-4, split-key centroid values |" in md and "clustered's centroid values: split-key |" in md
    assert "| clustered-4, varlen centroid values |" in md and "clustered's centroid values: varlen |" in md
    assert "top-k: Triton, 1 rows × 1 warps" in md and "| split, clustered codes |" in md
    assert "top-k: Triton, whole-row stores |" in md and "top-k: Triton, whole int32 range |" in md
    assert "| auto, unpacked signs |" in md and "| auto, unpacked signs, clustered codes |" in md
    assert "| auto, tile 16 × 2 warps, 128 registers |" in md
    assert "| auto, 2 stages |" in md and "| sparse part: fused, 16 rows × 2 warps |" in md
    for bad in ("fail", "differ", "synchronises"):
        assert bad not in md.lower(), md
    # every column that times an alternative has its rule in gpu/decisions.py (FAMILIES, SWITCH_RULES)
    from benchmarks.gpu import decisions as gpu_decisions
    tables = gpu_decisions.load(tmp_path, "cpu-interpreter")
    decided = {(row.table, row.candidate) for row in gpu_decisions.decide(tables)[0]}
    references = {"spans (auto)", "auto", "auto, unpacked signs", "one launch", "split", "sparse part: products + torch",
                  "sparse part: fused", "top-k: torch.topk", "top-k: Triton", "centroid attention: torch",
                  "centroid attention: fused", "clustered's centroid values: SDPA", "clustered-4", "i-clustered-4"}
    for title in ("Hamming K-means", "i-clustered's parts", "Attention call as one CUDA graph"):
        table = gpu_decisions.find_table(tables["clustering"], title)
        undecided = [c for c in table.columns if c not in references and not c.endswith(", clustered codes")
                     and (f"clustering: {title}", c) not in decided]
        assert not undecided, (title, undecided)


@pytest.mark.slow
@pytest.mark.timeout(660)
def test_gpu_step_cpu_plumbing(tmp_path):
    """benchmarks/step/gpu.py on the CPU: a step of each kind of variant (one with the kernel
    switch set) and the floor ratios in the table, and the profile of one step. The variants
    share one step function; i-clustered's interpreted top-k over 1,200 centroid rows would
    take most of this test's time, and test_clustering_gpu_cpu_plumbing runs its kernels."""
    _run_cpu_plumbing("step.gpu", tmp_path, "--lengths", "64", "--frames", "128", "--layers", "1",
                      "--rounds", "1", "--variants", "full", "full, dense", "clustered-100", "floor",
                      "clustered-100, split-key centroid values", "clustered-100, hash inside K-means",
                      "clustered-100, varlen centroid values", "floor, torch layer norm",
                      "floor, Triton bias gradients", "floor, norms cast once", "floor, Triton GELU dropout",
                      "clustered-100, as CUDA graphs", "floor, as CUDA graphs", "floor, update as a CUDA graph",
                      "floor, torch layer norm, as CUDA graphs")
    # (i-clustered's kernels: the test above)
    md = (tmp_path / "gpu_step_cpu-interpreter.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| 64 (2) |"))
    assert row.count("× floor") == 12 and "failed" not in row, row  # not the three floors'
    header = next(line for line in md.splitlines() if line.startswith("| N (batch) |"))
    cells = dict(zip((c.strip() for c in header.split("|")[2:-1]), (c.strip() for c in row.split("|")[2:-1])))
    graphed, floor = float(cells["clustered-100, as CUDA graphs"].split()[0]), float(cells["floor, as CUDA graphs"])
    assert cells["clustered-100, as CUDA graphs"].endswith(f"({graphed / floor:.2f}× floor)")  # the graphed floor's
    # every eager variant's (a graphed step runs its eager namesake's kernels)
    assert "The same steps' GPU kernels alone" in md and md.count("CUDA only") == 11
    waits = md.split("The step less its kernels")[1].splitlines()
    assert next(line for line in waits if line.startswith("| 64 (2) |")) == "| 64 (2) |" + " – |" * 11  # no kernels
    _run_cpu_plumbing("step.gpu", tmp_path, "--lengths", "64", "--frames", "128", "--layers", "1",
                      "--profile", "clustered-100", "floor")
    profile = (tmp_path / "gpu_step_profile_cpu-interpreter.txt").read_text()
    assert "### clustered-100, N = 64: one step" in profile and "### floor, N = 64: one step" in profile
    assert "the host's time, by self CPU time" not in profile  # on a CPU the first table is sorted so


def test_kernel_time_counts_each_kernel_once():
    """``bench_io.kernel_ms``: a step's GPU time is its kernels' sum; a ``record_function``
    range's span on the device (a user annotation over the same kernels) and the CPU ops are
    not added again."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from benchmarks import bench_io

    def event(device, us, annotation=False):
        return SimpleNamespace(device_type=device, self_device_time_total=us, is_user_annotation=annotation)

    events = [event(DeviceType.CUDA, 1500), event(DeviceType.CUDA, 250),
              event(DeviceType.CUDA, 1750, annotation=True),  # "attention.kmeans" around both
              event(DeviceType.CPU, 1750)]  # an op whose kernels these are
    assert bench_io.kernel_ms(events) == 1.75


def test_benchmark_failure_cells_name_the_error_in_one_line():
    """A failed cell of the GPU tables: the error's type and its first line cut to the width,
    and an error without a message still makes a cell (rather than ending the run)."""
    from benchmarks import bench_io
    assert bench_io.failure(ValueError("bad tile\nsecond line"), 5) == "ValueError: bad t"
    assert bench_io.failure(RuntimeError()) == "RuntimeError: "


def test_centroid_backward_tile_switch_sets_its_tile_whatever_the_rows_length():
    """``clustering_gpu.with_centroid_bwd_tile(keys, warps)``: the backward's key block and warps
    are the switch's on short rows and long ones alike (the launcher now passes each row's
    length), the forward's tile the launcher's."""
    import triton.language as tl

    from benchmarks.attention import clustering_gpu
    from fastasr.kernels.clustering import triton_centroid

    forward = triton_centroid.centroid_tiles(100, 32, 32, tl.bfloat16, False, 800)
    with clustering_gpu.with_centroid_bwd_tile(64, 8):
        for length in (800, 16384, None):
            tile = triton_centroid.centroid_tiles(100, 32, 32, tl.bfloat16, True, length)
            assert (tile["BLOCK_N"], tile["num_warps"]) == (64, 8), length
        assert triton_centroid.centroid_tiles(100, 32, 32, tl.bfloat16, False, 800) == forward
    assert triton_centroid.centroid_tiles(100, 32, 32, tl.bfloat16, True, 800)["num_warps"] == 4  # restored


def test_benchmark_budget_stops_new_rows_and_says_where(monkeypatch, tmp_path):
    """``bench_io.Budget``: unlimited without seconds or ``$BENCH_DEADLINE``; once spent it
    notes once where the tables stop, and clustering_gpu's tables start no row past it (the
    header stays, so the file says what was cut); a malformed deadline is an error naming it."""
    from benchmarks import bench_io
    from benchmarks.attention import clustering_gpu
    monkeypatch.delenv(bench_io.DEADLINE_ENV, raising=False)
    lines: list[str] = []
    assert not bench_io.Budget().spent(lines, "x") and not bench_io.Budget(3600).spent(lines, "x")
    assert lines == []
    spent = bench_io.Budget(0)
    assert spent.spent(lines, "row A") and spent.spent(lines, "row B")
    assert lines == ["", "Time budget reached: row A and what follows it not timed."]
    monkeypatch.setenv(bench_io.DEADLINE_ENV, "1.5")  # long past
    assert bench_io.Budget(3600).spent([], "x")
    monkeypatch.setenv(bench_io.DEADLINE_ENV, "soon")
    with pytest.raises(SystemExit, match="BENCH_DEADLINE.*'soon'"):
        bench_io.Budget()
    monkeypatch.delenv(bench_io.DEADLINE_ENV)
    monkeypatch.setattr(clustering_gpu, "BUDGET", bench_io.Budget(0))
    lines = []
    clustering_gpu.kmeans_table(lines, [64, 128], 1, None, [])
    assert any(line.startswith("## Hamming K-means") for line in lines)
    assert lines[-1] == "Time budget reached: K-means at N = 64 and what follows it not timed."
    assert not any(line.startswith("| 64 ") for line in lines)
    clustering_gpu.attention_table(lines, [64], 1)
    assert not any(line.startswith("| 64 ") for line in lines)
    from benchmarks.step import gpu as gpu_step
    from fastasr.kernels.clustering import ops

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # --device cpu's condition; nothing runs a kernel here
    monkeypatch.setenv(ops.KERNELS_ENV, "reference")
    gpu_step.main(["--device", "cpu", "--lengths", "64", "--frames", "128", "--variants", "full", "floor",
                   "--budget-s", "0", "--out-dir", str(tmp_path)])
    md = (tmp_path / "gpu_step_cpu-interpreter.md").read_text()
    assert md.count("| 64 (2) | not timed | not timed |") == 2
    assert "Time budget reached: full at N = 64 and what follows it not timed." in md


_FAKE_GPU_PYTHON = """#!/usr/bin/env bash
# python on a GPU machine, for gpu/check.sh's own logic: names a GPU, logs each call
echo "$*" >> "$FAKE_LOG"
case "$*" in
  *get_device_name*) echo "Fake GPU 80GB" ;;
  *git_commit*) echo abc1234 ;;
  *machine_slug*) echo fake-gpu-80gb ;;
  *compile-check*) echo "$BENCH_DEADLINE $(date +%s)" > "$FAKE_LOG.deadline"; sleep "$FAKE_COMPILE_S" ;;
  *fastasr.cli.budget*) mkdir -p outputs/budget/table2-frames-gpu && echo "| member |" > outputs/budget/table2-frames-gpu/budget.md ;;
esac
exit 0
"""


def test_gpu_check_keeps_to_its_budget(tmp_path):
    """``make gpu-check``'s script, with a stand-in Python that names a GPU: each step's cap is
    cut to what the budget has left (the compile check's 60 s to 41 - 15 = 26), the step is
    told its deadline 10 s before its cap (``$BENCH_DEADLINE``), the steps after the budget is
    spent are skipped and say so in the summary, and the compiled tests spread over processes
    where pytest-xdist is importable; Table 2's members train for a third of what the budget
    leaves less the study's setup (at most 90 s; under 30 skips it); skipped is not failed
    (exit 0)."""
    import shutil

    (tmp_path / "benchmarks" / "gpu").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "gpu" / "check.sh", tmp_path / "benchmarks" / "gpu" / "check.sh")
    fake = tmp_path / "fakepy"
    fake.write_text(_FAKE_GPU_PYTHON)
    fake.chmod(0o755)
    log = tmp_path / "calls.log"
    env = {**os.environ, "PYTHON": str(fake), "FAKE_LOG": str(log), "GPU_CHECK_TRAIN": "0",
           "GPU_CHECK_BUDGET_S": "41", "FAKE_COMPILE_S": "7"}
    env.pop("OUT", None)

    def gpu_check(part: str = "kernels") -> tuple[list[str], str]:
        """The script's run: the stand-in's calls, a line each, and the summary (named by the
        ``part`` that ran)."""
        log.unlink(missing_ok=True)
        results = tmp_path / "benchmarks" / "results"
        for old in results.glob("gpu_check_*.md"):
            old.unlink()
        proc = subprocess.run(["bash", str(tmp_path / "benchmarks" / "gpu" / "check.sh")], capture_output=True,
                              text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        summary = (results / f"gpu_check_fake-gpu-80gb{'_' * bool(part)}{part}.md").read_text()
        return log.read_text().splitlines(), summary

    calls, summary = gpu_check()
    deadline, started = map(int, (tmp_path / "calls.log.deadline").read_text().split())
    # cap 26 s, less 10; the budget's clock runs from the script's start, so the seconds a loaded
    # machine takes to reach the step (its stand-in calls before it) come off the cap too
    assert 13 <= deadline - started <= 16
    assert "| Triton compile check (sm_90) | ok |" in summary
    assert "| tests compiled on CUDA | skipped: the 41 s budget is spent | 0 |" in summary
    assert summary.count("skipped: the 41 s budget is spent") == 9 and "budget 41 s" in summary
    assert "| FSDD speaker-disjoint | skipped: no data/fsdd_src/recordings" in summary
    calls = "\n".join(calls)
    assert "compile-check --jobs" in calls and "pytest" not in calls and "clustering_gpu" not in calls
    env.update(GPU_CHECK_BUDGET_S="480", FAKE_COMPILE_S="0")
    calls, _ = gpu_check()
    pytest_call = next(c for c in calls if c.startswith("-m pytest"))
    assert " -n " in pytest_call and "tests/test_kernels_triton.py" in pytest_call
    assert [c.split()[1] for c in calls if c.startswith("-m benchmarks.")] == [
        "benchmarks.step.gpu", "benchmarks.attention.gpu_table", "benchmarks.attention.full_paths",
        "benchmarks.step.layer_norm_gpu", "benchmarks.gpu.launches", "benchmarks.step.gpu",
        "benchmarks.attention.clustering_gpu",
        "benchmarks.gpu.decisions"]
    assert any(c.startswith("-m pytest") and "-m cuda tests/" in c for c in calls)
    # FSDD carried: its step alone (no kernel steps) builds the speaker-disjoint split and trains
    # with the documented data=manifest command, its budget cut to GPU_CHECK_FSDD_MINUTES
    (tmp_path / "data" / "fsdd_src" / "recordings").mkdir(parents=True)
    env.update(GPU_CHECK_KERNELS="0", GPU_CHECK_FSDD_MINUTES="3")
    calls, summary = gpu_check("fsdd")
    assert not any(c.startswith(("-m benchmarks.", "-m pytest", "-m fastasr.cli.kernels")) for c in calls), calls
    assert "-m fastasr.cli.corpus digits data/fsdd_src data/fsdd_speakers --split speakers" in calls
    train = next(c for c in calls if c.startswith("train.py"))
    assert train.startswith("train.py data=manifest tokenizer=char data.train_manifest=data/fsdd_speakers/train.jsonl")
    assert "trainer.max_time=00:00:03:00" in train and "name=gpu-check-fsdd" in train
    assert "| FSDD speaker-disjoint, the recorded-speech recipe (3 min) | ok |" in summary
    # Table 2 after it: (300 s - 15 for the summary - 150 for the study's setup) / 3 = 45 s a member,
    # less a third of the seconds a loaded machine takes to reach the step (the budget's clock)
    env.update(GPU_CHECK_TABLE2="1", GPU_CHECK_BUDGET_S="300")
    calls, summary = gpu_check("table2")
    study = next(c for c in calls if c.startswith("-m fastasr.cli.budget"))
    member_s = re.search(r"budget\.max_time=00:00:00:(\d\d) ", study)
    assert "budget=table2_frames" in study and member_s and 42 <= int(member_s.group(1)) <= 45, study
    assert f"| Table 2 on the GPU (budget=table2_frames, {member_s.group(1)} s a member, bf16) | ok |" in summary
    assert "## Table 2 on the GPU" in summary and "| member |" in summary
    # each member times Lightning's actions, and the study's log becomes their table
    assert '"capture_steps=auto","+trainer.profiler=simple"]' in study, study
    assert "-m benchmarks.step.actions outputs/budget/table2-frames-gpu/budget.log --machine fake-gpu-80gb " \
           "--tag table2_frames" in calls
    env.update(GPU_CHECK_BUDGET_S="600")
    calls, _ = gpu_check("table2")
    assert "budget.max_time=00:00:01:30" in next(c for c in calls if c.startswith("-m fastasr.cli.budget"))
    env.update(GPU_CHECK_BUDGET_S="200")
    calls, summary = gpu_check("table2")
    assert not any(c.startswith("-m fastasr.cli.budget") for c in calls)
    assert "| Table 2 on the GPU | skipped: under 30 s of training a member left of the 200 s budget | 0 |" in summary
    # make train alone: the corpus and its LM, then train.py with captured steps, its own seconds
    # (the target's figure) in the summary
    shutil.rmtree(tmp_path / "data" / "fsdd_src")
    env.update(GPU_CHECK_TRAIN="1", GPU_CHECK_TABLE2="0", GPU_CHECK_BUDGET_S="480")
    calls, summary = gpu_check("")
    train = next(c for c in calls if c.startswith("train.py"))
    assert "name=gpu-check" in train and "capture_steps=auto" in train and "+trainer.profiler=simple" in train
    assert "-m benchmarks.step.actions outputs/runs/gpu-check --machine fake-gpu-80gb --tag make_train" in calls
    assert re.search(r"make train on the GPU: train.py took \d+ s after the corpus and LM \(capture_steps=auto\)",
                     summary), summary
    # the #88 targets' call: make train for GPU_CHECK_TRAIN_MINUTES, then step/gpu.py's eager and
    # captured columns of the four attentions alone, no other kernel step
    env.update(GPU_CHECK_KERNELS="step", GPU_CHECK_TRAIN_MINUTES="2")
    calls, summary = gpu_check("")
    assert "trainer.max_time=00:00:02:00" in next(c for c in calls if c.startswith("train.py"))
    benches = [c for c in calls if c.startswith(("-m benchmarks.", "-m pytest", "-m fastasr.cli.kernels"))
               and not c.startswith("-m benchmarks.step.actions")]
    assert len(benches) == 1 and benches[0].startswith("-m benchmarks.step.gpu --variants full clustered-100"), benches
    assert benches[0].count("as CUDA graphs") == 4 and "switch" not in benches[0]
    assert "| make train (2 min of training, test, beam + LM) | ok |" in summary
    assert "| step/gpu.py (eager and as CUDA graphs) | ok |" in summary


def test_benchmark_tables_name_the_commit_and_changes(tmp_path, monkeypatch):
    """The commit a table names: the short hash, ``+changes`` once a tracked file differs from it
    (a GPU machine's copy can carry an older ``.git`` than its files), ``FASTASR_COMMIT`` where
    set, ``unknown`` outside a checkout."""
    from benchmarks import bench_io
    monkeypatch.delenv("FASTASR_COMMIT", raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(repo)]
    (repo / "f.txt").write_text("a\n")
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert bench_io.git_commit(repo) == head
    (repo / "f.txt").write_text("b\n")
    assert bench_io.git_commit(repo) == f"{head}+changes"
    monkeypatch.setenv("FASTASR_COMMIT", "abc1234")
    assert bench_io.git_commit(repo) == "abc1234"
    monkeypatch.delenv("FASTASR_COMMIT")
    outside = tmp_path / "plain"
    outside.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert bench_io.git_commit(outside) == "unknown"


def test_tests_that_need_a_gpu_are_marked_cuda_and_run_by_the_gpu_check():
    """No test skips itself on ``torch.cuda.is_available()``: those that need a GPU carry the
    ``cuda`` marker (skipped in CI by conftest.py), and ``make gpu-check`` runs ``-m cuda``,
    so no test skips both in CI and in the GPU check."""
    marked, self_skip = [], "skipif(not torch.cuda" + ".is_available()"
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        text = path.read_text()
        assert self_skip not in text, path.name
        marked += [path.name] * text.count("@pytest.mark.cuda")
    assert {"test_attention_dtypes.py", "test_mixed_precision.py"} <= set(marked), marked
    check = (ROOT / "benchmarks" / "gpu" / "check.sh").read_text()
    assert '-m cuda tests/' in check
