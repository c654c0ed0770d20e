"""The clustering step on a GPU: no host synchronisation, K-means timed, each op against its floor.

    python -m benchmarks.attention.clustering_gpu                                   # CUDA, about a minute
    python -m benchmarks.attention.clustering_gpu --baseline other/triton_kmeans.py # A/B against another K-means
    TRITON_INTERPRET=1 python -m benchmarks.attention.clustering_gpu --device cpu --ns 64 --tokens 128 \
        --repeats 1 --check-n 64 --clusters 4 --heads 1                  # the plumbing on the CPU

1. **No synchronisation.** Forward and backward of each call of :data:`CALLS` (``clustered-100``,
   ``i-clustered-100``, and clustered with its centroid values by the split-key kernels at
   every N, with its hash inside K-means' launch and with its centroid values by FlashAttention's
   variable-length kernel, ``bench_io.KERNEL_SWITCHES``; bf16, padded batch, lengths on the GPU) under
   ``torch.cuda.set_sync_debug_mode("error")``, after one warm-up call (Triton compiles there):
   any ``.item()``, ``nonzero()`` or device-to-host copy in the path raises, and the row says where.
2. **Hamming K-means** (``fastasr.kernels.clustering.triton_kmeans``) at 65,536 tokens a call (``B = 65536
   // N``, N = 800 has 81 sequences), 6 heads, C = 100, 10 iterations, random 63-bit codes, the
   last sequence at 3/4 N: the launcher's own choice of programs per sequence, and every iteration
   in one launch (``spans=1``) forced, and split over spans forced (:func:`split_kmeans`, at
   least 2 a sequence), and the launcher's choice with the sweeps unpacking the codes in every
   sweep instead of reading the signs the one launch stores; ``--tiles`` other tiles (also under a cap
   on a thread's registers, so that more programs share an SM), ``--kmeans-stages`` the launcher's tiles with
   software pipelining (the next tile's codes prefetched); ``--baseline FILE`` adds another
   implementation of the same signature, loaded from a file; and the launcher's choice (also with
   unpacked signs), the one launch and the split again on clustered codes, whose centroids stop moving within the 10 iterations as a trained model's queries do
   (:func:`clustered_codes`), where the one launch stops early and the split path's later
   launches exit at once. Each is first checked equal to the PyTorch reference. Median of
   ``--repeats`` CUDA-event timings.
3. **The whole attention call** (forward + backward, bf16, 6 × 32, 65,536 tokens) of both
   variants per N, clustered's again broadcasting its centroids' values by one ``index_select``
   of rows instead of a gather (:func:`broadcast_by_rows`; the profile's largest kernel after
   K-means), i-clustered's with the cluster order's block table built by its
   PyTorch twin (what its one Triton launch saves the host), and clustered's with its centroid
   values by the split-key kernels at every N (``ops.SPLIT_KEY_VALUES_FROM`` = 0): the
   crossover of that rule; clustered's with its queries hashed inside K-means' one launch
   instead of by the hash kernel's own launch before it (``triton_kmeans.HASH_IN_KMEANS`` =
   True).
4. **The parts**, each against what it replaces, in the same run: i-clustered's fused sparse
   part (also with ``--sparse-tiles``' other tiles) against the Triton products with torch
   around them; the Triton top-k (also taking a row's entries all at once rather than by
   chunks, ``triton_topk.STORE_ELEMENTS``, and with ``--topk-tiles``) against ``torch.topk``;
   i-clustered's centroid attention in torch (the reference's products and softmax) and fused
   (also with 256 keys a program, and with ``--centroid-bwd-tiles``' backward tiles), and clustered's centroid values by SDPA, by the
   split-key kernels and by FlashAttention's variable-length kernel (``ops.VARLEN_CENTROID_VALUES``).
5. torch.profiler's largest CUDA kernels of one clustered-100 and one i-clustered-100 call at
   N = 4,096 (where the rest of the time goes); and last each call of :data:`CALLS` replayed
   as one CUDA graph (the GPU's time without the host's launches).

Writes ``benchmarks/results/clustering_<gpu>.md`` after each table, so a run cut short keeps
what it timed; with ``--budget-s`` (or ``$BENCH_DEADLINE``, which ``make gpu-check`` sets from
the step's time cap) no new row starts once the time is up, and the table says where it stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import sys
from pathlib import Path
from unittest import mock

from benchmarks import bench_io, timing

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from fastasr.attention import build_attention  # noqa: E402
from fastasr.kernels.clustering import ops, reference, triton_kmeans  # noqa: E402

TOKENS = 65536  # a call's tokens (--tokens)
HEADS, DIM, CLUSTERS, ITERATIONS = 6, 32, 100, 10  # --heads, --clusters
#: Where it runs: the GPU, or (--device cpu, under TRITON_INTERPRET=1) the CPU with the Triton
#: kernels interpreted, a plumbing check of this script whose times mean nothing.
DEVICE = torch.device("cuda")
#: The attention calls checked and timed: (kind, the kernels' switches set,
#: ``bench_io.KERNEL_SWITCHES``); those with switches time the alternatives to the defaults.
CALLS = (("clustered", ()), ("i-clustered", ()), ("clustered", ("split-key centroid values",)),
         ("clustered", ("hash inside K-means",)), ("clustered", ("varlen centroid values",)))


#: Untimed runs before a GPU timing (the kernels compile in the first).
WARMUPS = 2
#: The time this run has (``--budget-s``, ``$BENCH_DEADLINE``): past it, no new row is timed,
#: and the tables so far are written (they are after each table, also without a budget).
BUDGET = bench_io.Budget()


def spec_of(kind: str) -> str:
    """The attention spec of ``kind`` (clustered, i-clustered) with ``CLUSTERS`` clusters."""
    return f"{kind}-{CLUSTERS}"


def device_ms(fn, repeats: int) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` CUDA-event timings after two warm-ups
    (on the CPU, the plumbing run: wall-clock timings, no warm-ups)."""
    return timing.measure(fn, warmup=WARMUPS if DEVICE.type == "cuda" else 0, repeats=repeats,
                          device=DEVICE).median_ms


