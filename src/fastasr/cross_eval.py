"""The approximation matrix (Table 1 of Vyas et al. 2020): train with X, evaluate with Y.

    python -m fastasr.cross_eval [matrix=smoke|default] [overrides]      (make matrix)

For every *train spec* (``full``, ``shared-full``, ``lsh-1``, …) a model is trained with
``python train.py experiment=matrix_member member=<spec>`` — here in-process, through the
same config, so a Hydra multirun of train.py (locally or on a cluster) produces exactly the
run directories this module looks for — or a finished one is reused. Each model is then
decoded on the dev split with every *eval spec*; the matrix directory
``${paths.output_dir}/matrix/<matrix.name>/`` receives:

    matrix.csv   one row per (train, eval) pair: status ok | n/a | failed | missing, PER (or
                 CER), WER, utterances, decode seconds, reason, checkpoint, train step
    matrix.md    the paper's Table 1 (train across, eval down, diagonal in bold) + WER table
    matrix.png   a heatmap of the same
    runs/<spec>/ the trained models (train.py run directories)

Resumable: finished cells are read back from matrix.csv and skipped as long as the model
they were computed with is unchanged (same checkpoint, same training step); a model whose
``fit_done.json`` (written by :class:`fastasr.callbacks.FitCompletionMarker`) is missing is
(re)trained, resuming from its ``last.ckpt``.

Train spec → model: ``shared-full`` is full attention with ``model.shared_qk=true``; LSH
specs get ``model.shared_qk=true`` (Reformer hashes queries and keys together); every other
spec trains with separate Q/K projections. Eval spec → attention swapped in at decode time;
``shared-full`` is ``full`` on a shared-Q/K model. Pairs that cannot run are ``n/a`` with
the reason.
"""

from __future__ import annotations

import contextlib
import csv
import html
import json
import logging
import math
import os
import shlex
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from fastasr.config import CONFIG_DIR
from fastasr.rundir import RunDir

log = logging.getLogger(__name__)

SHARED_FULL = "shared-full"
MEMBER_EXPERIMENT = "matrix_member"
CSV_FILE, MD_FILE, PNG_FILE = "matrix.csv", "matrix.md", "matrix.png"
CSV_COLUMNS = (
    "train", "eval", "status", "per", "cer", "wer", "utterances", "decode_seconds",
    "reason", "checkpoint", "train_step",
)
OK, NA, FAILED, MISSING = "ok", "n/a", "failed", "missing"

REASON_SHARED_FULL = (
    "shared-full is full attention with one Q/K projection: needs a model trained with "
    "shared Q/K (model.shared_qk=true)"
)
REASON_LSH = (
    "LSH hashes queries and keys together: needs a model trained with shared Q/K "
    "(model.shared_qk=true)"
)


class MatrixError(RuntimeError):
    """A matrix configuration that cannot be run as asked."""


# ----------------------------------------------------------------------------- specs
def _attention(spec: str):
    from fastasr.attention import build_attention

    return build_attention(spec)


def train_member(spec: str) -> tuple[str, bool]:
    """``(attention spec, shared_qk)`` a train spec stands for.

    ``shared-full`` → ``("full", True)``; LSH specs → shared Q/K; the rest → separate Q/K.
    Raises ValueError (from ``build_attention``) for an unknown spec.
    """
    if spec == SHARED_FULL:
        return "full", True
    inner = _attention(spec)
    return spec, bool(inner.requires_shared_qk)


def eval_attention(eval_spec: str, shared_qk: bool) -> tuple[str | None, str]:
    """The attention to decode with for ``eval_spec`` on a model with/without shared Q/K,
    or ``(None, reason)`` when the pair cannot run."""
    if eval_spec == SHARED_FULL:
        return ("full", "") if shared_qk else (None, REASON_SHARED_FULL)
    inner = _attention(eval_spec)
    if inner.requires_shared_qk and not shared_qk:
        return None, REASON_LSH
    return eval_spec, ""


