"""The kernel settings a GPU's tables decide, read off them by their rules.

    python -m benchmarks.gpu.decisions --gpu nvidia-h200                  # this run's candidates
    python -m benchmarks.gpu.decisions --gpu nvidia-h200 --baseline HEAD \\
        --same "auto=auto, stored signs"      # + each table against the one committed (before committing this run's)

``make gpu-check`` times each candidate beside the default it would replace, in one run:
``attention/clustering_gpu.py``'s K-means, parts and call tables and ``step/gpu.py``'s step. This script
reads those tables (``benchmarks/results/<stem>_<gpu>.md``) and applies each candidate's rule
(:data:`FAMILIES`, :data:`SWITCH_RULES`, :data:`STEP_FORMS`), in the rows whose kernels the
setting changes (``Family.where``: the Triton top-k's settings up to :data:`TOPK_MAX_N` keys,
K-means' one launch and split sweeps apart), on the table's margin: :data:`MARGIN` (the step's kernel
sums: :data:`TABLE_MARGINS`), or the table's noise where two timings of the same kernels in it
(:data:`SAME_KERNELS`) differ by more. A
candidate is faster at an N where its time is under ``1 - margin`` times the default's, slower
over ``1 + margin`` times. The rules:

* ``at 800``: faster at N = 800 (the paper's training length) and slower at no N;
* ``every N``: faster at every N timed;
* ``no loss``: slower at no N (a condition beside another table's rule);
* ``from N``: faster at some N and at every longer one timed: a length threshold moves there;
* ``up to N``: faster at the shortest N timed and every one up to some N: a setting for shorter
  rows, up to there.

A setting changes where every row that names it passes (a switch's rows in several tables; each
tile a setting of its own). The script says which; a person applies it in the code the setting
names and commits the tables with it. ``--baseline REV`` also sets each table beside the same
file at commit ``REV`` (``git show``; ``HEAD`` before a run's tables are committed): every
column both name (``--same NOW=THEN``: a column renamed since), today's time over then at each
N. Writes ``benchmarks/results/gpu_decisions_<gpu>.md``; ``make gpu-check`` runs it last.
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import bench_io

ROOT = Path(__file__).resolve().parents[2]

#: The least share of the default's time a candidate must win by (two timings of one call as a
#: CUDA graph differ by up to 2 %: benchmarks/gpu/notes.md "Decisions").
MARGIN = 0.05
#: step/gpu.py's second table: each step's GPU kernels alone, torch.profiler's sum of their times
#: (no host gaps, no launches), the table the model's own kernel switches are decided on.
STEP_KERNELS = "The same steps' GPU kernels alone"
#: Tables whose least margin is not :data:`MARGIN`, by ``(stem, short title)``: the step's kernel
#: sums, where a switch of the model's own layers saves 2-5 % of a step's kernels (one pass less of
#: a layer's activations) and two sums of the same kernels differ by their own noise (which, where
#: larger, is the margin).
TABLE_MARGINS = {("gpu_step", STEP_KERNELS): 0.02}
AT_800, EVERY_N, NO_LOSS, FROM_N, UP_TO_N = "at 800", "every N", "no loss", "from N", "up to N"
PAPER_N = 800  # the paper's WSJ utterances: ~780 frames
STEMS = ("clustering", "gpu_step")  # the results files read: attention/clustering_gpu.py's and step/gpu.py's


@dataclass
class Table:
    """One Markdown table of a results file: ``title`` is the text line before it (a heading's
    without its ``#``), ``cells`` each row's cells by column, keyed by the row's N."""

    title: str
    columns: list[str]
    cells: dict[int, dict[str, str]] = field(default_factory=dict)


def read_tables(text: str) -> list[Table]:
    """The tables of a Markdown file; rows that start with an N (``800 × 82``, ``800 (80)``)."""
    tables: list[Table] = []
    title, current = "", None
    for line in text.splitlines():
        if not line.startswith("|"):
            current = None
            if line.strip():
                title = line.lstrip("#").strip()
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if current is None:
            current = Table(title, cells[1:])
            tables.append(current)
        elif n := re.match(r"\d[\d,]*", cells[0]):
            current.cells[int(n.group(0).replace(",", ""))] = dict(zip(current.columns, cells[1:]))
    return tables


def short_title(title: str) -> str:
    """What names a table from run to run: its title up to the first comma or bracket
    (``Hamming K-means``, ``Attention call as one CUDA graph``); "" for a table under a dated
    line (``step/gpu.py``'s step, its file's first table)."""
    return "" if re.match(r"\d{4}-\d\d-\d\d", title) else re.split(r"[,(]", title)[0].strip()


def find_table(tables: list[Table], title: str) -> Table | None:
    """The first table of rows by N whose title starts with ``title`` ("": the first)."""
    return next((t for t in tables if t.cells and t.title.startswith(title)), None)


def milliseconds(cell: str | None) -> float | None:
    """A cell's time (``0.765``, ``51.4 (1.62× floor)``: the tables write times with decimals);
    None for a failed or missing cell, or a count (``spans (auto)``)."""
    match = re.match(r"(\d+\.\d+)(?:\s|$|\()", cell or "")
    return float(match.group(1)) if match else None


def ratios(table: Table, candidate: str, default: str,
           where: Callable[[int, dict[str, str]], bool] | None = None) -> dict[int, float | None]:
    """``candidate``'s time over ``default``'s at each N (None where either has none), in the rows
    where ``where(n, row)`` holds (every row without it)."""
    out = {}
    for n, row in sorted(table.cells.items()):
        if where is not None and not where(n, row):
            continue
        a, b = milliseconds(row.get(candidate)), milliseconds(row.get(default))
        out[n] = a / b if a is not None and b else None
    return out


def verdict(rule: str, by_n: dict[int, float | None], margin: float = MARGIN) -> tuple[bool, str, int | None]:
    """Whether ``by_n`` (candidate over default at each N) passes ``rule`` on ``margin``, why in
    words, and for ``from N`` the N it passes from (``up to N``: up to)."""
    if rule not in (AT_800, EVERY_N, NO_LOSS, FROM_N, UP_TO_N):
        raise ValueError(f"unknown rule {rule!r}; expected {AT_800!r}, {EVERY_N!r}, {NO_LOSS!r}, {FROM_N!r} "
                         f"or {UP_TO_N!r}")
    timed = {n: r for n, r in by_n.items() if r is not None}
    if not timed:
        return False, "not timed", None
    faster = [n for n, r in timed.items() if r < 1 - margin]
    slower = [n for n, r in timed.items() if r > 1 + margin]
    untimed = [n for n in by_n if n not in timed]
    said = "; ".join([*([f"faster at {_ns(faster)}"] if faster else []), *([f"slower at {_ns(slower)}"] if slower else []),
                      *([] if faster or slower else ["within the margin at every N timed"]),
                      *([f"no time at {_ns(untimed)}"] if untimed else [])])
    if rule == AT_800:
        return PAPER_N in faster and not slower, said, None
    if rule == EVERY_N:
        return len(faster) == len(by_n), said, None
    if rule == NO_LOSS:
        return not slower and not untimed, said, None
    ns = sorted(by_n)
    if rule == UP_TO_N:
        end = next((n for i, n in reversed(list(enumerate(ns))) if set(ns[:i + 1]) <= set(faster)), None)
        return end is not None, said, end
    start = next((n for i, n in enumerate(ns) if set(ns[i:]) <= set(faster)), None)  # FROM_N
    return start is not None, said, start


def _ns(ns: list[int]) -> str:
    return "N = " + ", ".join(f"{n:,}" for n in ns)


@dataclass(frozen=True)
class SameKernels:
    """Two columns of one table that run the same kernels in the rows where ``where(n, row)``
    holds: the ratio of their times there is that table's noise. ``other`` may name the second
    column from the row (full attention's step and the path it took)."""

    stem: str
    title: str
    column: str
    other: str | Callable[[dict[str, str]], str]
    where: Callable[[int, dict[str, str]], bool]


#: Where ``make gpu-check``'s tables time one thing twice.
SAME_KERNELS = (
    # K-means in one launch wherever "auto" takes it (spans 1)
    SameKernels("clustering", "Hamming K-means", "one launch", "auto", lambda n, row: row.get("spans (auto)") == "1"),
    # triton_topk.topk_tile's own tile for rows of up to 1,024 keys
    SameKernels("clustering", "i-clustered's parts", "top-k: Triton, 1 rows × 1 warps", "top-k: Triton",
                lambda n, row: n <= 1024),
    # full attention's step and that step with the path it took forced, and their kernels
    *(SameKernels("gpu_step", title, "full", lambda row: "full, " + row.get("full's path", ""), lambda n, row: True)
      for title in ("", STEP_KERNELS)),
)


def noise(tables: dict[str, list[Table]], stem: str, title: str) -> tuple[float, str]:
    """The largest difference between two timings of the same kernels in a table (a share, from
    :data:`SAME_KERNELS`) and where it was; ``(0.0, "")`` where the table times nothing twice."""
    worst, where = 0.0, ""
    table = find_table(tables.get(stem, []), title)
    for pair in SAME_KERNELS:
        if (pair.stem, pair.title) != (stem, title) or table is None:
            continue
        for n, row in sorted(table.cells.items()):
            other = pair.other(row) if callable(pair.other) else pair.other
            a, b = milliseconds(row.get(pair.column)), milliseconds(row.get(other))
            if pair.where(n, row) and a is not None and b and abs(a / b - 1) > worst:
                worst, where = abs(a / b - 1), f"{pair.column} against {other} at N = {n:,}"
    return worst, where


@dataclass(frozen=True)
class Family:
    """Candidates of one kind: the columns of table ``title`` of results file ``stem`` that match
    ``pattern``, each against ``default`` by ``rule``; ``code`` is what a passing one changes.
    ``where(n, row)``, where given, holds in the rows whose kernels the setting changes: elsewhere
    the candidate and the default run the same kernels (the Triton top-k's settings on rows longer
    than it takes, which ``torch.topk`` selects), so those rows time nothing the rule could read."""

    stem: str
    title: str
    pattern: str
    default: str
    rule: str
    code: str
    where: Callable[[int, dict[str, str]], bool] | None = None


#: The longest rows the Triton top-k selects (``fastasr.kernels.clustering.triton_topk.MAX_N``; a test holds
#: the two equal): longer ones go to ``torch.topk``, whatever its settings.
TOPK_MAX_N = 8192


def _topk_rows(n: int, row: dict[str, str]) -> bool:
    return n <= TOPK_MAX_N


def _one_launch(n: int, row: dict[str, str]) -> bool:
    return row.get("spans (auto)") == "1"


#: The tiles and settings ``make gpu-check`` times beside the defaults (``attention/clustering_gpu.py``'s
#: ``--tiles``, ``--kmeans-stages``, ``--sparse-tiles``, ``--topk-tiles``, ``--centroid-bwd-tiles``):
#: each candidate a setting of its own.
FAMILIES = (
    Family("clustering", "Hamming K-means", r"auto, tile .*, \d+ registers", "auto", AT_800,
           "triton_kmeans.ONE_LAUNCH_TILES' tile below WIDE_TILE_FROM (and compile_check allows its spill)"),
    Family("clustering", "Hamming K-means", r"auto, tile [^,]*", "auto", EVERY_N, "triton_kmeans.lloyd_tile"),
    Family("clustering", "Hamming K-means", r"auto, \d+ stages", "auto", EVERY_N,
           "num_stages of triton_kmeans.ONE_LAUNCH_TILES (one launch: spans 1)", _one_launch),
    Family("clustering", "Hamming K-means", r"auto, \d+ stages", "auto", EVERY_N,
           "num_stages of triton_kmeans.LLOYD_OPTIONS (split sweeps: spans over 1)",
           lambda n, row: not _one_launch(n, row)),
    Family("clustering", "i-clustered's parts", r"sparse part: fused, \d+ rows × \d+ warps", "sparse part: fused",
           EVERY_N, "triton_clustered._sparse_blocks and SPARSE_WARPS"),
    Family("clustering", "i-clustered's parts", r"top-k: Triton, \d+ rows × \d+ warps", "top-k: Triton", EVERY_N,
           "triton_topk.topk_tile", _topk_rows),
    Family("clustering", "i-clustered's parts", r"top-k: Triton, whole-row stores", "top-k: Triton", EVERY_N,
           "triton_topk.STORE_ELEMENTS = None", _topk_rows),
    Family("clustering", "i-clustered's parts", r"top-k: Triton, whole int32 range", "top-k: Triton", EVERY_N,
           "triton_topk.BRACKET = False", _topk_rows),
    Family("clustering", "i-clustered's parts", r"centroid attention: fused, backward .*", "centroid attention: fused",
           UP_TO_N, "triton_centroid.centroid_tiles' backward tile on short rows (SHORT_BACKWARD_BELOW)"),
    Family("clustering", "i-clustered's parts", r"centroid attention: fused, \d+-key spans", "centroid attention: fused",
           EVERY_N, "triton_centroid.SPLIT_KEYS"),
)

#: The suffix of the step's captured columns (``step/gpu.py``'s ``AS_GRAPHS``): training's step on a GPU.
CAPTURED = ", as CUDA graphs"

#: A switch of the model's own layers: fewer kernels' time at every N, and no slower step as
#: training runs it, eager or captured (``<spec>, <switch>, as CUDA graphs`` against
#: ``<spec>, as CUDA graphs``).
_MODEL_LAYERS = (("gpu_step", STEP_KERNELS, EVERY_N, None), ("gpu_step", "", NO_LOSS, None),
                 ("gpu_step", "", NO_LOSS, CAPTURED))

#: Each of ``bench_io.KERNEL_SWITCHES``: what it changes, and the rows it must pass, each
#: ``(results file, table title, rule, (candidate, default), a form or None)``; None: every column
#: ``<spec>, <switch>`` of the table against ``<spec>``; a form (a column suffix such as
#: :data:`CAPTURED`): every ``<spec>, <switch><form>`` against ``<spec><form>``.
SWITCH_RULES = {
    "hash inside K-means": ("triton_kmeans.HASH_IN_KMEANS = True", (
        ("gpu_step", "", AT_800, None),
        ("clustering", "Attention call as one CUDA graph", NO_LOSS, None))),
    "varlen centroid values": ("ops.VARLEN_CENTROID_VALUES = True", (
        ("gpu_step", "", AT_800, None),
        ("clustering", "Attention call as one CUDA graph", NO_LOSS, None),
        ("clustering", "i-clustered's parts", NO_LOSS,
         ("clustered's centroid values: varlen", "clustered's centroid values: SDPA")))),
    "torch layer norm": ("layer_norm.TRITON_LAYER_NORM = False", _MODEL_LAYERS),
    "Triton bias gradients": ("linear.TRITON_BIAS_GRADIENTS = True", _MODEL_LAYERS),
    "norms cast once": ("layer_norm.CAST_ONCE = True", _MODEL_LAYERS),
    "Triton GELU dropout": ("dropout.TRITON_GELU_DROPOUT = True", _MODEL_LAYERS),
    "split-key centroid values": ("ops.SPLIT_KEY_VALUES_FROM: the N the rows pass from", (
        ("clustering", "Attention call as one CUDA graph", FROM_N, None),
        ("clustering", "i-clustered's parts", FROM_N,
         ("clustered's centroid values: split-key", "clustered's centroid values: SDPA")))),
}

#: Ways of running the whole step that no kernel setting switches, each as :data:`SWITCH_RULES`
#: says a switch (every column ``<spec>, <form>`` against ``<spec>``): what a run that passes has
#: built next.
STEP_FORMS = {
    "as CUDA graphs": ("build: training's steps captured as CUDA graphs, a graph a batch shape (gpu/notes.md "
                       "'The step captured as CUDA graphs')", (("gpu_step", "", AT_800, None),)),
    "update as a CUDA graph": ("build: training's update (clipping, RAdam) replayed as a CUDA graph (gpu/notes.md "
                               "'The step captured as CUDA graphs')", (("gpu_step", "", AT_800, None),)),
}


@dataclass
class Row:
    """A candidate against its default (or a column against another run's) and its verdict."""

    setting: str
    candidate: str
    default: str
    table: str
    rule: str
    by_n: dict[int, float | None]
    passed: bool
    why: str
    start: int | None = None  # the N of a ``from N`` or ``up to N`` threshold


def judged(setting: str, candidate: str, default: str, table: str, rule: str, by_n: dict[int, float | None],
           margin: float) -> Row:
    return Row(setting, candidate, default, table, rule, by_n, *verdict(rule, by_n, margin))


def _where(stem: str, title: str) -> str:
    return f"{stem}: {short_title(title) if title else 'the step'}"


def decide(tables: dict[str, list[Table]]) -> tuple[list[Row], dict[str, str]]:
    """Every candidate of :data:`FAMILIES`, :data:`SWITCH_RULES` and :data:`STEP_FORMS` found in ``tables``
    (results file stem -> its tables) with its verdict on its table's margin (:data:`MARGIN`,
    or the table's :func:`noise` where larger), and each table's margin in words."""
    rows: list[Row] = []
    margins: dict[str, str] = {}

    def margin(stem: str, title: str) -> float:
        worst, where = noise(tables, stem, title)
        least = TABLE_MARGINS.get((stem, short_title(title)), MARGIN)
        margins[_where(stem, title)] = f"{max(least, worst):.0%}" + (
            f" (two timings of the same kernels {worst:.0%} apart: {where})" if where else "")
        return max(least, worst)

    for fam in FAMILIES:
        table = find_table(tables.get(fam.stem, []), fam.title)
        for column in table.columns if table else []:
            if re.fullmatch(fam.pattern, column):
                by_n = ratios(table, column, fam.default, fam.where)
                if not by_n:  # a family whose rows the table holds none of decides nothing
                    continue
                row = judged(f"{fam.code}: {column}", column, fam.default, _where(fam.stem, fam.title),
                             fam.rule, by_n, margin(fam.stem, fam.title))
                if left := [n for n in table.cells if n not in by_n]:
                    row.why += f"; {_ns(left)} left out (rows this setting does not run in)"
                rows.append(row)
    for switch, (code, checks) in {**SWITCH_RULES, **STEP_FORMS}.items():
        for stem, title, rule, pair in checks:
            table = find_table(tables.get(stem, []), title)
            if table is None:
                continue
            if isinstance(pair, tuple):
                pairs = [pair]
            else:  # every `<spec>, <switch><form>` against `<spec><form>`
                form = pair or ""
                suffix = f", {switch}{form}"
                pairs = [(c, c[: -len(suffix)] + form) for c in table.columns if c.endswith(suffix)]
            for candidate, default in pairs:
                rows.append(judged(code, candidate, default, _where(stem, title), rule,
                                   ratios(table, candidate, default), margin(stem, title)))
    return rows, margins


def changes(rows: list[Row]) -> dict[str, str]:
    """The settings every row of which passes, each with what to set (from which N for
    ``from N`` rows: the longest of their starts; up to which for ``up to N``: the shortest)."""
    out = {}
    for setting in dict.fromkeys(r.setting for r in rows):
        mine = [r for r in rows if r.setting == setting]
        if all(r.passed for r in mine):
            starts = [r.start for r in mine if r.start is not None and r.rule == FROM_N]
            ends = [r.start for r in mine if r.start is not None and r.rule == UP_TO_N]
            out[setting] = (f"from N = {max(starts):,}" if starts else f"up to N = {min(ends):,}" if ends
                            else "; ".join(f"{r.table}: {r.why}" for r in mine))
    return out


def against_baseline(now: dict[str, list[Table]], then: dict[str, list[Table]],
                     same: dict[str, str]) -> list[Row]:
    """Each table of ``now`` beside its namesake in ``then``: every column of times both hold
    (``same``: a column of ``now`` -> its name in ``then``), its time now over then at each N."""
    rows = []
    for stem, tables in now.items():
        for table in (t for t in tables if t.cells):
            old = find_table(then.get(stem, []), short_title(table.title))
            for column in table.columns if old else []:
                was = same.get(column, column)
                by_n = {}
                for n, row in sorted(table.cells.items()):
                    a, b = milliseconds(row.get(column)), milliseconds(old.cells.get(n, {}).get(was))
                    by_n[n] = a / b if a is not None and b else None
                if any(by_n.values()):  # not a count or a path's name, and timed then too
                    rows.append(judged("", column, was, _where(stem, table.title), NO_LOSS, by_n, MARGIN))
    return rows


def load(results: Path, gpu: str, rev: str | None = None) -> dict[str, list[Table]]:
    """The tables of each of :data:`STEMS`' ``<stem>_<gpu>.md`` under ``results`` (at commit
    ``rev`` by ``git show``), by stem; a file missing is left out."""
    out = {}
    for stem in STEMS:
        path = results / f"{stem}_{gpu}.md"
        if rev is None:
            text = path.read_text() if path.exists() else None
        else:
            proc = subprocess.run(["git", "show", f"{rev}:./{path.name}"], capture_output=True, text=True,
                                  cwd=results)
            text = proc.stdout if proc.returncode == 0 else None
        if text is not None:
            out[stem] = read_tables(text)
    return out


def _ratio_cells(by_n: dict[int, float | None]) -> str:
    return " · ".join(f"{n:,}: " + ("–" if r is None else f"{r:.2f}") for n, r in by_n.items())


def report(rows: list[Row], margins: dict[str, str], baseline_rows: list[Row], gpu: str, rev: str | None) -> str:
    """The verdicts as Markdown: what changes, every candidate, each table's margin, and with
    ``rev`` each column against that commit's."""
    changed = changes(rows)
    lines = [f"# What the kernel tables decide on {gpu}", "", bench_io.command_line("gpu/decisions.py"), "",
             f"{datetime.date.today()}, commit {bench_io.git_commit(ROOT)}, from `clustering_{gpu}.md` and "
             f"`gpu_step_{gpu}.md`. A candidate is faster at an N where its time is under 1 less its "
             f"table's margin times the default's, slower over 1 plus it; the margin is {MARGIN:.0%} "
             f"({', '.join(f'{t or stem}: {m:.0%}' for (stem, t), m in TABLE_MARGINS.items())}), or "
             "the table's noise where two timings of the same kernels in it differ by more. Rules: "
             f"'{AT_800}': faster at N = {PAPER_N}, slower at none; '{EVERY_N}': faster at each; "
             f"'{NO_LOSS}': slower at none; '{FROM_N}': faster from some N on; '{UP_TO_N}': faster from "
             "the shortest N up to some N. A setting changes where "
             "every row naming it passes; it is applied by hand where it says.", "",
             "## What changes", ""]
    lines += [f"- `{setting}`: {said}" for setting, said in changed.items()] or ["Nothing: no setting passes its rules."]
    lines += ["", "## Every candidate", "",
              "| setting | candidate | default | table | rule | ratio by N | verdict |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.setting} | {r.candidate} | {r.default} | {r.table} | {r.rule} | {_ratio_cells(r.by_n)} | "
              f"{'**passes**' if r.passed else 'fails'}: {r.why} |" for r in rows]
    lines += ["", "| table | margin |", "|---|---|", *(f"| {name} | {said} |" for name, said in margins.items())]
    if rev is not None:
        lines += ["", f"## Each column against commit {rev}'s", "",
                  f"Today's time over {rev}'s at each N; faster or slower past {MARGIN:.0%} (two runs: the GPU's "
                  "clocks and its neighbours may differ too).", "",
                  f"| column | at {rev} | table | ratio by N | |", "|---|---|---|---|---|"]
        lines += [f"| {r.candidate} | {r.default} | {r.table} | {_ratio_cells(r.by_n)} | {r.why} |"
                  for r in baseline_rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", required=True, help="the GPU's name in the results' file names, e.g. nvidia-h200")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--baseline", metavar="REV", help="also set each table beside the same file at this commit")
    p.add_argument("--same", nargs="*", default=[], metavar="NOW=THEN",
                   help="with --baseline: a column of today's tables and its name in the baseline's")
    args = p.parse_args(argv)
    if bad := [pair for pair in args.same if "=" not in pair]:
        p.error(f"--same takes NOW=THEN pairs; got {bad}")
    tables = load(args.results, args.gpu)
    if not tables:
        p.error(f"no {' or '.join(f'{s}_{args.gpu}.md' for s in STEMS)} under {args.results}")
    baseline_rows = []
    if args.baseline:
        then = load(args.results, args.gpu, args.baseline)
        if not then:
            p.error(f"commit {args.baseline!r} holds no {' or '.join(f'{s}_{args.gpu}.md' for s in STEMS)} (git show)")
        baseline_rows = against_baseline(tables, then, dict(pair.split("=", 1) for pair in args.same))
    out = args.results / f"gpu_decisions_{args.gpu}.md"
    out.write_text(report(*decide(tables), baseline_rows, args.gpu, args.baseline))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