def batch_shape(n: int) -> tuple[int, torch.Tensor]:
    b = max(1, round(TOKENS / n))
    lengths = torch.full((b,), n, dtype=torch.int64)
    lengths[-1] = max(1, 3 * n // 4)
    return b, lengths.to(DEVICE)


def attention_inputs(n: int, requires_grad: bool = True):
    b, lengths = batch_shape(n)
    g = torch.Generator(device=DEVICE).manual_seed(n)
    make = lambda: torch.randn(b, HEADS, n, DIM, device=DEVICE, dtype=torch.bfloat16, generator=g)  # noqa: E731
    q, k, v = (make().requires_grad_(requires_grad) for _ in range(3))
    return q, k, v, lengths


def attention_call(attn, q, k, v, lengths):
    out = attn(q, k, v, lengths)
    out.backward(torch.ones_like(out))


def sync_check(lines: list[str], n: int) -> bool:
    lines += ["## No host synchronisation in forward + backward", "",
              "| attention | N × B | result |", "|---|---|---|"]
    ok = True
    for kind, switches in CALLS:
        spec = spec_of(kind)
        attn = build_attention(spec, seed=0).to(DEVICE)
        q, k, v, lengths = attention_inputs(n)
        with bench_io.switched_on(switches):
            try:
                attention_call(attn, q, k, v, lengths)  # warm-up: Triton compiles
                timing.synchronize(DEVICE)
                result = "ran (the CPU has no synchronisation check)"
                if DEVICE.type == "cuda":
                    torch.cuda.set_sync_debug_mode("error")
                    attention_call(attn, q, k, v, lengths)
                    result = "no synchronisation"
            except RuntimeError as exc:
                ok = False
                synchronises = DEVICE.type == "cuda" and torch.cuda.get_sync_debug_mode() != 0
                result = (f"**{'synchronises' if synchronises else 'fails'}**: "
                          f"{bench_io.failure(exc, 160)}")
            except Exception as exc:  # noqa: BLE001 - a kernel's first GPU run: say why, go on
                ok, result = False, f"**fails**: {bench_io.failure(exc, 160)}"
            finally:
                if DEVICE.type == "cuda":
                    torch.cuda.set_sync_debug_mode("default")
        label = bench_io.switched_label(spec, switches)
        lines.append(f"| {label} | {n} × {q.shape[0]} | {result} |")
        print(label, result, flush=True)
    return ok


def load_baseline(path: Path):
    spec = importlib.util.spec_from_file_location("baseline_kmeans", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.hamming_kmeans


def with_tile(block_n: int | None = None, warps: int | None = None, stages: int | None = None,
              registers: int | None = None, **kwargs):
    """K-means with another tile than the launcher's, in one-launch and split sweeps alike:
    ``BLOCK_N`` positions, ``warps`` warps, ``stages`` software-pipeline stages (from 2 Triton
    prefetches the next tile's codes with ``cp.async``), ``registers`` a thread at most (Triton's
    ``maxnreg``: ptxas spills what does not fit, and more CTAs share an SM); None keeps the
    launcher's. ``kwargs`` go to ``hamming_kmeans`` (``stored_signs=False``: the launcher's tiles,
    the codes unpacked in every sweep)."""
    launcher = triton_kmeans.lloyd_tile
    given = {key: value for key, value in (("BLOCK_N", block_n), ("num_warps", warps), ("num_stages", stages),
                                           ("maxnreg", registers)) if value is not None}

    def run(codes, lengths):
        tile = lambda *a: {**launcher(*a), **given}  # noqa: E731
        with mock.patch.object(triton_kmeans, "lloyd_tile", tile):
            return triton_kmeans.hamming_kmeans(codes, lengths, CLUSTERS, ITERATIONS, **kwargs)
    return run


#: The K-means table's implementations timed again on clustered codes.
CLUSTERED_CODES_COLUMNS = ("auto", "auto, unpacked signs", "one launch", "split")


def split_kmeans(codes, lengths):
    """K-means split over spans however many sequences there are: the launcher's split
    (``triton_kmeans.spans_per_sequence`` as below ``ONE_LAUNCH_FROM`` sequences), at least 2
    spans a sequence, for the one launch's threshold."""
    B, H, N = codes.shape
    with mock.patch.object(triton_kmeans, "ONE_LAUNCH_FROM", float("inf")):
        spans = max(2, triton_kmeans.spans_per_sequence(B * H, N))
    return triton_kmeans.hamming_kmeans(codes, lengths, CLUSTERS, ITERATIONS, spans=spans)


def clustered_codes(b: int, n: int, g: torch.Generator) -> torch.Tensor:
    """``(b, HEADS, n)`` codes near 30 random centres a sequence, each of 62 bits flipped with
    probability 0.2: Lloyd's centroids stop moving after 5 to 8 of 10 iterations (the
    reference on the CPU), as on a trained model's queries (3 to 7, most 4 to 6, on the Mini
    LibriSpeech model), where random codes mostly take all 10: the one-launch K-means stops
    at that fixed point."""
    base = torch.randint(0, 2**62, (b, HEADS, 30), device=DEVICE, generator=g)
    near = base.gather(2, torch.randint(0, 30, (b, HEADS, n), device=DEVICE, generator=g))
    flips = torch.rand(b, HEADS, n, 62, device=DEVICE, generator=g) < 0.2
    return near ^ (flips.long() << torch.arange(62, device=DEVICE)).sum(-1)


def kmeans_table(lines: list[str], ns: list[int], repeats: int, baseline: Path | None,
                 tiles: list[str], stages: list[int] = ()) -> None:
    impls = {"auto": lambda c, n: triton_kmeans.hamming_kmeans(c, n, CLUSTERS, ITERATIONS),
             "auto, unpacked signs": with_tile(stored_signs=False),  # the launcher's tiles
             "one launch": lambda c, n: triton_kmeans.hamming_kmeans(c, n, CLUSTERS, ITERATIONS, spans=1),
             "split": split_kmeans}
    for tile in tiles:  # BLOCK_N:WARPS or BLOCK_N:WARPS:REGISTERS
        block_n, warps, *registers = map(int, tile.split(":"))
        capped = f", {registers[0]} registers" if registers else ""
        impls[f"auto, tile {block_n} × {warps} warps{capped}"] = with_tile(block_n, warps, registers=(registers or [None])[0])
    for count in stages:
        impls[f"auto, {count} stages"] = with_tile(stages=count)
    if baseline is not None:
        base = load_baseline(baseline)
        impls[f"baseline ({baseline.name})"] = lambda c, n: base(c, n, CLUSTERS, ITERATIONS)
    lines += ["", f"## Hamming K-means, {TOKENS:,} tokens a call, {HEADS} heads, C = {CLUSTERS}, "
              f"{ITERATIONS} iterations (ms, median of {repeats}; the launcher's tiles: "
              + ", ".join(f"{name} {t['BLOCK_N']} positions × {t['num_warps']} warps" for name, t in
                          ((f"one launch, N < {triton_kmeans.WIDE_TILE_FROM}", triton_kmeans.lloyd_tile(CLUSTERS, True, 1)),
                           ("one launch, longer", triton_kmeans.lloyd_tile(CLUSTERS, True, triton_kmeans.WIDE_TILE_FROM)),
                           ("split", triton_kmeans.lloyd_tile(CLUSTERS, False, 1)))) + ")", "",
              "| N × B | spans (auto) | " + " | ".join(impls) + " | " + " | ".join(
                  f"{name}, clustered codes" for name in CLUSTERED_CODES_COLUMNS) + " |",
              "|---|---:|" + "---:|" * (len(impls) + len(CLUSTERED_CODES_COLUMNS))]
    for n in ns:
        if BUDGET.spent(lines, f"K-means at N = {n}"):
            return
        b, lengths = batch_shape(n)
        g = torch.Generator(device=DEVICE).manual_seed(n)
        codes = torch.randint(0, 2**63 - 1, (b, HEADS, n), device=DEVICE, generator=g)
        cells = []
        near = clustered_codes(b, n, g)
        wants = {id(c): reference.hamming_kmeans(c, lengths, CLUSTERS, ITERATIONS) for c in (codes, near)}
        for fn, c in [*((fn, codes) for fn in impls.values()),
                      *((impls[name], near) for name in CLUSTERED_CODES_COLUMNS)]:
            want = wants[id(c)]
            got = fn(c, lengths)
            if not (torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])):
                cells.append("**differs from the reference**")
                continue
            cells.append(f"{device_ms(lambda fn=fn, c=c, n=lengths: fn(c, n), repeats):.3f}")
        spans = triton_kmeans.spans_per_sequence(b * HEADS, n)
        lines.append(f"| {n} × {b} | {spans} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)


def graphed_call_ms(spec: str, q, k, v, lengths, repeats: int) -> str:
    """Milliseconds of one forward + backward of ``spec`` replayed as one CUDA graph: what the
    call costs the GPU once the host no longer issues it kernel by kernel. Hash planes from the
    global RNG (a seeded module re-seeds a private generator, which capture does not take).
    A call that cannot be captured reads as the error's first line."""
    if DEVICE.type != "cuda":
        return "CUDA only"
    attn = build_attention(spec, seed=None).to(DEVICE)
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # compile the kernels, settle the allocator
                attention_call(attn, q, k, v, lengths)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            attention_call(attn, q, k, v, lengths)
        return f"{device_ms(graph.replay, repeats):.2f}"
    except Exception as exc:  # noqa: BLE001 - the table says why capture failed
        torch.cuda.synchronize()
        return f"capture failed: {bench_io.failure(exc)}"


def broadcast_by_rows(x: torch.Tensor, assignments: torch.Tensor) -> torch.Tensor:
    """``reference.broadcast_clusters``' alternative, the same values: the per-cluster rows with a
    zero row a sequence flattened to ``(B·H·(C+1), D)`` and one ``index_select`` of whole rows
    (its backward one ``index_add``), instead of a gather by an index expanded over ``D`` (its
    backward a scatter-add)."""
    B, H, C, D = x.shape
    padded = torch.cat([x, x.new_zeros(B, H, 1, D)], dim=2).reshape(B * H * (C + 1), D)
    rows = torch.arange(B * H, device=x.device).view(B, H, 1) * (C + 1) + assignments.remainder(C + 1)
    return padded.index_select(0, rows.reshape(-1)).view(B, H, -1, D)


def with_rows_broadcast():
    """Clustered attention broadcasting its centroids' values by :func:`broadcast_by_rows`."""
    return mock.patch.object(reference, "broadcast_clusters", broadcast_by_rows)


def with_torch_block_table():
    """The cluster order's block table built by its PyTorch twin (about 20 torch kernels)
    instead of its one Triton launch: what the launch saves the host, in the same run."""
    from fastasr.kernels.clustering import cluster_order as co

    return mock.patch.object(co, "block_table", co.block_table_reference)


def switched_cell(attn, call, want, q, k, v, lengths, repeats: int, switches) -> str:
    """The call's milliseconds with ``switches`` on, its output's relative distance to
    ``want`` where it exceeds bf16's rounding, or why it failed (the kernels' first run on a
    GPU must not cost the rest of the tables)."""
    try:
        with torch.no_grad(), bench_io.switched_on(switches):
            got = attn(q, k, v, lengths).float()
        rel = float((got - want.float()).norm() / want.float().norm())
        with bench_io.switched_on(switches):
            return f"{device_ms(call, repeats):.2f}" + ("" if rel <= 1e-2 else f" (output {rel:.1e} apart)")
    except Exception as exc:  # noqa: BLE001 - the cell says why
        return f"failed: {bench_io.failure(exc)}"


def replaced_cell(attn, replacement, want, q, k, v, lengths, repeats: int) -> str:
    """The call's milliseconds with ``replacement()`` in force, after checking its output equal
    to ``want``, the call's without (a replacement changes how, not what)."""
    call = lambda: attention_call(attn, q, k, v, lengths)  # noqa: E731
    with torch.no_grad(), replacement():
        same = torch.equal(attn(q, k, v, lengths), want)
    with replacement():
        return f"{device_ms(call, repeats):.2f}" + ("" if same else " (output differs)")


def attention_table(lines: list[str], ns: list[int], repeats: int) -> None:
    """Both calls per N, clustered's again broadcasting by rows (:func:`with_rows_broadcast`)
    and i-clustered's with the torch block table (:func:`with_torch_block_table`), each checked
    equal to the default's output first, and
    with each of the kernels' switches (:data:`CALLS`), its output's relative distance to the
    default path's given when it exceeds bf16's rounding (1e-2)."""
    specs = (spec_of("clustered"), spec_of("i-clustered"))
    switched = [(spec_of(kind), switches) for kind, switches in CALLS if switches]
    lines += ["", f"## Attention call, forward + backward, bf16, {HEADS} × {DIM}, {TOKENS:,} tokens "
              f"(ms, median of {repeats})", "",
              "| N × B | " + " | ".join(specs) + f" | {specs[0]}, rows broadcast | {specs[1]}, torch block table |"
              + "".join(f" {bench_io.switched_label(spec, sw)} |" for spec, sw in switched),
              "|---|" + "---:|" * (len(specs) + 2 + len(switched))]
    for n in ns:
        if BUDGET.spent(lines, f"the attention calls at N = {n}"):
            return
        q, k, v, lengths = attention_inputs(n)
        cells = []
        runs = {}  # spec -> (module, call, default output)
        for spec in specs:
            attn = build_attention(spec, seed=0).to(DEVICE)
            call = lambda attn=attn, q=q, k=k, v=v, n=lengths: attention_call(attn, q, k, v, n)  # noqa: E731
            cells.append(f"{device_ms(call, repeats):.2f}")
            with torch.no_grad():
                runs[spec] = (attn, call, attn(q, k, v, lengths))
        clustered, _, want = runs[specs[0]]
        cells.append(replaced_cell(clustered, with_rows_broadcast, want, q, k, v, lengths, repeats))
        attn, _, want = runs[specs[1]]
        cells.append(replaced_cell(attn, with_torch_block_table, want, q, k, v, lengths, repeats))
        cells += [switched_cell(*runs[spec], q, k, v, lengths, repeats, sw) for spec, sw in switched]
        lines.append(f"| {n} × {q.shape[0]} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)


def graph_table(lines: list[str], ns: list[int], repeats: int) -> None:
    """The same calls replayed as one CUDA graph each (:func:`graphed_call_ms`). Run last: a
    capture that fails can leave the device unusable for what would follow it."""
    labels = [bench_io.switched_label(spec_of(kind), switches) for kind, switches in CALLS]
    lines += ["", f"## Attention call as one CUDA graph, forward + backward, bf16, {HEADS} × {DIM}, "
              f"{TOKENS:,} tokens (ms, median of {repeats}; the GPU's time for the call without "
              "the host issuing it kernel by kernel)", "", "| N × B | " + " | ".join(labels) + " |",
              "|---|" + "---:|" * len(CALLS)]
    for n in ns:
        if BUDGET.spent(lines, f"the CUDA graphs at N = {n}"):
            return
        q, k, v, lengths = attention_inputs(n)
        cells = []
        for kind, switches in CALLS:
            with bench_io.switched_on(switches):
                cells.append(graphed_call_ms(spec_of(kind), q, k, v, lengths, repeats))
        lines.append(f"| {n} × {q.shape[0]} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
        if any(c.startswith("capture failed") for c in cells):
            break


PARTS_TOPK = 32


def with_topk_tile(rows: int, warps: int):
    """The Triton top-k with another tile (``rows`` rows a program, ``warps`` warps) than the launcher's."""
    from fastasr.kernels.clustering import triton_topk

    def run(scores, k):
        with mock.patch.object(triton_topk, "topk_tile", lambda n, r: (rows, warps)):
            return triton_topk.topk_indices(scores, k)
    return run


@contextlib.contextmanager
def with_sparse_tile(rows: int, warps: int):
    """The fused sparse part with another tile (``rows`` query rows a block, ``warps`` warps)
    than the launcher's (``triton_clustered._sparse_blocks``, ``SPARSE_WARPS``), forward and
    backward: a block holds one cluster's rows, so small clusters leave most of a large block idle."""
    from fastasr.kernels.clustering import triton_clustered as tc

    launcher = tc._sparse_blocks
    with (mock.patch.object(tc, "_sparse_blocks", lambda *a, **k: (rows, *launcher(*a, **k)[1:])),
          mock.patch.object(tc, "SPARSE_WARPS", warps)):
        yield


#: The fused centroid attention's other span of keys a program, timed against ``SPLIT_KEYS``.
CENTROID_SPAN_ALTERNATIVE = 256


@contextlib.contextmanager
def with_centroid_bwd_tile(keys: int, warps: int):
    """The fused centroid attention's backward with another tile (``keys`` keys a block,
    ``warps`` warps) than the launcher's (``triton_centroid.centroid_tiles``); the forward as it is."""
    from fastasr.kernels.clustering import triton_centroid

    launcher = triton_centroid.centroid_tiles

    def tiles(C, E, EV, dot_dtype, backward, length=None):  # ``length``: the rows' keys
        tile = launcher(C, E, EV, dot_dtype, backward, length)
        return {**tile, "BLOCK_N": keys, "num_warps": warps} if backward else tile

    with mock.patch.object(triton_centroid, "centroid_tiles", tiles):
        yield


def centroid_cells(k, v, lengths, g: torch.Generator, repeats: int, bwd_tiles: list[str] = ()) -> list[str]:
    """The centroid attention alone (C = ``CLUSTERS``), forward + backward: i-clustered's (top
    ``PARTS_TOPK`` keys; its values and top weights) in torch (the reference's products and
    softmax, the Triton top-k: what the fused kernels replace), fused (``ops.centroid_attention``),
    and fused with ``CENTROID_SPAN_ALTERNATIVE`` keys a program instead of
    ``triton_centroid.SPLIT_KEYS``, and with each of ``bwd_tiles`` (``KEYS:WARPS``) the backward's
    tile; clustered's (values alone) by one SDPA call, by the split-key kernels
    (``ops.SPLIT_KEY_VALUES_FROM`` reached) and by the variable-length kernel
    (``ops.VARLEN_CENTROID_VALUES``); ms, or why a cell failed."""
    from fastasr.kernels.clustering import triton_centroid

    b = k.shape[0]
    centroids = torch.randn(b, HEADS, CLUSTERS, DIM, device=DEVICE, generator=g).requires_grad_()

    def torch_path(*args):
        return reference.centroid_attention(*args, select=ops.topk_indices)

    def call(topk, fn=ops.centroid_attention):
        values, top_w, _ = fn(centroids, k, v, lengths, DIM ** -0.5, topk)
        (values.float().sum() + top_w.sum()).backward()

    settings = ((PARTS_TOPK, torch_path, contextlib.nullcontext()),
                (PARTS_TOPK, ops.centroid_attention, contextlib.nullcontext()),
                (PARTS_TOPK, ops.centroid_attention,
                 mock.patch.object(triton_centroid, "SPLIT_KEYS", CENTROID_SPAN_ALTERNATIVE)),
                *((PARTS_TOPK, ops.centroid_attention, with_centroid_bwd_tile(*map(int, tile.split(":"))))
                  for tile in bwd_tiles),
                (0, ops.centroid_attention, contextlib.nullcontext()),
                (0, ops.centroid_attention, bench_io.switched_on(("split-key centroid values",))),
                (0, ops.centroid_attention, bench_io.switched_on(("varlen centroid values",))))
    cells = []
    for topk, fn, setting in settings:
        try:
            with setting:
                cells.append(f"{device_ms(lambda topk=topk, fn=fn: call(topk, fn), repeats):.3f}")
        except Exception as exc:  # noqa: BLE001 - the cell says why
            cells.append(f"failed: {bench_io.failure(exc)}")
    return cells


def parts_table(lines: list[str], ns: list[int], repeats: int, topk_tiles: list[str] = (),
                sparse_tiles: list[str] = (), centroid_bwd_tiles: list[str] = ()) -> None:
    """i-clustered's two Triton parts against what they replace, in one run: the per-query
    sparse part fused (``triton_clustered.improved_sparse``) against the reference composed
    of the Triton products (``clustered_dot``/``clustered_weighted_sum`` and torch around
    them), forward + backward, bf16; the top-k of the ``(B, H, C, N)`` centroid logits,
    ``triton_topk`` against ``torch.topk``, each checked against the other first; and the
    centroid attention, i-clustered's in torch and fused and clustered's by SDPA and split-key
    (:func:`centroid_cells`)."""
    lines += ["", f"## i-clustered's parts and clustered's centroid values, each against what it replaces "
              f"({HEADS} × {DIM}, C = {CLUSTERS}, K = {PARTS_TOPK}, {TOKENS:,} tokens; ms, median of {repeats})", "",
              "| N × B | sparse part: products + torch | sparse part: fused |"
              + "".join(f" sparse part: fused, {t.replace(':', ' rows × ')} warps |" for t in sparse_tiles)
              + " top-k: torch.topk | top-k: Triton | top-k: Triton, whole-row stores | top-k: Triton, whole int32 range |"
              + "".join(f" top-k: Triton, {t.replace(':', ' rows × ')} warps |" for t in topk_tiles)
              + " centroid attention: torch | centroid attention: fused | centroid attention: fused, "
              f"{CENTROID_SPAN_ALTERNATIVE}-key spans |"
              + "".join(f" centroid attention: fused, backward {t.replace(':', ' keys × ')} warps |"
                        for t in centroid_bwd_tiles)
              + " clustered's centroid values: SDPA "
              "| clustered's centroid values: split-key | clustered's centroid values: varlen |",
              "|---|---:|---:|" + "---:|" * (len(sparse_tiles) + len(topk_tiles) + len(centroid_bwd_tiles) + 10)]
    for n in ns:
        if BUDGET.spent(lines, f"the parts at N = {n}"):
            return
        lines.append(parts_row(n, repeats, topk_tiles, sparse_tiles, centroid_bwd_tiles))
        print(lines[-1], flush=True)


def parts_row(n: int, repeats: int, topk_tiles: list[str] = (), sparse_tiles: list[str] = (),
              centroid_bwd_tiles: list[str] = ()) -> str:
    """One row of :func:`parts_table`."""
    import functools

    from fastasr.kernels.clustering import triton_clustered as tc
    from fastasr.kernels.clustering import triton_topk

    K = PARTS_TOPK
    q, k, v, lengths = attention_inputs(n)
    b = q.shape[0]
    g = torch.Generator(device=DEVICE).manual_seed(n + 1)
    valid = torch.arange(n, device=DEVICE)[None, :] < lengths[:, None]
    logits = torch.randn(b, HEADS, CLUSTERS, n, device=DEVICE, generator=g)
    logits = logits.masked_fill(~valid[:, None, None, :], float("-inf"))
    top_idx = logits.topk(K, -1).indices
    top_w = torch.softmax(logits, -1).gather(-1, top_idx).requires_grad_()
    values = torch.randn(b, HEADS, CLUSTERS, DIM, device=DEVICE, dtype=torch.bfloat16, generator=g)
    values.requires_grad_()
    assign = torch.randint(0, CLUSTERS, (b, HEADS, n), device=DEVICE, generator=g)
    assign = assign.masked_fill(~valid[:, None, :], -1)
    args = (q, k, v, values, top_w, top_idx, assign, lengths, DIM ** -0.5)

    def products(*a):
        order = tc.cluster_order(assign, CLUSTERS)
        return reference.improved_sparse(*a, dot=functools.partial(tc.clustered_dot, order=order),
                                         wsum=functools.partial(tc.clustered_weighted_sum, order=order))

    def forward_backward(fn):
        out = fn(*args)
        out.backward(torch.ones_like(out))
        return out.detach().float()

    def fused_cell(setting, result, default: torch.Tensor, note: str) -> str:
        """The fused part's ms within the context ``setting``, and ``note`` (formatted with the
        relative distance) where ``result()`` is further from ``default``, the default's, than
        rounding; or why it failed."""
        try:
            with setting:
                rel = float((result() - default).norm() / default.norm())
                ms = device_ms(lambda: forward_backward(tc.improved_sparse), repeats)
            return f"{ms:.3f}" + ("" if rel < 1e-2 else f" ({note.format(rel)})")
        except Exception as exc:  # noqa: BLE001 - the cell says why
            return f"failed: {bench_io.failure(exc)}"

    want, got = forward_backward(products), forward_backward(tc.improved_sparse)
    err = float((got - want).norm() / want.norm())
    cells = [f"{device_ms(lambda: forward_backward(products), repeats):.3f}",
             f"{device_ms(lambda: forward_backward(tc.improved_sparse), repeats):.3f}"]
    cells += [fused_cell(with_sparse_tile(*map(int, tile.split(":"))), lambda: forward_backward(tc.improved_sparse),
                         got, "output differs by {:.1e}") for tile in sparse_tiles]
    want_top = torch.topk(logits, K, -1).indices.sort(-1).values
    same = torch.equal(triton_topk.topk_indices(logits, K).sort(-1).values, want_top)
    cells += [f"{device_ms(lambda: reference.topk_indices(logits, K), repeats):.3f}",
              f"{device_ms(lambda: triton_topk.topk_indices(logits, K), repeats):.3f}"]
    # a row's entries taken all at once; the bisection over the whole int32 range
    for setting in (mock.patch.object(triton_topk, "STORE_ELEMENTS", None),
                    mock.patch.object(triton_topk, "BRACKET", False)):
        with setting:
            same = same and torch.equal(triton_topk.topk_indices(logits, K).sort(-1).values, want_top)
            cells.append(f"{device_ms(lambda: triton_topk.topk_indices(logits, K), repeats):.3f}")
    for tile in topk_tiles:
        run = with_topk_tile(*map(int, tile.split(":")))
        same = same and torch.equal(run(logits, K).sort(-1).values, want_top)
        cells.append(f"{device_ms(lambda run=run: run(logits, K), repeats):.3f}")
    cells += centroid_cells(k, v, lengths, g, repeats, centroid_bwd_tiles)
    note = ("" if err < 2e-2 else f" fused differs: {err:.1e}") + ("" if same else " top-k sets differ")
    return f"| {n} × {b} | " + " | ".join(cells) + f" |{note}"


def profile(lines: list[str], spec: str, n: int, switches=()) -> None:
    label = bench_io.switched_label(spec, switches)
    if BUDGET.spent(lines, f"the profile of {label}"):
        return
    attn = build_attention(spec, seed=0).to(DEVICE)
    q, k, v, lengths = attention_inputs(n)
    try:
        with bench_io.switched_on(switches):
            for _ in range(WARMUPS if DEVICE.type == "cuda" else 0):
                attention_call(attn, q, k, v, lengths)
            timing.synchronize(DEVICE)
            cuda = DEVICE.type == "cuda"
            activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
            with torch.profiler.profile(activities=[activity]) as prof:
                attention_call(attn, q, k, v, lengths)
                timing.synchronize(DEVICE)
    except Exception as exc:  # noqa: BLE001 - the section says why
        lines += ["", f"## {label}: profile failed: {bench_io.failure(exc, 160)}"]
        return
    table = prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                                      row_limit=18, max_name_column_width=60)
    lines += ["", f"## Largest {'CUDA kernels' if cuda else 'CPU ops'} of one {label} call (forward + backward), "
              f"N = {n}", "", "```", table, "```"]


def main(argv=None) -> int:
    global DEVICE, TOKENS, CLUSTERS, HEADS, BUDGET
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ns", type=int, nargs="+", default=[800, 1024, 3200, 4096, 16384, 65536])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--baseline", type=Path, default=None, help="a file defining hamming_kmeans, timed beside")
    p.add_argument("--tiles", nargs="*", default=[],
                   help="other K-means tiles to time, BLOCK_N:WARPS[:REGISTERS] (e.g. 64:8; 32:4:128, "
                        "at most 128 registers a thread: 4 CTAs an SM)")
    p.add_argument("--kmeans-stages", type=int, nargs="*", default=[],
                   help="K-means with the launcher's tiles and this many pipeline stages (e.g. 2), timed beside")
    p.add_argument("--sparse-tiles", nargs="*", default=[],
                   help="other tiles of i-clustered's fused sparse part to time, ROWS:WARPS (e.g. 16:4)")
    p.add_argument("--centroid-bwd-tiles", nargs="*", default=[],
                   help="other tiles of the fused centroid attention's backward to time, KEYS:WARPS (e.g. 64:8)")
    p.add_argument("--topk-tiles", nargs="*", default=[],
                   help="other Triton top-k tiles to time, ROWS:WARPS (e.g. 1:1, one warp a row)")
    p.add_argument("--skip-attention", action="store_true", help="K-means only")
    p.add_argument("--tokens", type=int, default=TOKENS, help="tokens a call (B = tokens // N)")
    p.add_argument("--clusters", type=int, default=CLUSTERS, help="C of K-means and both attentions")
    p.add_argument("--heads", type=int, default=HEADS,
                   help="heads of every call (the CPU plumbing: 1, a sixth of the interpreted programs)")
    p.add_argument("--check-n", type=int, default=4096, help="N of the synchronisation check and the profiles")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: this script's plumbing under TRITON_INTERPRET=1 (tiny --ns and --tokens)")
    p.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--budget-s", type=float, default=None,
                   help=f"start no new row after this many seconds (also ${bench_io.DEADLINE_ENV}, a Unix time)")
    args = p.parse_args(argv)
    DEVICE, TOKENS, CLUSTERS, HEADS = torch.device(args.device), args.tokens, args.clusters, args.heads
    BUDGET = bench_io.Budget(args.budget_s)
    import triton

    if args.device == "cpu":
        if not bench_io.use_interpreted_kernels("attention/clustering_gpu.py"):
            return 2
        gpu, machine = "cpu-interpreter", "the CPU, Triton interpreted (plumbing only: times mean nothing)"
    elif not torch.cuda.is_available():
        print("attention/clustering_gpu.py: no CUDA GPU", file=sys.stderr)
        return 2
    else:
        gpu = torch.cuda.get_device_name(0)
        machine = f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs"
    lines = [f"# The clustering step on {gpu}", "",
             f"`python -m benchmarks.attention.clustering_gpu`: {datetime.date.today()}, commit "
             f"{bench_io.git_commit(ROOT)}, torch {torch.__version__}, "
             f"triton {triton.__version__}, {machine}.", ""]
    call_repeats = max(5, args.repeats // 2) if args.device == "cuda" else args.repeats
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"clustering_{bench_io.machine_slug(gpu)}.md"
    ok = sync_check(lines, args.check_n)
    out.write_text("\n".join(lines) + "\n")
    sections = [lambda: kmeans_table(lines, args.ns, args.repeats, args.baseline, args.tiles, args.kmeans_stages)]
    if not args.skip_attention:
        calls_ns = [n for n in args.ns if n != 800]
        sections += [lambda: attention_table(lines, calls_ns, call_repeats),
                     lambda: parts_table(lines, [n for n in args.ns if n <= 16384], call_repeats,
                                         args.topk_tiles, args.sparse_tiles, args.centroid_bwd_tiles),
                     lambda: profile(lines, spec_of("clustered"), args.check_n),
                     lambda: profile(lines, spec_of("i-clustered"), args.check_n),
                     lambda: graph_table(lines, calls_ns, call_repeats)]  # last: see graph_table
    for section in sections:  # the file after each: a run cut short keeps what it timed
        section()
        out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