# ----------------------------------------------------------------------------- cells
@dataclass
class Cell:
    """One (train, eval) pair of the matrix (a row of matrix.csv)."""

    train: str
    eval: str
    status: str = MISSING
    per: float | None = None
    cer: float | None = None
    wer: float | None = None
    utterances: int | None = None
    decode_seconds: float | None = None
    reason: str = ""
    checkpoint: str = ""
    train_step: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        return self.train, self.eval

    @property
    def unit_error(self) -> float | None:
        """PER for phoneme models, CER for character models."""
        return self.per if self.per is not None else self.cer

    def to_row(self) -> dict[str, str]:
        def fmt(v: Any) -> str:
            if v is None:
                return ""
            if isinstance(v, float):
                return f"{v:.4f}" if math.isfinite(v) else "nan"
            return str(v)

        return {c: fmt(getattr(self, c)) for c in CSV_COLUMNS}

    @classmethod
    def from_row(cls, row: Mapping[str, str]) -> Cell:
        def num(key: str, kind=float):
            text = (row.get(key) or "").strip()
            if not text:
                return None
            try:
                return kind(float(text)) if kind is int else kind(text)
            except ValueError:
                return None

        return cls(
            train=row["train"],
            eval=row["eval"],
            status=row.get("status") or MISSING,
            per=num("per"),
            cer=num("cer"),
            wer=num("wer"),
            utterances=num("utterances", int),
            decode_seconds=num("decode_seconds"),
            reason=row.get("reason") or "",
            checkpoint=row.get("checkpoint") or "",
            train_step=num("train_step", int),
        )


def read_cells(path: str | Path) -> dict[tuple[str, str], Cell]:
    """The cells of a matrix.csv (empty when the file does not exist)."""
    path = Path(path)
    if not path.is_file():
        return {}
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"train", "eval", "status"} - set(reader.fieldnames or ())
        if missing:
            raise MatrixError(f"{path}: not a matrix.csv (no column {', '.join(sorted(missing))})")
        cells = [Cell.from_row(r) for r in reader]
    return {c.key: c for c in cells}


def write_cells(path: str | Path, cells: Iterable[Cell]) -> None:
    """Write matrix.csv atomically (a kill never leaves half a file)."""
    path = Path(path)
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for cell in cells:
            writer.writerow(cell.to_row())
    tmp.replace(path)


def ordered(cells: Mapping[tuple[str, str], Cell], train: Sequence[str], evals: Sequence[str]) -> list[Cell]:
    """Cells in train-list × eval-list order, then any others (from earlier lists) after them."""
    first = [cells[(t, e)] for t in train for e in evals if (t, e) in cells]
    seen = {c.key for c in first}
    return first + [c for k, c in cells.items() if k not in seen]


# ----------------------------------------------------------------------------- tables
def _metric_name(cells: Iterable[Cell]) -> str:
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


def markdown_table(
    cells: Mapping[tuple[str, str], Cell], train: Sequence[str], evals: Sequence[str], value: str = "unit"
) -> str:
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


def cell_notes(cells: Mapping[tuple[str, str], Cell], train: Sequence[str], evals: Sequence[str]) -> list[str]:
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
    cells: Mapping[tuple[str, str], Cell],
    train: Sequence[str],
    evals: Sequence[str],
    title: str,
    description: str = "",
    commands: Sequence[str] = (),
) -> str:
    """Write matrix.md: the unit-error table (Table 1), the WER table, notes and commands."""
    metric = _metric_name(cells.values())
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


def html_table(
    cells: Mapping[tuple[str, str], Cell], train: Sequence[str], evals: Sequence[str], value: str = "unit"
) -> str:
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
    cells: Mapping[tuple[str, str], Cell],
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

    metric = _metric_name(cells.values())
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


# ----------------------------------------------------------------------------- members
@contextlib.contextmanager
def _outside_hydra_job() -> Iterator[None]:
    """Hide the running Hydra job (cross_eval's own) from ``fastasr.training.train``, so a
    member trains in ``cfg.paths.run_dir`` rather than in cross_eval's output directory."""
    hydra_cfg = HydraConfig.instance()
    saved = hydra_cfg.cfg
    hydra_cfg.cfg = None
    try:
        yield
    finally:
        hydra_cfg.cfg = saved


