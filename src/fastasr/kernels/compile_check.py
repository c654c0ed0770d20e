"""Compile every Triton kernel for a CUDA architecture without a GPU.

    python -m fastasr.kernels.compile_check            # sm_90
    python -m fastasr.kernels.compile_check --arch 80 --verbose
    python -m fastasr.kernels.compile_check --only kmeans --loops   # + each hot loop's length

The interpreter (``TRITON_INTERPRET=1``) checks what the kernels compute, but not
that they compile: dtype rules, ``tl.dot`` shapes and register pressure only show
in the real compiler. Triton compiles to a cubin with its bundled ``ptxas`` and no
GPU present, so this builds each kernel in the configurations the launchers use
(the same block-size functions) and reads ptxas' resource report with the bundled
``cuobjdump``: registers per thread and stack (spill) bytes. Exit status 1 if a
kernel fails to compile, spills or holds a GPU-wide fence (below). Run it in a process where ``TRITON_INTERPRET``
is unset (the kernels must be defined as compiled ``JITFunction`` objects).

``--loops`` also reads each cubin's SASS (``cuobjdump -sass``) and reports the instructions a
thread issues in one iteration of its hot loop: the innermost loop that holds tensor-core
products (``HGMMA``, ``HMMA``), else the longest innermost loop, and of a loop inside it (which
runs its trip count: the centroid backward's 575 hold an 89-instruction loop over a block's top
keys, run as often as the most a row has there). It is a measure of a kernel's
work that needs no GPU (not a timing: latency, occupancy and memory are not in it), e.g. that
K-means' tile with stored signs is 277 instructions against 754 (benchmarks/gpu/notes.md).

Every cubin's SASS is also searched for GPU-wide memory fences (``MEMBAR`` at GPU scope) and
L1 invalidations (``CCTL.IVALL``): Triton puts both around every ``tl.atomic_add`` with its
default ``acq_rel`` semantics, which no kernel here needs (their atomics add partial sums that
only a later launch reads), so each is a failure: the kernels' atomics say ``sem="relaxed"``,
which compiles to fire-and-forget ``REDG`` reductions. An integer-to-float conversion (``I2F``) in
an innermost loop fails too (:func:`loop_conversions`).

The kernels are compiled as a launch on contiguous tensors specialises them
(:func:`launch_specialisation`): pointers 16-byte aligned, each tensor's innermost stride 1
(per-position rows read through their position strides take it as implicit), its other strides
and the row widths (E, K, ...) multiples of 16; lengths and counts without the hint.
Vectorised loads and stores follow from it (the sparse backward: 128 registers for bf16, E = 32,
against 195 with its rows' position strides taken as 1).

Compilation is CPU work, one configuration at a time in Triton, so ``--jobs`` (default:
every core) compiles that many configurations at once in forked processes: on a
16-core GPU machine with an empty Triton cache the whole check takes seconds instead
of over a minute. The report keeps the configurations' order whatever the jobs.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

__all__ = ["KernelReport", "compile_all", "ctas_per_sm", "hot_loop", "innermost_loops", "main"]


@dataclass
class KernelReport:
    name: str
    ok: bool
    registers: int | None = None
    stack_bytes: int | None = None
    error: str = ""
    #: :func:`hot_loop`'s instructions: one iteration, and one of each loop inside it (``--loops``;
    #: None: not read, or no loop)
    hot_loop: tuple[int, tuple[int, ...]] | None = None
    #: :func:`innermost_loops` (``--loops``; empty: not read, or no loop)
    innermost: tuple[int, ...] = ()
    #: GPU-wide memory fences and L1 invalidations in the SASS (:func:`gpu_fences`)
    fences: int = 0
    #: int-to-float conversions in the innermost loops (:func:`loop_conversions`)
    conversions: int = 0
    #: shared memory a CTA allocates, bytes (Triton's ``metadata.shared``)
    shared_bytes: int | None = None
    warps: int | None = None
    #: :func:`ctas_per_sm` of the registers, shared memory and warps (None: an unknown arch)
    ctas_per_sm: int | None = None

    @property
    def fails(self) -> bool:
        """What the check fails: not compiled, spilling, holding a GPU-wide fence, or converting
        integers to floats in a loop."""
        return not self.ok or bool(self.stack_bytes) or bool(self.fences) or bool(self.conversions)


#: An SM's limits by compute capability x 10 (CUDA C++ Programming Guide, "Compute capabilities"):
#: threads, CTAs, 32-bit registers (in 4 sub-partitions), shared memory a CTA may use in all
#: (the largest carve-out) and what the system reserves a CTA.
_SM_LIMITS = {
    80: {"threads": 2048, "ctas": 32, "registers": 65536, "shared": 164 * 1024, "reserved": 1024},
    86: {"threads": 1536, "ctas": 16, "registers": 65536, "shared": 100 * 1024, "reserved": 1024},
    89: {"threads": 1536, "ctas": 24, "registers": 65536, "shared": 100 * 1024, "reserved": 1024},
    90: {"threads": 2048, "ctas": 32, "registers": 65536, "shared": 228 * 1024, "reserved": 1024},
}


def ctas_per_sm(registers: int, shared_bytes: int, warps: int, arch: int = 90) -> int | None:
    """How many CTAs of a kernel an SM of ``sm_<arch>`` holds at once, as CUDA's occupancy
    calculator counts them: registers are allocated a warp at a time (a thread's rounded up to
    8, 256 a warp) from 4 sub-partitions that each hold whole warps; shared memory a CTA is its
    allocation plus the reserved 1 KB; and the threads' and CTAs' caps. None for an arch not in
    :data:`_SM_LIMITS`. E.g. 230 registers, 40 KB and 4 warps on sm_90: 2 (the registers bound it).
    """
    limits = _SM_LIMITS.get(arch)
    if limits is None:
        return None
    per_warp = -(-registers // 8) * 8 * 32
    per_partition = limits["registers"] // 4 // per_warp  # whole warps a sub-partition holds
    by_registers = per_partition * 4 // warps
    by_shared = limits["shared"] // (shared_bytes + limits["reserved"])
    by_threads = limits["threads"] // (32 * warps)
    return min(by_registers, by_shared, by_threads, limits["ctas"])


def _configs():
    """(label, kernel, pointer dtypes, constexprs, launch options) as the launchers use them."""
    import triton.language as tl

    from fastasr.kernels import cluster_order as co  # needs Triton
    from fastasr.kernels import triton_broadcast as tb  # needs Triton
    from fastasr.kernels import triton_centroid as tcen  # needs Triton
    from fastasr.kernels import triton_clustered as tc  # needs Triton
    from fastasr.kernels import triton_column_sums as tcs  # needs Triton
    from fastasr.kernels import triton_gelu_dropout as tgd  # needs Triton
    from fastasr.kernels import triton_hashing as th  # needs Triton
    from fastasr.kernels import triton_improved as ti  # needs Triton
    from fastasr.kernels import triton_kmeans as tk  # needs Triton
    from fastasr.kernels import triton_layer_norm as tln  # needs Triton
    from fastasr.kernels import triton_topk as tt  # needs Triton

    torch_dtypes = {"fp32": tc.torch.float32, "bf16": tc.torch.bfloat16, "fp16": tc.torch.float16}

    out = []
    for x_t, p_t, acc in (("*fp32", "*fp32", tl.float32), ("*bf16", "*fp32", tl.float32),
                          ("*fp64", "*fp64", tl.float64)):
        out.append((f"hash {x_t[1:]}", th._hash_kernel,
                    {"x_ptr": x_t, "planes_ptr": p_t, "len_ptr": "*i64", "out_ptr": "*i64"},
                    {"HAS_LENGTHS": True, "ACC_DTYPE": acc, "BLOCK_N": th.BLOCK_N, "BLOCK_E": 32,
                     "BLOCK_BITS": 64}, {}))
    # without HASH the vectors' pointers are the codes' (not read)
    km_ptrs = {"codes_ptr": "*i64", "cent_ptr": "*i64", "len_ptr": "*i64", "assign_ptr": "*i64",
               "ones_ptr": "*i32", "counts_ptr": "*i32", "BITMASK": "i64", "x_ptr": "*i64", "planes_ptr": "*i64"}
    for clusters in (100, tk.MAX_CLUSTERS):
        for in_kernel, accumulate, length in ((True, False, 800), (True, False, tk.WIDE_TILE_FROM),
                                              (False, True, 16384), (False, False, 16384)):
            tile = tk.lloyd_tile(clusters, in_kernel, length)
            options = {k: tile.pop(k) for k in ("num_warps", "num_stages")}
            # the codes unpacked in every sweep (the split's default), and their signs written once
            # and read (stored signs: the one launch's default)
            for stored in (False, True):
                label = (f"kmeans lloyd C={clusters} in_kernel={in_kernel} accumulate={accumulate} "
                         f"tile {tile['BLOCK_N']}x{options['num_warps']}" + (" stored signs" if stored else ""))
                if any(label == row[0] for row in out):  # C = 256 has one tile whatever the length
                    continue
                # as launched: the one launch passes its int64 counts for the unused pointers, and
                # the codes for the signs without stored signs
                counts = ({"ones_ptr": "*i64", "counts_ptr": "*i64", "moved_ptr": "*i64"} if in_kernel
                          else {"moved_ptr": "*i32"})
                consts = {"IN_KERNEL": in_kernel, "ACCUMULATE": accumulate, "AFTER_VOTE": accumulate,
                          "WRITE_SIGNS": stored, "READ_SIGNS": stored, "HASH": False, "BLOCK_E": 16, **tile}
                types = {**km_ptrs, **counts, "signs_ptr": "*fp16" if stored else "*i64"}
                out.append((label, tk._lloyd_kernel, types, consts, options))
                if in_kernel and stored:  # hash_kmeans: the launch hashes the vectors (heads of 32)
                    for x_t in ("*bf16", "*fp32"):
                        out.append((f"{label} hashed {x_t[1:]}", tk._lloyd_kernel,
                                    {**types, "x_ptr": x_t, "planes_ptr": "*fp32"},
                                    {**consts, "HASH": True, "BLOCK_E": 32},
                                    {**options, "num_stages": tk.HASH_IN_KMEANS_STAGES}))
    for after_vote in (False, True):
        out.append((f"kmeans update after_vote={after_vote}", tk._update_kernel,
                    {"cent_ptr": "*i64", "ones_ptr": "*i32", "counts_ptr": "*i32",
                     "moved_before_ptr": "*i32", "moved_ptr": "*i32"},
                    {"AFTER_VOTE": after_vote, "BLOCK_C": tk.UPDATE_BLOCK_C}, {}))
    for block_n in (1024, 4096, tt.MAX_N):  # N = 800, 3,200 and the longest held
        rows, warps = tt.topk_tile(block_n, 1 << 20)  # as launched on a batch's many rows
        for weights, bracket in ((False, False), (True, False), (True, True)):  # the bracket: i-clustered's launch
            out.append((f"topk N<={block_n} rows={rows} warps={warps} weights={weights}" + (" bracket" if bracket else ""),
                        tt._topk_kernel, {"x_ptr": "*fp32", "out_ptr": "*i64", "lse_ptr": "*fp32", "w_ptr": "*fp32"},
                        {"BLOCK_N": block_n, "ROWS": rows, "WEIGHTS": weights,
                         "CHUNK": tt.store_chunk(block_n, rows, warps), "BRACKET": bracket,
                         "GROUPS": tt.BRACKET_GROUPS},
                        {"num_warps": warps}))
    for t in ("fp32", "bf16", "fp16"):
        dot_dtype, precision = tc.dot_config(
            torch_dtypes[t], False)
        widest = tcen.MAX_CENTROIDS // 2 if t == "fp32" else tcen.MAX_CENTROIDS
        cases = [(25, 32), (100, 32), (widest, 32)] + ([] if t == "fp32" else [(25, 64), (64, 64)])
        for clusters, E in cases:  # the tiles max_centroids serves, up to its bounds
            data = {"c_ptr": "*fp32", "k_ptr": f"*{t}", "v_ptr": f"*{t}", "len_ptr": "*i64", "scale": "fp32"}
            for kernel, backward, ptrs in (
                (tcen._centroid_fwd_kernel, False, {"logits_ptr": "*fp32", "part_m_ptr": "*fp32",
                                                    "part_l_ptr": "*fp32", "part_acc_ptr": "*fp32"}),
                (tcen._centroid_bwd_kernel, True, {"lse_ptr": "*fp32", "values_ptr": "*fp32",
                                                   "dvalues_ptr": f"*{t}", "tw_ptr": "*fp32", "dtw_ptr": "*fp32",
                                                   "idx_ptr": "*i64", "dc_ptr": "*fp32",
                                                   "dk_ptr": f"*{t}", "dv_ptr": f"*{t}"}),
            ):
                name = "centroid_bwd" if backward else "centroid_fwd"
                # with top keys (i-clustered: up to triton_improved.MAX_CENTROIDS centroids its one op, more
                # the two ops); without (clustered's split-key values: a subset of
                # the code, compiled once, at the paper's shape); the backward's top keys in
                # increasing position as the Triton top-k writes them (sorted), or in torch.topk's
                # order (rows past triton_topk.MAX_N: at the paper's shape)
                tops = [(True, True)]
                if (t, clusters, E) == ("bf16", 100, 32):
                    tops.append((False, True))
                    if backward:
                        tops.append((True, False))
                # the backward also on short rows where their tile takes fewer warps than long rows'
                short = tcen.SHORT_BACKWARD_BELOW - 1
                lengths = [None] + ([short] if tcen.centroid_tiles(clusters, E, E, dot_dtype, backward, short)
                                    != tcen.centroid_tiles(clusters, E, E, dot_dtype, backward) else [])
                for (top, in_order), keys in itertools.product(tops, lengths):
                    tiles = tcen.centroid_tiles(clusters, E, E, dot_dtype, backward, keys)
                    options = {"num_warps": tiles.pop("num_warps")}
                    consts = {"DOT_DTYPE": dot_dtype, "PRECISION": precision, "SPAN": tcen.SPLIT_KEYS, **tiles}
                    # with top keys the backward is i-clustered's one op (triton_improved): it adds the
                    # sparse part's float32 dk, dv and reads its float32 dvalues
                    one_op = top and clusters <= ti.MAX_CENTROIDS
                    flags = ({"HAS_TOP": top, "BLOCK_K": 32, "TOP_SORTED": in_order, "ADD": one_op}
                             if backward else {"LOGITS": top})
                    added = ({"dvalues_ptr": "*fp32", "dk_add_ptr": "*fp32", "dv_add_ptr": "*fp32"} if one_op else
                             {"dk_add_ptr": f"*{t}", "dv_add_ptr": f"*{t}"}) if backward else {}
                    out.append((f"{name} {t} C={clusters} E={E} tile {tiles['BLOCK_C']}x{tiles['BLOCK_N']}"
                                + ("" if top else " no top keys") + ("" if in_order else " top keys unordered")
                                + ("" if keys is None else f" {options['num_warps']} warps (rows under {keys + 1:,} keys)"),
                                kernel, {**data, **ptrs, **added}, {**consts, **flags}, options))
            if t == "fp32":  # the combine kernel reads fp32 partials whatever the inputs
                continue
            tiles = tcen.centroid_tiles(clusters, E, E, dot_dtype, False)
            out.append((f"centroid_combine {t} C={clusters} E={E}", tcen._centroid_combine_kernel,
                        {"part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "part_acc_ptr": "*fp32",
                         "values_ptr": f"*{t}", "values32_ptr": "*fp32", "lse_ptr": "*fp32"},
                        {"BLOCK_C": tiles["BLOCK_C"], "BLOCK_V": tiles["BLOCK_V"]},
                        {"num_warps": tiles["num_warps"]}))
    for t in ("fp32", "bf16", "fp16"):
        dot_dtype, precision = tc.dot_config(
            torch_dtypes[t], False)
        for clusters, width in ((100, 32), (100, tb.MAX_WIDTH), (tb.MAX_CLUSTERS, tb.MAX_TILE // tb.MAX_CLUSTERS)):
            rows = {"assign_ptr": "*i64", "counts_ptr": "*i64"}
            # the values' dtype; float32 means' gradients, each over its count (cluster_means)
            for source, mean in sorted({(t, False), ("fp32", True)}):
                out.append((f"broadcast {source} to {t} D={width}" + (" over counts" if mean else ""),
                            tb._broadcast_kernel, {**rows, "x_ptr": f"*{source}", "out_ptr": f"*{t}"},
                            {"MEAN": mean, **tb.broadcast_tile(width)}, {}))
            tile = tb.cluster_sum_tile(clusters, width, torch_dtypes[t])
            options = {"num_warps": tile.pop("num_warps")}
            for atomic in (True, False):  # spans meeting in atomics; one program's means
                out.append((f"cluster_sum {t} C={clusters} D={width} {options['num_warps']} warps"
                            + (" atomic" if atomic else " means"),
                            tb._cluster_sum_kernel, {**rows, "dout_ptr": f"*{t}", "dx_ptr": "*fp32"},
                            {"ATOMIC": atomic, "MEAN": not atomic, "DOT_DTYPE": dot_dtype, "PRECISION": precision,
                             **tile}, options))
    # the rows' dtype and the output's: float32 rows into bfloat16 under autocast (LayerNorm's cast_output)
    for t, y in (("fp32", "fp32"), ("bf16", "bf16"), ("fp32", "bf16")):
        for width in (192, 768, tln.MAX_WIDTH) if t == y else (192,):  # the paper model's, a feed-forward's, the widest
            ptrs = {"x_ptr": f"*{t}", "w_ptr": "*fp32", "stats_ptr": "*fp32"}
            for name, kernel, tile, out_ptrs in (
                ("layer_norm_fwd", tln._forward_kernel, tln.forward_tile(width),
                 {"b_ptr": "*fp32", "y_ptr": f"*{y}"}),
                ("layer_norm_bwd", tln._backward_kernel, tln.backward_tile(width),
                 {"dy_ptr": f"*{y}", "dx_ptr": f"*{t}", "partial_ptr": "*fp32"}),
            ):
                options = {"num_warps": tile.pop("num_warps")}
                out.append((f"{name} {t}{'' if t == y else f' to {y}'} D={width} rows={tile['ROWS']}x{options['num_warps']}",
                            kernel, {**ptrs, **out_ptrs, "eps": "fp32"}, tile, options))
    for t in ("fp32", "bf16"):
        for width in (48, 192, 768):  # a vocabulary's, the paper model's rows, a feed-forward's
            tile = tcs.column_tile(width)
            options = {"num_warps": tile.pop("num_warps")}
            out.append((f"column_sums {t} D={width} rows={tile['ROWS']} block {tile['BLOCK_D']}x{options['num_warps']}",
                        tcs._column_sums_kernel, {"x_ptr": f"*{t}", "partial_ptr": "*fp32"}, tile, options))
    for t in ("fp32", "bf16", "fp16"):
        seed = {"seed_lo": "i64", "seed_hi": "i64", "threshold": "i32", "scale": "fp32"}
        out.append((f"gelu_dropout_fwd {t}", tgd._forward_kernel, {"x_ptr": f"*{t}", "y_ptr": f"*{t}", **seed},
                    {"BLOCK": tgd.BLOCK}, {"num_warps": tgd.WARPS}))
        out.append((f"gelu_dropout_bwd {t}", tgd._backward_kernel,
                    {"x_ptr": f"*{t}", "dy_ptr": f"*{t}", "dx_ptr": f"*{t}", **seed}, {"BLOCK": tgd.BLOCK},
                    {"num_warps": tgd.WARPS}))
    for clusters in (100, tk.MAX_CLUSTERS):
        block_c, block_p = co.table_tile(clusters)
        out.append((f"block table C={clusters}", co._block_table_kernel, {"counts_ptr": "*i64", "table_ptr": "*i64"},
                    {"BLOCK_N": 64, "BLOCK_C": block_c, "BLOCK_P": block_p}, {}))
    idx = {"idx_ptr": "*i64", "perm_ptr": "*i64", "blk_ptr": "*i64"}
    for t in ("fp32", "bf16", "fp16"):
        for E in (32, 64):
            dot_dtype, precision = tc.dot_config(
                torch_dtypes[t], False)
            block_n, block_k, block_e = tc._blocks(32, E, dot_dtype)
            consts = {"DOT_DTYPE": dot_dtype, "PRECISION": precision, "BLOCK_N": block_n,
                      "BLOCK_K": block_k, "BLOCK_E": block_e}
            tag = f"{t} K=32 E={E}"
            out.append((f"gather_dot {tag}", tc._gather_dot_kernel,
                        {**idx, "x_ptr": f"*{t}", "m_ptr": f"*{t}", "out_ptr": f"*{t}"}, consts, {}))
            out.append((f"gather_wsum {tag}", tc._gather_wsum_kernel,
                        {**idx, "w_ptr": f"*{t}", "m_ptr": f"*{t}", "out_ptr": f"*{t}"}, consts, {}))
            out.append((f"scatter_outer {tag}", tc._scatter_outer_kernel,
                        {**idx, "a_ptr": f"*{t}", "x_ptr": f"*{t}", "dm_ptr": "*fp32"}, consts, {}))
            qkv = {**idx, "q_ptr": f"*{t}", "k_ptr": f"*{t}", "v_ptr": f"*{t}", "len_ptr": "*i64",
                   "tw_ptr": "*fp32", "scale": "fp32"}  # top_w: fp32 from the centroid softmax
            bwd_ptrs = {"dout_ptr": f"*{t}", "dq_ptr": f"*{t}", "dk_ptr": "*fp32", "dv_ptr": "*fp32",
                        "dtw_ptr": "*fp32", "dvalues_ptr": "*fp32"}
            for name, kernel, ptrs in (
                ("sparse_fwd", tc._sparse_fwd_kernel, {"values_ptr": f"*{t}", "out_ptr": f"*{t}"}),
                ("sparse_bwd", tc._sparse_bwd_kernel, bwd_ptrs),
            ):
                blocks = tc._sparse_blocks(32, E, E, dot_dtype, kernel is tc._sparse_bwd_kernel)
                sparse = {"DOT_DTYPE": dot_dtype, "PRECISION": precision,
                          **dict(zip(("BLOCK_N", "BLOCK_K", "BLOCK_E", "BLOCK_V"), blocks))}
                out.append((f"{name} {tag}", kernel, {**qkv, **ptrs}, sparse, {}))
    return out


def _cuobjdump(cubin: bytes, option: str) -> str:
    """What Triton's bundled ``cuobjdump <option>`` prints of ``cubin``."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, option, f.name], capture_output=True, text=True, check=True).stdout


