"""A static HTML page for a finished run or matrix directory (no server, no network).

    python -m fastasr.cli.report DIR [--out FILE]          (make report DIR=...)

A *run directory* (``outputs/runs/<name>``, or ``outputs/matrix/<m>/runs/<spec>``) gives:
a summary (attention, model size, epochs, best checkpoint, last validation scores), curves
from the CSV logger (loss, PER/WER, learning rate, gradient norm, speed, memory), the latest
attention-map images, the checkpoints and the resolved config.

A *matrix directory* (``outputs/matrix/<m>``, has ``matrix.csv``) gives: the Table 1 layout
of the unit error and of the WER, the heatmap, the reasons of n/a and failed cells, the
validation curves of every member overlaid, and the raw CSV.

Curves are matplotlib PNGs inlined as base64, tables are HTML; the page is one file
(``DIR/report.html`` by default).
"""

from __future__ import annotations

import base64
import csv
import datetime as _dt
import html
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fastasr.rundir import RunDir
from fastasr.studies.matrix.cells import CSV_COLUMNS, CSV_FILE, MD_FILE, PNG_FILE, read_cells
from fastasr.studies.matrix.render import cell_notes, html_table

REPORT_FILE = "report.html"
Series = dict[str, tuple[list[float], list[float]]]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f4f4f4}
td.text,th.text{text-align:left}
table.matrix td.diag{font-weight:bold;background:#fff4d6}
table.matrix td.na{color:#888;background:#f0f0f0}table.matrix td.failed{color:#b00}
table.matrix td.missing{color:#888}
img{max-width:100%}.grid{display:flex;flex-wrap:wrap;gap:1em}.grid img{max-width:560px}
pre{background:#f7f7f7;padding:1em;overflow:auto;font-size:.8em}
.muted{color:#777;font-size:.85em}
"""


# ----------------------------------------------------------------------------- reading
def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    """Rows of every ``csv/version_*/metrics.csv`` of a run (resumed runs add versions), in
    version order; empty cells are dropped, numbers parsed."""
    rows: list[dict[str, float]] = []
    for path in RunDir(run_dir).metrics_files():
        with path.open(newline="") as f:
            for raw in csv.DictReader(f):
                row = {}
                for key, text in raw.items():
                    if key is None or text in (None, ""):
                        continue
                    try:
                        row[key] = float(text)
                    except ValueError:
                        continue
                if row:
                    rows.append(row)
    return rows


def series(rows: Sequence[Mapping[str, float]], key: str, x: str = "step") -> tuple[list[float], list[float]]:
    """``(xs, ys)`` of metric ``key`` against ``x`` (step or epoch), finite values only."""
    xs, ys = [], []
    for row in rows:
        if key in row and x in row and math.isfinite(row[key]):
            xs.append(row[x])
            ys.append(row[key])
    return xs, ys


def _load_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    except Exception:  # a broken config must not stop the report
        return {}


# ----------------------------------------------------------------------------- rendering
def figure_data_uri(fig) -> str:
    """A matplotlib Figure as a ``data:image/png;base64,...`` URI."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def file_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def plot_curves(title: str, curves: Series, xlabel: str, ylabel: str, logy: bool = False) -> str | None:
    """One line chart of ``curves`` (label → (xs, ys)) as a data URI; None when all are empty."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    curves = {k: v for k, v in curves.items() if v[0]}
    if not curves:
        return None
    fig = Figure(figsize=(5.6, 3.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for label, (xs, ys) in curves.items():
        marker = "o" if len(xs) < 30 else None
        ax.plot(xs, ys, label=label, marker=marker, markersize=3, linewidth=1.2)
    if logy and all(y > 0 for _, ys in curves.values() for y in ys):
        ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return figure_data_uri(fig)


def html_kv_table(items: Mapping[str, Any]) -> str:
    rows = "".join(
        f'<tr><th class="text">{html.escape(str(k))}</th><td class="text">{html.escape(_fmt(v))}</td></tr>'
        for k, v in items.items()
    )
    return f"<table>{rows}</table>"


def html_rows_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td class="text">{html.escape(_fmt(v))}</td>' for v in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return str(v)


def _img(uri: str | None, alt: str) -> str:
    return "" if uri is None else f'<img src="{uri}" alt="{html.escape(alt)}">'


def _page(title: str, body: Sequence[str]) -> str:
    stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p class='muted'>generated {stamp} by python -m fastasr.cli.report</p>"
        + "\n".join(body)
        + "</body></html>"
    )


# ----------------------------------------------------------------------------- run report
def _unit_key(rows: Sequence[Mapping[str, float]]) -> str:
    return "cer" if any("val/cer" in r for r in rows) and not any("val/per" in r for r in rows) else "per"


def run_curves(rows: Sequence[Mapping[str, float]]) -> list[tuple[str, str]]:
    """(title, data URI) of the standard charts of a run."""
    unit = _unit_key(rows)
    lr_keys = sorted({k for r in rows for k in r if k.startswith("lr-")})
    charts = [
        ("loss", plot_curves("CTC loss", {"train": series(rows, "train/loss"), "val": series(rows, "val/loss")},
                             "step", "loss", logy=True)),
        ("error rates", plot_curves("validation error rates",
                                    {f"val {unit.upper()}": series(rows, f"val/{unit}"),
                                     "val WER": series(rows, "val/wer")}, "step", "%")),
        ("learning rate", plot_curves("learning rate", {k[3:]: series(rows, k) for k in lr_keys}, "step", "lr",
                                      logy=True)),
        ("gradient norm", plot_curves("gradient norm (before clipping)",
                                      {"train": series(rows, "train/grad_norm")}, "step", "L2 norm", logy=True)),
        ("speed", plot_curves("seconds per training batch", {"batch": series(rows, "perf/batch_seconds"),
                                                             "data wait": series(rows, "perf/data_seconds")},
                              "step", "s")),
        ("throughput", plot_curves("training throughput", {"frames/s": series(rows, "perf/frames_per_second")},
                                   "step", "frames per second")),
        ("memory", plot_curves("peak memory", {"peak": series(rows, "perf/peak_memory_mb")}, "step", "MiB")),
    ]
    return [(t, uri) for t, uri in charts if uri is not None]


def _model_summary(config: Mapping[str, Any]) -> dict[str, Any]:
    model = config.get("model") or {}
    keys = ("attention", "shared_qk", "d_model", "heads", "ff_dim", "layers", "subsampling")
    out = {f"model.{k}": model.get(k) for k in keys if k in model}
    for section, keys in (("optim", ("_target_", "lr", "weight_decay")), ("trainer", ("max_epochs", "precision"))):
        for k in keys:
            if k in (config.get(section) or {}):
                out[f"{section}.{k}"] = config[section][k]
    return out


def run_summary(run_dir: Path, rows: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """Key facts of a run: config highlights, fit_done.json, last validation and speed."""
    config = _load_yaml(run_dir / "config.yaml")
    summary: dict[str, Any] = {"run": str(run_dir)}
    summary.update(_model_summary(config))
    done = RunDir(run_dir).read_fit_done()
    if done:
        summary["finished"] = f"{done.get('epochs')} epochs, {done.get('global_step')} steps"
        summary["best checkpoint"] = Path(done["best_ckpt"]).name if done.get("best_ckpt") else None
        for k, v in (done.get("val") or {}).items():
            summary[f"last {k}"] = v
    else:
        summary["finished"] = "no (no fit_done.json: running, killed, or a debug run)"
    unit = _unit_key(rows)
    best = [r for r in rows if f"val/{unit}" in r]
    if best:
        top = min(best, key=lambda r: r[f"val/{unit}"])
        summary[f"best val/{unit}"] = f"{top[f'val/{unit}']:.2f} (epoch {int(top.get('epoch', -1))})"
    for key, label in (("perf/batch_seconds", "median s/batch"), ("perf/frames_per_second", "median frames/s")):
        ys = sorted(series(rows, key)[1])
        if ys:
            summary[label] = ys[len(ys) // 2]
    peaks = series(rows, "perf/peak_memory_mb")[1]
    if peaks:
        summary["peak memory MiB"] = max(peaks)
    results = run_dir / "results.json"
    if results.is_file():
        try:
            summary["results.json"] = json.loads(results.read_text())
        except json.JSONDecodeError:
            pass
    return summary


def run_sections(run_dir: Path, max_maps: int = 3) -> list[str]:
    """The HTML sections of a run report (also used inside a matrix report)."""
    rows = read_metrics(run_dir)
    body = ["<h2>Summary</h2>", html_kv_table(run_summary(run_dir, rows))]
    charts = run_curves(rows)
    body.append("<h2>Curves</h2>")
    if charts:
        body.append('<div class="grid">' + "".join(_img(uri, t) for t, uri in charts) + "</div>")
    else:
        body.append("<p class='muted'>no csv/version_*/metrics.csv (logger=csv or logger=default writes it)</p>")
    maps = sorted((run_dir / "attention_maps").glob("*.png"), key=lambda p: p.stat().st_mtime)
    if maps:
        body.append("<h2>Attention maps</h2>")
        shown = maps[-max_maps:]
        body.append(f"<p class='muted'>{len(maps)} images in attention_maps/; the last {len(shown)}:</p>")
        body += [f"<figure>{_img(file_data_uri(p), p.name)}<figcaption>{html.escape(p.name)}</figcaption></figure>"
                 for p in shown]
    ckpts = sorted((run_dir / "checkpoints").glob("*.ckpt"))
    if ckpts:
        body.append("<h2>Checkpoints</h2>")
        body.append(html_rows_table(
            ["file", "MiB", "modified"],
            [[p.name, f"{p.stat().st_size / 2**20:.1f}",
              _dt.datetime.fromtimestamp(p.stat().st_mtime).strftime("%Y-%m-%d %H:%M:%S")] for p in ckpts],
        ))
    config = run_dir / "config.yaml"
    if config.is_file():
        body.append("<h2>Config</h2><details><summary>config.yaml</summary>"
                    f"<pre>{html.escape(config.read_text())}</pre></details>")
    return body


def run_report(run_dir: str | Path) -> str:
    run_dir = Path(run_dir)
    return _page(f"fastasr run: {run_dir.name}", run_sections(run_dir))


# ----------------------------------------------------------------------------- matrix report
def matrix_report(matrix_dir: str | Path) -> str:

    matrix_dir = Path(matrix_dir)
    cells = read_cells(matrix_dir / CSV_FILE)
    config = _load_yaml(matrix_dir / "cross_eval.yaml").get("matrix") or {}
    train = list(config.get("train") or dict.fromkeys(t for t, _ in cells))
    evals = list(config.get("eval") or dict.fromkeys(e for _, e in cells))
    metric = "PER" if any(c.per is not None for c in cells.values()) or not cells else "CER"
    body = [
        f"<p>Columns: the attention a model was <b>trained</b> with; rows: the attention it is "
        f"<b>evaluated</b> with; highlighted: the diagonal. Split: {html.escape(str(config.get('split', 'dev')))}.</p>",
        f"<h2>{metric} (%)</h2>", html_table(cells, train, evals, "unit"),
        "<h2>WER (%)</h2>", html_table(cells, train, evals, "wer"),
    ]
    notes = cell_notes(cells, train, evals)
    if notes:
        items = "".join(f"<li>{html.escape(n[2:].replace('**', ''))}</li>" for n in notes)
        body.append(f"<h2>Notes</h2><ul>{items}</ul>")
    if (matrix_dir / PNG_FILE).is_file():
        body += ["<h2>Heatmap</h2>", _img(file_data_uri(matrix_dir / PNG_FILE), "matrix heatmap")]
    runs = [matrix_dir / "runs" / t for t in train if (matrix_dir / "runs" / t).is_dir()]
    if runs:
        metrics = {r.name: read_metrics(r) for r in runs}
        unit = _unit_key([row for rows in metrics.values() for row in rows])
        charts = [
            plot_curves(f"validation {unit.upper()} by trained attention",
                        {n: series(rows, f"val/{unit}", "epoch") for n, rows in metrics.items()}, "epoch", "%"),
            plot_curves("validation loss", {n: series(rows, "val/loss", "epoch") for n, rows in metrics.items()},
                        "epoch", "loss", logy=True),
            plot_curves("seconds per training batch",
                        {n: series(rows, "perf/batch_seconds") for n, rows in metrics.items()}, "step", "s"),
        ]
        body.append("<h2>Training of the members</h2>")
        body.append('<div class="grid">' + "".join(_img(c, "curves") for c in charts if c) + "</div>")
        table = []
        for r in runs:
            s = run_summary(r, metrics[r.name])
            table.append([r.name, s.get("finished"), s.get(f"best val/{unit}"), s.get("median s/batch"),
                          s.get("peak memory MiB"), f"runs/{r.name}"])
        body.append(html_rows_table(
            ["trained with", "finished", f"best val {unit.upper()}", "median s/batch", "peak MiB", "run dir"], table))
    ordered = sorted(cells.values(), key=lambda c: (
        train.index(c.train) if c.train in train else len(train),
        evals.index(c.eval) if c.eval in evals else len(evals)))
    body.append("<h2>matrix.csv</h2>")
    body.append(html_rows_table(list(CSV_COLUMNS), [[c.to_row()[k] for k in CSV_COLUMNS] for c in ordered]))
    md = matrix_dir / MD_FILE
    if md.is_file():
        body.append(f"<h2>matrix.md</h2><details><summary>{MD_FILE}</summary><pre>{html.escape(md.read_text())}</pre></details>")
    return _page(f"fastasr matrix: {config.get('name', matrix_dir.name)}", body)


# ----------------------------------------------------------------------------- entry
def kind_of(directory: Path) -> str:
    """``"matrix"`` (has matrix.csv) or ``"run"`` (has config.yaml, csv/ or checkpoints/)."""
    if (directory / "matrix.csv").is_file():
        return "matrix"
    if any((directory / p).exists() for p in ("config.yaml", "csv", "checkpoints")):
        return "run"
    raise FileNotFoundError(
        f"{directory}: neither a run directory (config.yaml, csv/, checkpoints/) "
        "nor a matrix directory (matrix.csv)"
    )


def build_report(directory: str | Path, out: str | Path | None = None) -> Path:
    """Write the HTML report of ``directory`` (``DIR/report.html`` unless ``out``); returns its path."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such directory")
    page = matrix_report(directory) if kind_of(directory) == "matrix" else run_report(directory)
    path = Path(out) if out else directory / REPORT_FILE
    path.write_text(page, encoding="utf-8")
    return path
