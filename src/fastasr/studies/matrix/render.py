"""The matrix as the paper's Table 1: Markdown (``matrix.md``), HTML (for
:mod:`fastasr.studies.report`) and a heatmap (``matrix.png``).

Layout everywhere: one column per train spec, one row per eval spec, the diagonal (each
model decoded as trained) marked; values are the unit error rate (PER, or CER for
character models) or the WER, in percent.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from pathlib import Path

from fastasr.studies.matrix.cells import FAILED, MISSING, NA, OK, Cell, Cells


def metric_name(cells: Iterable[Cell]) -> str:
    """``PER`` when any cell has a PER, else ``CER`` when any has a CER, else ``PER``."""
    cells = list(cells)
    if any(c.per is not None for c in cells):
        return "PER"
    if any(c.cer is not None for c in cells):
        return "CER"
    return "PER"


def cell_text(cell: Cell | None, value: str = "unit") -> str:
    """What a table shows for a cell: the number, ``n/a``, ``failed`` or ``—`` (not run yet)."""
    if cell is None or cell.status == MISSING:
        return "—"
    if cell.status == NA:
        return "n/a"
    if cell.status == FAILED:
        return "failed"
    number = cell.unit_error if value == "unit" else cell.wer
    return "—" if number is None else f"{number:.2f}"


def markdown_table(cells: Cells, train: Sequence[str], evals: Sequence[str], value: str = "unit") -> str:
    """Table 1 layout in Markdown: one column per train spec, one row per eval spec, diagonal bold."""
    lines = [
        "| eval ↓ / train → | " + " | ".join(train) + " |",
        "|---|" + "|".join("---:" for _ in train) + "|",
    ]
    for e in evals:
        row = []
        for t in train:
            text = cell_text(cells.get((t, e)), value)
            row.append(f"**{text}**" if t == e else text)
        lines.append(f"| {e} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def cell_notes(cells: Cells, train: Sequence[str], evals: Sequence[str]) -> list[str]:
    """One bullet per distinct reason of the n/a, failed and missing cells, naming the cells."""
    groups: dict[tuple[str, str], list[str]] = {}
    for t in train:
        for e in evals:
            c = cells.get((t, e))
            status = MISSING if c is None else c.status
            if status == OK:
                continue
            reason = "not computed yet" if c is None else (c.reason or "no reason recorded")
            groups.setdefault((status, reason), []).append(f"{e} on {t}")
    return [f"- **{status}** ({', '.join(where)}): {reason}" for (status, reason), where in groups.items()]


def write_markdown(
    path: str | Path,
    cells: Cells,
    train: Sequence[str],
    evals: Sequence[str],
    title: str,
    description: str = "",
    commands: Sequence[str] = (),
) -> str:
    """Write matrix.md: the unit-error table (Table 1), the WER table, notes and commands."""
    metric = metric_name(cells.values())
    parts = [f"# {title}", ""]
    if description:
        parts += [description, ""]
    parts += [
        f"{metric} (%) — columns: the attention a model was **trained** with; rows: the "
        "attention it is **evaluated** with; **bold**: the diagonal (evaluated as trained); "
        "`n/a`: the pair cannot run; `—`: not computed yet.",
        "",
        markdown_table(cells, train, evals, "unit"),
        "",
        "WER (%)",
        "",
        markdown_table(cells, train, evals, "wer"),
        "",
    ]
    notes = cell_notes(cells, train, evals)
    if notes:
        parts += ["Notes", "", *notes, ""]
    if commands:
        parts += ["Made with", "", "```sh", *commands, "```", ""]
    text = "\n".join(parts)
    Path(path).write_text(text)
    return text


def html_table(cells: Cells, train: Sequence[str], evals: Sequence[str], value: str = "unit") -> str:
    """The Table 1 layout as an HTML ``<table>`` (diagonal cells have class ``diag``)."""
    head = "".join(f"<th>{html.escape(t)}</th>" for t in train)
    rows = [f"<tr><th>eval ↓ / train →</th>{head}</tr>"]
    for e in evals:
        tds = []
        for t in train:
            c = cells.get((t, e))
            classes = ["diag"] if t == e else []
            if c is not None and c.status != OK:
                classes.append(c.status.replace("/", ""))
            title = f' title="{html.escape(c.reason)}"' if c is not None and c.reason else ""
            cls = f' class="{" ".join(classes)}"' if classes else ""
            tds.append(f"<td{cls}{title}>{html.escape(cell_text(c, value))}</td>")
        rows.append(f"<tr><th>{html.escape(e)}</th>{''.join(tds)}</tr>")
    return '<table class="matrix">' + "".join(rows) + "</table>"


def plot_heatmap(
    path: str | Path,
    cells: Cells,
    train: Sequence[str],
    evals: Sequence[str],
    title: str = "",
    dpi: int = 120,
) -> Path:
    """Write matrix.png: unit error per (eval row, train column), n/a hatched, diagonal outlined."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    metric = metric_name(cells.values())
    values = np.full((len(evals), len(train)), np.nan)
    for i, e in enumerate(evals):
        for j, t in enumerate(train):
            c = cells.get((t, e))
            if c is not None and c.status == OK and c.unit_error is not None:
                values[i, j] = c.unit_error
    finite = values[np.isfinite(values)]
    vmax = float(min(100.0, max(finite.max(), 1.0))) if finite.size else 100.0
    fig = Figure(figsize=(1.1 * len(train) + 3.0, 0.55 * len(evals) + 2.0), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_facecolor("#dddddd")
    image = ax.imshow(np.ma.masked_invalid(values), cmap="viridis_r", vmin=0.0, vmax=vmax, aspect="auto")
    fig.colorbar(image, ax=ax, label=f"{metric} (%)")
    for i, e in enumerate(evals):
        for j, t in enumerate(train):
            c = cells.get((t, e))
            text = cell_text(c)
            if c is None or c.status != OK:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", edgecolor="#999999", lw=0))
            color = "white" if np.isfinite(values[i, j]) and values[i, j] > 0.6 * vmax else "black"
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color=color,
                    fontweight="bold" if t == e else "normal")
            if t == e:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", lw=2))
    ax.set_xticks(range(len(train)), train, rotation=30, ha="left")
    ax.set_yticks(range(len(evals)), evals)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("trained with")
    ax.set_ylabel("evaluated with")
    if title:
        ax.set_title(title, fontsize=9, pad=28)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=dpi)
    return path