@dataclass
class Member:
    """One trained model of the matrix: its train spec, config and run directory."""

    spec: str
    attention: str
    shared_qk: bool
    overrides: list[str]
    cfg: DictConfig
    run_dir: Path

    @property
    def command(self) -> str:
        """The train.py command that trains this member on its own (same run directory)."""
        return "python train.py " + " ".join(shlex.quote(o) for o in self.overrides)

    def finished(self) -> dict[str, Any] | None:
        """The ``fit_done.json`` record when training is complete for the configured budget."""
        done = RunDir(self.run_dir).read_fit_done()
        if done is None:
            return None
        wanted = self.cfg.trainer.get("max_epochs")
        if wanted is not None and done.get("max_epochs") is not None and int(done["max_epochs"]) < int(wanted):
            return None  # asked for more epochs than it has: continue training
        return done

    def checkpoint(self, done: Mapping[str, Any]) -> Path:
        """The checkpoint the matrix decodes: the best by validation error, else the last."""
        ckpt_dir = self.run_dir / "checkpoints"
        for key in ("best_ckpt", "last_ckpt"):
            if done.get(key):
                path = Path(done[key])
                for candidate in (path, ckpt_dir / path.name):
                    if candidate.is_file():
                        return candidate
        best = sorted(ckpt_dir.glob("best-*.ckpt"))
        if best:
            return best[-1]
        if (ckpt_dir / "last.ckpt").is_file():
            return ckpt_dir / "last.ckpt"
        raise FileNotFoundError(f"{self.run_dir}: fit_done.json present but no checkpoint in {ckpt_dir}")

    def check_saved_config(self) -> None:
        """Refuse to reuse/resume a run directory trained with a different model config."""
        saved_file = self.run_dir / "config.yaml"
        if not saved_file.is_file():
            return
        saved = OmegaConf.to_container(OmegaConf.load(saved_file), resolve=False)
        wanted = OmegaConf.to_container(self.cfg, resolve=True)
        diffs = []
        for key in _IDENTITY_KEYS:
            diffs += _diff(_select(saved, key), _select(wanted, key), key)
        if diffs:
            raise MatrixError(
                f"{self.run_dir} was trained with another config ({'; '.join(diffs[:5])}); "
                "delete that run directory or give this matrix another matrix.name"
            )


# What makes two trainings "the same model" for reuse: its architecture and what it learnt from.
_IDENTITY_KEYS = ("model", "data.train_manifest", "data.tokenizer", "data.features")