def _resource_usage(cubin: bytes) -> tuple[int | None, int | None]:
    text = _cuobjdump(cubin, "--dump-resource-usage")
    regs = re.search(r"REG:(\d+)", text)
    stack = re.search(r"STACK:(\d+)", text)
    return (int(regs.group(1)) if regs else None, int(stack.group(1)) if stack else None)


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(\S[^;]*);")
# BRA 0x22f0, and BRA P2, 0x2330 (also taken only where a second predicate holds)
_BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+(?:!?U?P\w+\s*,\s*)?`?\(?(0x[0-9a-f]+)")


def gpu_fences(sass: str) -> int:
    """GPU-wide memory fences (``MEMBAR.*.GPU``) and L1 invalidations (``CCTL.IVALL``) in ``sass``."""
    return len(re.findall(r"\bMEMBAR\.\w+\.GPU\b|\bCCTL\.IVALL\b", sass))


def loop_conversions(sass: str) -> int:
    """``I2F`` instructions (integer to float: a quarter of the ALU's rate on sm_80 and sm_90)
    in ``sass``'s innermost loops. A boolean's ``.to(tl.float16)`` compiles to a select of 0 or 1
    and one of them a value (K-means' one-hot: 64 a tile, 403 instructions against 277 with
    ``tl.where(cond, 1.0, 0.0)``, which compiles to compares that yield 1.0 or 0.0); ``I2FP``, the
    full-rate conversion to float32, is not counted."""
    spans, body = _loops(sass)
    return sum(1 for s in spans if not _inside(s, spans) for t in body[s] if re.search(r"\bI2F\.", t))


def _loops(sass: str) -> tuple[list, dict]:
    """``sass``'s loops as (first, last) address spans (a branch back to an earlier address
    closes one), and each span's instructions."""
    code = [(int(m.group(1), 16), m.group(2)) for m in _SASS_LINE.finditer(sass)]
    spans = [(int(branch.group(1), 16), address) for address, text in code
             for branch in [_BRANCH.search(text)] if branch and int(branch.group(1), 16) < address]
    return spans, {span: [t for a, t in code if span[0] <= a <= span[1]] for span in spans}


def _inside(span, spans) -> list:
    return [o for o in spans if o != span and span[0] <= o[0] and o[1] <= span[1]]


def innermost_loops(sass: str) -> tuple[int, ...]:
    """The instructions of one iteration of each innermost loop of ``sass`` (a loop with none
    inside it), in the order of their addresses: the top-k's bisection step and its store
    chunk, say, which :func:`hot_loop` reports only the longer of."""
    spans, body = _loops(sass)
    return tuple(len(body[s]) for s in sorted(spans) if not _inside(s, spans))


def hot_loop(sass: str) -> tuple[int, tuple[int, ...]] | None:
    """``sass``'s hot loop: the instructions of one iteration, and of one iteration of each
    loop directly inside it (counted in the first once; they run as often as their trip count).
    The hot loop: among the loops (a branch back to an earlier address closes one), the shortest
    that holds a tensor-core product (``HGMMA``, ``HMMA``), else the longest innermost loop.
    None without a loop."""
    spans, body = _loops(sass)
    if not spans:
        return None
    products = [s for s in spans if any(op in t for t in body[s] for op in ("HGMMA", "HMMA"))]
    if products:
        hot = min(products, key=lambda s: len(body[s]))
    else:
        hot = max((s for s in spans if not _inside(s, spans)), key=lambda s: len(body[s]))
    nested = _inside(hot, spans)
    direct = [o for o in nested if not any(o in _inside(p, nested) for p in nested)]
    return len(body[hot]), tuple(len(body[o]) for o in sorted(direct))


#: Integer arguments that are row widths: heads' features, top keys, rows' width (multiples of 16
#: in every model: heads of 32 or 64, K = 32).
_ROW_WIDTHS = {"E", "EV", "K", "D"}
#: Strides that are not multiples of 16 at the paper's shapes: the hash planes' rows are ``bits``
#: (63) wide.
_ODD_STRIDES = {"stride_pe"}
#: Row strides their launchers pad to a multiple of 16 (the centroid logits' rows:
#: ``triton_centroid.LOGITS_ROW_ALIGN``, read by the top-k).
_PADDED_STRIDES = {"N_PAD", "ROW_STRIDE"}


def launch_specialisation(names, excluded=()) -> tuple[list[str], list[str]]:
    """How a launch on contiguous tensors with row widths of a multiple of 16 specialises a
    kernel's integer arguments ``names`` (Triton makes an integer equal to 1 a constant and marks
    a multiple of 16 divisible): the stride arguments (``s_*``, ``stride_*``) that are the last
    of their tensor's (the innermost: 1), and the other strides, the row widths and
    :data:`_PADDED_STRIDES` (multiples of 16), but for :data:`_ODD_STRIDES`. A tensor whose last
    stride argument is along the positions (its name ends in ``n``: ``s_kn``) is per-position
    rows read with an implicit unit stride along the features (:mod:`fastasr.kernels.rows`): none
    of its strides is 1 (the position stride is ``H * E`` in the model's layout, ``E``
    contiguous). Lengths and counts (``N``, ``C``, ...) are left unmarked: a length of 801 is a
    launch too.
    ``excluded``: names that are not integer arguments (pointers, constexprs)."""
    strides = [n for n in names if n.startswith(("s_", "stride_")) and n not in excluded]
    last = {}
    for n in strides:  # s_qb, s_qh, s_qn, s_qe: one tensor's strides, outermost first
        last[n[:-1]] = n
    unit = sorted(n for n in last.values() if not n.endswith("n"))
    multiples = ([n for n in strides if n not in unit and n not in _ODD_STRIDES]
                 + [n for n in names if n in _ROW_WIDTHS | _PADDED_STRIDES and n not in excluded])
    return unit, multiples


def _compile_one(arch: int, label: str, kernel, types: dict, consts: dict, options: dict,
                 loops: bool = False) -> KernelReport:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kernel.arg_names
    unit, multiples = launch_specialisation(names, set(consts) | {n for n in names if types.get(n, "").startswith("*")})
    consts = {**consts, **dict.fromkeys(unit, 1)}
    signature = {n: ("constexpr" if n in consts else types.get(n, "i32")) for n in names}
    constexprs = {(names.index(n),): v for n, v in consts.items()}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
               if signature[n].startswith("*") or n in multiples}
    try:
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=aligned),
                                  target=GPUTarget("cuda", arch, 32), options={"num_warps": 4, **options})
        regs, stack = _resource_usage(compiled.asm["cubin"])
        sass = _cuobjdump(compiled.asm["cubin"], "-sass")
        warps, shared = compiled.metadata.num_warps, compiled.metadata.shared
        return KernelReport(label, True, regs, stack, hot_loop=hot_loop(sass) if loops else None,
                            innermost=innermost_loops(sass) if loops else (), fences=gpu_fences(sass),
                            conversions=loop_conversions(sass), shared_bytes=shared, warps=warps,
                            ctas_per_sm=ctas_per_sm(regs, shared, warps, arch) if regs else None)
    except Exception as exc:  # noqa: BLE001 - every failure is reported, not raised
        return KernelReport(label, False, error=f"{type(exc).__name__}: {exc}")


#: The configurations a forked worker compiles by index (set in the parent before the fork:
#: kernels and dtypes don't pickle, indices do).
_FORKED_CONFIGS: list = []


def _compile_forked(arch: int, loops: bool, index: int) -> KernelReport:
    return _compile_one(arch, *_FORKED_CONFIGS[index], loops=loops)


def compile_all(arch: int = 90, only: str | None = None, jobs: int = 1, loops: bool = False) -> list[KernelReport]:
    """Compile the kernels for ``sm_<arch>``, ``jobs`` configurations at once; one report per
    configuration, in :func:`_configs`' order; ``loops``: with each hot loop's instructions
    (:func:`hot_loop`)."""
    global _FORKED_CONFIGS
    if os.environ.get("TRITON_INTERPRET", "").strip().lower() in {"1", "true", "yes", "on"}:
        raise RuntimeError("compile_check needs compiled kernels: unset TRITON_INTERPRET")
    configs = [c for c in _configs() if not only or only in c[0]]
    jobs = max(1, min(jobs, len(configs)))
    if jobs == 1:
        return [_compile_one(arch, *c, loops=loops) for c in configs]
    _FORKED_CONFIGS = configs
    try:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            return pool.starmap(_compile_forked, [(arch, loops, i) for i in range(len(configs))], chunksize=1)
    finally:
        _FORKED_CONFIGS = []


def occupancy(report: KernelReport) -> str:
    """``report``'s CTAs an SM as text (", 2 CTAs (8 warps) an SM"), "" where unknown."""
    if report.ctas_per_sm is None:
        return ""
    ctas = report.ctas_per_sm
    return f", {ctas} CTA{'s' if ctas != 1 else ''} ({ctas * report.warps} warps) an SM"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: sm_90)")
    parser.add_argument("--only", default=None, help="compile only configurations whose name contains this")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="configurations compiled at once, each in its own process (default: every core)")
    parser.add_argument("--verbose", action="store_true", help="print compiler errors in full")
    parser.add_argument("--loops", action="store_true",
                        help="also report the instructions of each kernel's hot loop (one iteration, a thread)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    reports = compile_all(args.arch, args.only, args.jobs, args.loops)
    for r in reports:
        if not r.ok:
            err = r.error if args.verbose else r.error.splitlines()[0][:200]
            print(f"FAIL  {r.name}: {err}")
        elif r.stack_bytes:
            print(f"SPILL {r.name}: {r.registers} registers, {r.stack_bytes} stack bytes")
        elif r.fences:
            print(f"FENCE {r.name}: {r.fences} GPU-wide memory fences or L1 invalidations "
                  "(an atomic without sem=\"relaxed\"?)")
        elif r.conversions:
            print(f"I2F   {r.name}: {r.conversions} int-to-float conversions in a loop (a boolean's "
                  ".to(float)? tl.where(cond, 1.0, 0.0) compiles to compares)")
        else:
            hot = ""
            if r.hot_loop is not None:
                hot = f", {r.hot_loop[0]:,} instructions a loop iteration"
                if r.hot_loop[1]:
                    hot += " (a loop inside it: " + ", ".join(f"{n:,}" for n in r.hot_loop[1]) + " instructions a trip)"
                if len(r.innermost) > 1:
                    hot += "; innermost loops " + ", ".join(f"{n:,}" for n in r.innermost)
            print(f"ok    {r.name}: {r.registers} registers, {r.shared_bytes:,} B shared{occupancy(r)}, "
                  f"no spills{hot}")
    bad = sum(r.fails for r in reports)
    print(f"sm_{args.arch}: {len(reports) - bad} of {len(reports)} kernel configurations compile without spills, "
          "GPU-wide fences or int-to-float conversions in a loop")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
