"""The study as Markdown (``budget.md``) and two figures: dev error against training time
(``budget_time.png``, one line per member) and best dev error against forward time per epoch
(``budget_forward.png``, the paper's Figure 1 axes, Pareto front marked)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from fastasr.studies.budget.curves import CurvePoint
from fastasr.studies.budget.table import FORWARD_PNG, OK, TIME_PNG, BudgetRow

_MARKERS = "os^Dv<>ph*"
_LINES = ("-", "--", "-.", ":")  # line style by depth (shallowest first), colour by attention


def _num(value: float | int | None, fmt: str = "{:.2f}") -> str:
    return "—" if value is None else fmt.format(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    minutes, s = divmod(int(round(seconds)), 60)
    return f"{minutes} min {s:02d} s" if minutes else f"{seconds:.1f} s"


def _family_styles(rows: Sequence[BudgetRow]) -> tuple[dict[str, str], dict[int, str]]:
    """A colour per attention spec and a marker per depth, in the order the rows list them."""
    from matplotlib import colormaps

    attentions = list(dict.fromkeys(r.attention for r in rows))
    depths = sorted({r.layers for r in rows})
    palette = colormaps["tab10"]
    colours = {a: palette(i % 10) for i, a in enumerate(attentions)}
    markers = {d: _MARKERS[i % len(_MARKERS)] for i, d in enumerate(depths)}
    return colours, markers


def _save(fig, ax, title: str, path: str | Path, dpi: int) -> Path:
    """Title ``ax`` (when ``title``), lay ``fig`` out and write it to ``path`` as PNG."""
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=dpi)
    return path


def plot_time(path: str | Path, rows: Sequence[BudgetRow], curves: Mapping[str, Sequence[CurvePoint]],
              budget_s: float, title: str = "", dpi: int = 120) -> Path:
    """budget_time.png: dev error (%) against training time (min), one line per member; the
    budget as a dashed vertical line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metric = (rows[0].metric if rows else "per").upper()
    colours, markers = _family_styles(rows)
    fig = Figure(figsize=(7.5, 4.8), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for row in rows:
        points = curves.get(row.member) or []
        if not points:
            continue
        depth_rank = sorted({r.layers for r in rows}).index(row.layers)
        ax.plot([p.train_seconds / 60 for p in points], [p.dev for p in points], marker=markers[row.layers],
                markersize=4, color=colours[row.attention], linestyle=_LINES[depth_rank % len(_LINES)],
                label=f"{row.member} ({_num(row.best_dev)})")
    ax.axvline(budget_s / 60, color="#888888", linestyle=":", linewidth=1)
    ax.set_xlabel("training time (min, validation included)")
    ax.set_ylabel(f"dev {metric} (%)")
    ax.grid(True, alpha=0.3)
    if any(curves.get(r.member) for r in rows):
        ax.legend(fontsize=7, title=f"member (best dev {metric})", title_fontsize=7)
    return _save(fig, ax, title, path, dpi)


def plot_forward(path: str | Path, rows: Sequence[BudgetRow], front: Sequence[BudgetRow], title: str = "",
                 dpi: int = 120) -> Path:
    """budget_forward.png: best dev error (%) against forward seconds per epoch, one point per
    member (colour: attention, marker: depth); the Pareto front joined by a step line and ringed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metric = (rows[0].metric if rows else "per").upper()
    colours, markers = _family_styles(rows)
    fig = Figure(figsize=(7.5, 4.8), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    shown = [r for r in rows if r.status == OK and r.forward_seconds_epoch is not None and r.best_dev is not None]
    for row in shown:
        ax.scatter([row.forward_seconds_epoch], [row.best_dev], color=colours[row.attention],
                   marker=markers[row.layers], s=40, zorder=3, label=row.member)
        ax.annotate(row.member, (row.forward_seconds_epoch, row.best_dev), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    if front:
        xs = [r.forward_seconds_epoch for r in front]
        ys = [r.best_dev for r in front]
        ax.step(xs, ys, where="post", color="#444444", linewidth=1, linestyle="--", zorder=2, label="Pareto front")
        ax.scatter(xs, ys, s=160, facecolors="none", edgecolors="#444444", linewidths=1.2, zorder=4)
    ax.set_xlabel("forward time per epoch (s)")
    ax.set_ylabel(f"best dev {metric} (%)")
    ax.grid(True, alpha=0.3)
    if shown:
        ax.legend(fontsize=7)
    return _save(fig, ax, title, path, dpi)


def _per_epoch(row: BudgetRow, rows: Sequence[BudgetRow], field: str = "seconds_per_epoch") -> str:
    """``row``'s s / epoch (``field``: or after the first epoch), and its ratio to the finished
    ``full`` member of the same depth (the paper's Table 2 reads so) where there is one and
    ``row`` is another."""
    value = getattr(row, field)
    text = _num(value, "{:.1f}")
    full = next((r for r in rows if r.attention == "full" and r.layers == row.layers and r.status == OK
                 and getattr(r, field)), None)
    if full is None or full is row or value is None:
        return text
    return f"{text} ({value / getattr(full, field):.2f}× full)"


def markdown(rows: Sequence[BudgetRow], front: Sequence[BudgetRow], title: str, description: str,
             notes: Sequence[str], commands: Sequence[str]) -> str:
    """budget.md: the table (one row per member), the Pareto front, the figures, notes on
    how each number was measured, the commands."""
    metric = (rows[0].metric if rows else "per").upper()
    head = ["member", "attention", "layers", "parameters", "updates", "epochs", "train time", "s / epoch",
            "s / epoch after the first", "forward s / epoch", "peak memory (MB)", f"best dev {metric}",
            f"final dev {metric}", "time to target", f"test {metric}", "Pareto"]
    lines = [f"# {title}", "", description, "",
             "| " + " | ".join(head) + " |", "|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|"]
    for r in rows:
        if r.status != OK:
            cells = [r.member, r.attention, str(r.layers)] + ["—"] * 8 + [r.status, "—", "—", "—", ""]
        else:
            cells = [r.member, r.attention, str(r.layers), _num(r.parameters, "{:,}"), _num(r.updates, "{:d}"),
                     _num(r.epochs), _duration(r.train_seconds), _per_epoch(r, rows),
                     _per_epoch(r, rows, "seconds_per_later_epoch"), _num(r.forward_seconds_epoch, "{:.1f}"),
                     _num(r.peak_memory_mb, "{:,.0f}"),
                     f"**{_num(r.best_dev)}**" if r.pareto else _num(r.best_dev), _num(r.final_dev),
                     _duration(r.to_target_seconds), _num(r.test), "yes" if r.pareto else ""]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if front:
        lines.append("Pareto front (no other member is both faster per epoch forward and at least as "
                     "accurate), fastest first: " + ", ".join(f"`{r.member}`" for r in front) + ".")
    else:
        lines.append("No Pareto front yet: no member has both a best dev error and a forward time.")
    problems = [r for r in rows if r.status != OK]
    if problems:
        lines += ["", "Not in the figures:", ""]
        lines += [f"* `{r.member}`: {r.status}: {r.reason}" for r in problems]
    lines += ["", f"![dev {metric} against training time]({TIME_PNG})", "",
              f"![best dev {metric} against forward time per epoch]({FORWARD_PNG})", "", "## How each number is measured", ""]
    lines += [f"* {n}" for n in notes]
    lines += ["", "## Commands", "", "```", *commands, "```", ""]
    return "\n".join(lines)