def _select(cfg: Mapping[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _diff(a: Any, b: Any, prefix: str = "model") -> list[str]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            out += _diff(a.get(key), b.get(key), f"{prefix}.{key}")
        return out
    return [] if a == b else [f"{prefix}: {a!r} there, {b!r} here"]


def member_overrides(cfg: DictConfig, spec: str) -> list[str]:
    """The train.py overrides of the member trained with ``spec`` (see conf/cross_eval.yaml)."""
    m = cfg.matrix
    attention, shared_qk = train_member(spec)
    overrides = [
        f"experiment={m.experiment}",
        f"member={spec}",
        f"matrix_name={m.name}",
        f"paths.output_dir={cfg.paths.output_dir}",
    ]
    if m.get("data"):
        overrides.append(f"data={m.data}")
    if m.get("max_epochs") is not None:
        overrides.append(f"trainer.max_epochs={m.max_epochs}")
    overrides += [str(o) for o in (m.get("overrides") or [])]
    overrides += [str(o) for o in (m.get("extra_overrides") or [])]
    return overrides


def compose_member(cfg: DictConfig, spec: str) -> Member:
    """Compose train.yaml for one member with Hydra (the same config ``train.py`` would see)."""
    attention, shared_qk = train_member(spec)
    overrides = member_overrides(cfg, spec)
    composed = hydra.compose(config_name="train", overrides=overrides)
    if bool(composed.model.get("shared_qk")) != shared_qk:
        # the experiment's member_table covers shared-full and lsh-1/2/4/8; say it for other specs
        overrides.insert(3, f"model.shared_qk={str(shared_qk).lower()}")
        composed = hydra.compose(config_name="train", overrides=overrides)
    run_dir = Path(composed.paths.run_dir)
    expected = Path(cfg.matrix_dir) / "runs" / spec
    if run_dir.resolve() != expected.resolve():
        raise MatrixError(
            f"member {spec}: experiment={cfg.matrix.experiment} puts its run in {run_dir}, "
            f"expected {expected}; set paths.run_dir: ${{paths.output_dir}}/matrix/${{matrix_name}}/runs/${{member}}"
        )
    if composed.model.get("shared_qk") != shared_qk:
        raise MatrixError(f"member {spec}: model.shared_qk={composed.model.shared_qk}, expected {shared_qk}")
    if str(composed.model.get("attention")) != attention:
        raise MatrixError(f"member {spec}: model.attention={composed.model.attention}, expected {attention}")
    return Member(spec, attention, shared_qk, overrides, composed, run_dir)


def _finish_wandb() -> None:
    try:
        import wandb
    except ImportError:  # pragma: no cover - wandb is a dependency
        return
    if wandb.run is not None:
        wandb.finish()


def train_member_model(member: Member) -> dict[str, Any]:
    """Train (or resume) a member in-process; returns its ``fit_done.json`` record."""
    from fastasr.training import train

    member.check_saved_config()
    log.info("training %s in %s\n    %s", member.spec, member.run_dir, member.command)
    try:
        with _outside_hydra_job():
            train(member.cfg)
    finally:
        _finish_wandb()
    done = RunDir(member.run_dir).read_fit_done()
    if done is None:
        raise MatrixError(
            f"{member.run_dir}: training returned but wrote no fit_done.json; "
            "is fastasr.callbacks.FitCompletionMarker in the callbacks config?"
        )
    return done


# ----------------------------------------------------------------------------- decoding
def _relative(path: Path, base: Path) -> str:
    try:
        return os.path.relpath(path, base)
    except ValueError:  # other drive (Windows)
        return str(path)


def decode_cell(member: Member, recogniser, eval_spec: str, manifest: str, cfg: DictConfig) -> Cell:
    """Decode ``manifest`` with ``recogniser`` swapped to ``eval_spec``; the cell is ok or failed."""
    from fastasr.recogniser import decode_manifest, decoding_options

    cell = Cell(member.spec, eval_spec)
    attention, reason = eval_attention(eval_spec, member.shared_qk)
    if attention is None:
        cell.status, cell.reason = NA, reason
        return cell
    try:
        recogniser.model.set_attention(attention)
        result = decode_manifest(recogniser, manifest, accelerator=cfg.matrix.accelerator, seed=cfg.seed,
                                 **decoding_options(member.cfg.data))
    except Exception as err:  # one broken cell must not stop the matrix
        log.exception("cell %s / %s failed", member.spec, eval_spec)
        cell.status, cell.reason = FAILED, f"{type(err).__name__}: {err}".replace("\n", " ")[:500]
        return cell
    cell.status = OK
    cell.per, cell.cer, cell.wer = result.get("per"), result.get("cer"), result.get("wer")
    cell.utterances = result.get("utterances")
    cell.decode_seconds = result.get("decode_seconds")
    return cell


# ----------------------------------------------------------------------------- the matrix
@dataclass
class MatrixResult:
    """What :func:`run_matrix` did: the directory, the cells, and which work it did."""

    matrix_dir: Path
    cells: dict[tuple[str, str], Cell]
    trained: list[str] = field(default_factory=list)
    decoded: list[tuple[str, str]] = field(default_factory=list)
    reused: list[tuple[str, str]] = field(default_factory=list)

    @property
    def failed(self) -> list[Cell]:
        return [c for c in self.cells.values() if c.status == FAILED]


def _check_lists(train: Sequence[str], evals: Sequence[str]) -> None:
    for kind, specs in (("matrix.train", train), ("matrix.eval", evals)):
        if not specs:
            raise MatrixError(f"{kind} is empty; expected a list of attention specs")
        if len(set(specs)) != len(specs):
            raise MatrixError(f"{kind} lists a spec twice: {list(specs)}")
        for spec in specs:
            if spec != SHARED_FULL:
                try:
                    _attention(spec)
                except ValueError as err:
                    raise MatrixError(f"{kind}: {err}") from None


def _is_current(cell: Cell | None, checkpoint: str | None, step: int | None) -> bool:
    """A cell from matrix.csv that need not be recomputed."""
    if cell is None:
        return False
    if cell.status == NA:
        return True
    if cell.status != OK or checkpoint is None:
        return False
    return cell.checkpoint == checkpoint and cell.train_step == step


def _description(cfg: DictConfig, manifest: str | None, cells: Mapping[tuple[str, str], Cell]) -> str:
    utts = {c.utterances for c in cells.values() if c.status == OK and c.utterances}
    where = f"`{manifest}`" if manifest else f"the {cfg.matrix.split} split"
    count = f" ({', '.join(str(u) for u in sorted(utts))} utterances)" if utts else ""
    return f"Matrix `{cfg.matrix.name}`: {cfg.matrix.split} split {where}{count}, greedy CTC decoding."


def _commands(invocation: Sequence[str], members: Sequence[Member]) -> list[str]:
    lines = ["# the whole matrix (trains what is missing, then decodes every pair):"]
    lines.append(" ".join(["python -m fastasr.cross_eval", *(shlex.quote(o) for o in invocation)]))
    if members:
        lines.append("# or each model alone (a Hydra multirun of these is equivalent):")
        lines += [m.command for m in members]
    return lines


def write_outputs(
    cfg: DictConfig, result: MatrixResult, members: Sequence[Member], manifest: str | None,
    invocation: Sequence[str] = (),
) -> None:
    """matrix.csv (already current), matrix.md and matrix.png."""
    train, evals = list(cfg.matrix.train), list(cfg.matrix.eval)
    title = f"Approximation matrix `{cfg.matrix.name}`"
    write_markdown(
        result.matrix_dir / MD_FILE, result.cells, train, evals, title,
        _description(cfg, manifest, result.cells), _commands(invocation, members),
    )
    plot_heatmap(result.matrix_dir / PNG_FILE, result.cells, train, evals,
                 title=f"matrix {cfg.matrix.name}: {cfg.matrix.split} {_metric_name(result.cells.values())}")


def log_to_wandb(cfg: DictConfig, result: MatrixResult) -> Path | None:
    """Log the matrix as a wandb table plus the heatmap image (one run per invocation)."""
    mode = cfg.matrix.get("wandb")
    if not mode or mode == "disabled":
        return None
    import wandb

    _finish_wandb()
    train, evals = list(cfg.matrix.train), list(cfg.matrix.eval)
    run = wandb.init(
        project=cfg.matrix.get("wandb_project", "fastasr"),
        name=f"matrix-{cfg.matrix.name}",
        job_type="cross_eval",
        dir=str(result.matrix_dir),
        mode=mode,
        config={"matrix": OmegaConf.to_container(cfg.matrix, resolve=True)},
        settings=wandb.Settings(silent=True),
    )
    try:
        rows = [[c.to_row()[k] for k in CSV_COLUMNS] for c in ordered(result.cells, train, evals)]
        table = wandb.Table(columns=list(CSV_COLUMNS), data=rows)
        run.log({"matrix/table": table, "matrix/heatmap": wandb.Image(str(result.matrix_dir / PNG_FILE))})
        for c in result.cells.values():
            if c.status == OK and c.unit_error is not None:
                run.summary[f"matrix/{c.train}/{c.eval}"] = c.unit_error
        run_dir = Path(run.dir).parent
    finally:
        run.finish()
    return run_dir


def _todo(member: Member, cells: Mapping[tuple[str, str], Cell], evals: Sequence[str],
          done: Mapping[str, Any] | None, matrix_dir: Path) -> tuple[list[str], Path | None]:
    """Eval specs of ``member`` whose cells must be (re)computed, and the checkpoint to use."""
    ckpt = member.checkpoint(done) if done else None
    ckpt_rel = _relative(ckpt, matrix_dir) if ckpt else None
    step = int(done["global_step"]) if done else None
    todo = [e for e in evals if not _is_current(cells.get((member.spec, e)), ckpt_rel, step)]
    return todo, ckpt


def _run_member(cfg: DictConfig, member: Member, manifest: str, result: MatrixResult, save) -> None:
    """Bring one column of the matrix up to date: n/a cells, training if needed, decoding."""
    from fastasr.recogniser import load_recogniser

    cells, evals, matrix_dir = result.cells, list(cfg.matrix.eval), result.matrix_dir
    for e in evals:  # n/a cells need no model
        attention, reason = eval_attention(e, member.shared_qk)
        if attention is None:
            cells[(member.spec, e)] = Cell(member.spec, e, NA, reason=reason)
    done = member.finished()
    todo, ckpt = _todo(member, cells, evals, done, matrix_dir)
    if todo and done is None:
        if not cfg.matrix.train_missing:
            for e in todo:
                cells[(member.spec, e)] = Cell(
                    member.spec, e, MISSING,
                    reason=f"no finished training in {member.run_dir} (matrix.train_missing=false); "
                    f"train it with: {member.command}",
                )
            save()
            return
        try:
            done = train_member_model(member)
        except MatrixError:
            raise
        except Exception as err:
            log.exception("training %s failed", member.spec)
            reason = f"training failed: {type(err).__name__}: {err}".replace("\n", " ")[:500]
            for e in todo:
                cells[(member.spec, e)] = Cell(member.spec, e, FAILED, reason=reason)
            save()
            return
        result.trained.append(member.spec)
        todo, ckpt = _todo(member, cells, evals, done, matrix_dir)  # a resumed, finished run keeps its cells
    elif done is not None:
        member.check_saved_config()
    result.reused += [(member.spec, e) for e in evals if e not in todo]
    if not todo:
        log.info("%s: all %d cells current, nothing to decode", member.spec, len(evals))
        save()
        return
    log.info("%s: decoding %s with %s (%s)", member.spec, manifest, ", ".join(todo), ckpt)
    recogniser = load_recogniser(ckpt)
    ckpt_rel, step = _relative(ckpt, matrix_dir), int(done["global_step"])
    for e in todo:
        start = time.perf_counter()
        cell = decode_cell(member, recogniser, e, manifest, cfg)
        cell.checkpoint, cell.train_step = ckpt_rel, step
        cells[cell.key] = cell
        result.decoded.append(cell.key)
        save()
        log.info("  %s / %s: %s %s (%.1f s)", member.spec, e, cell.status, cell_text(cell),
                 time.perf_counter() - start)


def run_matrix(cfg: DictConfig, invocation: Sequence[str] = ()) -> MatrixResult:
    """Train what is missing, decode every pair not yet in matrix.csv, write the outputs.

    ``cfg`` is the composed ``cross_eval`` config. Hydra must be initialised (it is under
    ``python -m fastasr.cross_eval``; tests use ``initialize_config_dir``) because members
    are composed from ``train.yaml``. ``invocation``: the command-line overrides, recorded
    in matrix.md.
    """
    if not GlobalHydra.instance().is_initialized():
        with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return run_matrix(cfg, invocation)
    m = cfg.matrix
    train, evals = list(m.train), list(m.eval)
    _check_lists(train, evals)
    matrix_dir = Path(cfg.matrix_dir)
    matrix_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, matrix_dir / "cross_eval.yaml", resolve=True)
    csv_path = matrix_dir / CSV_FILE
    cells = read_cells(csv_path)
    result = MatrixResult(matrix_dir, cells)
    members = [compose_member(cfg, spec) for spec in train]
    manifest: str | None = None

    def save() -> None:
        write_cells(csv_path, ordered(cells, train, evals))

    for member in members:
        manifest = str(member.cfg.data.get(f"{m.split}_manifest"))
        _run_member(cfg, member, manifest, result, save)

    write_cells(csv_path, ordered(cells, train, evals))
    write_outputs(cfg, result, members, manifest, invocation)
    try:
        log_to_wandb(cfg, result)
    except Exception as err:  # the files are the record; a dashboard hiccup is not fatal
        log.warning("wandb logging of the matrix failed: %s: %s", type(err).__name__, err)
    summary = {"trained": result.trained, "decoded": len(result.decoded), "reused": len(result.reused),
               "failed": [f"{c.eval} on {c.train}" for c in result.failed]}
    (matrix_dir / "last_invocation.json").write_text(json.dumps(summary, indent=2) + "\n")
    log.info("matrix written to %s: %s", matrix_dir, summary)
    return result


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="cross_eval")
def main(cfg: DictConfig) -> None:
    result = run_matrix(cfg, invocation=list(HydraConfig.get().overrides.task))
    print((result.matrix_dir / MD_FILE).read_text())
    if result.failed:
        raise SystemExit(f"{len(result.failed)} matrix cell(s) failed; see {result.matrix_dir / CSV_FILE}")


if __name__ == "__main__":
    main()
