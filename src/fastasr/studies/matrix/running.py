"""Running the matrix: train what is missing, decode every pair not yet in matrix.csv,
write matrix.csv / matrix.md / matrix.png and the wandb table.

Resumable: a cell read back from matrix.csv is kept while the model it was computed with
is unchanged (same checkpoint, same training step); a model without ``fit_done.json`` is
(re)trained, resuming from its last checkpoint. ``matrix.csv`` is rewritten after every
cell, so a kill loses at most the cell being decoded.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict

from fastasr.config import CONFIG_DIR
from fastasr.recognition.loading import load_recogniser
from fastasr.recognition.scoring import (
    DecodeResult,
    decode_manifest,
    decoding_options,
    training_manifest,
)
from fastasr.studies.matrix.cells import (
    CSV_FILE,
    FAILED,
    MD_FILE,
    MISSING,
    NA,
    OK,
    PNG_FILE,
    Cell,
    Cells,
    decoding_label,
    is_current,
    ordered,
    read_cells,
    write_cells,
)
from fastasr.studies.matrix.dashboard import log_to_wandb
from fastasr.studies.matrix.members import Member, compose_member, train_member_model
from fastasr.studies.matrix.render import cell_text, metric_name, plot_heatmap, write_markdown
from fastasr.studies.matrix.rules import MatrixError, check_spec_lists, eval_attention

log = logging.getLogger(__name__)


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


# ----------------------------------------------------------------------------- decoding
def load_checkpoint(ckpt: Path, member: Member):
    """The recogniser of a member's checkpoint (:func:`fastasr.recognition.recogniser.load_recogniser`),
    on the CPU, in eval mode, knowing the member's training manifest (for the lexicon sources that
    read it)."""
    return load_recogniser(ckpt, training_manifest=training_manifest(member.cfg.data))


def decoding_of(member: Member, cfg: DictConfig) -> dict[str, Any] | None:
    """``cfg.matrix.decoding`` (a ``conf/decoding`` option; None: greedy) resolved in the
    member's training config, so interpolations such as ``${data.train_manifest}`` are the member's."""
    spec = cfg.matrix.get("decoding")
    if not spec:
        return None
    context = member.cfg.copy()
    with open_dict(context):
        context.matrix_decoding = OmegaConf.to_container(spec, resolve=False)
    return OmegaConf.to_container(context.matrix_decoding, resolve=True)


def decode_with(member: Member, recogniser, manifest: str, cfg: DictConfig) -> DecodeResult:
    """Decode ``manifest`` with ``recogniser`` as it is (its attention already swapped) and
    ``cfg.matrix.decoding``, through :func:`fastasr.recognition.scoring.decode_manifest`; returns its
    :class:`~fastasr.recognition.scoring.DecodeResult` (per/cer, wer (%), utterances, decode_seconds, ...).
    Tokenizer, features, lexicon and word LM are the
    checkpoint's; batching follows the member's data config."""
    return decode_manifest(recogniser, manifest, accelerator=cfg.matrix.accelerator, seed=cfg.seed,
                           decoding=decoding_of(member, cfg), **decoding_options(member.cfg.data))


def decode_cell(member: Member, recogniser, eval_spec: str, manifest: str, cfg: DictConfig) -> Cell:
    """Decode ``manifest`` with ``recogniser`` swapped to ``eval_spec``; the cell is ok, n/a or failed."""
    cell = Cell(member.spec, eval_spec)
    attention, reason = eval_attention(eval_spec, member.shared_qk)
    if attention is None:
        cell.status, cell.reason = NA, reason
        return cell
    try:
        recogniser.model.set_attention(attention)
        result = decode_with(member, recogniser, manifest, cfg)
    except Exception as err:  # one broken cell must not stop the matrix
        log.exception("cell %s / %s failed", member.spec, eval_spec)
        cell.status, cell.reason = FAILED, f"{type(err).__name__}: {err}".replace("\n", " ")[:500]
        return cell
    cell.status = OK
    cell.per, cell.cer, cell.wer = result.per, result.cer, result.wer
    cell.utterances = result.utterances
    cell.decode_seconds = result.decode_seconds
    return cell


def _relative(path: Path, base: Path) -> str:
    try:
        return os.path.relpath(path, base)
    except ValueError:  # other drive (Windows)
        return str(path)


# ----------------------------------------------------------------------------- one column
def _todo(member: Member, cells: Cells, evals: Sequence[str], done: Mapping[str, Any] | None,
          matrix_dir: Path, decoding: str) -> tuple[list[str], Path | None]:
    """Eval specs of ``member`` whose cells must be (re)computed, and the checkpoint to use."""
    ckpt = member.checkpoint(done) if done else None
    ckpt_rel = _relative(ckpt, matrix_dir) if ckpt else None
    step = int(done["global_step"]) if done else None
    todo = [e for e in evals if not is_current(cells.get((member.spec, e)), ckpt_rel, step, decoding)]
    return todo, ckpt


def _mark(cells: dict, member: Member, evals: Sequence[str], status: str, reason: str) -> None:
    for e in evals:
        cells[(member.spec, e)] = Cell(member.spec, e, status, reason=reason)


def _run_member(cfg: DictConfig, member: Member, manifest: str, result: MatrixResult,
                save: Callable[[], None]) -> None:
    """Bring one column of the matrix up to date: n/a cells, training if needed, decoding."""
    cells, evals, matrix_dir = result.cells, list(cfg.matrix.eval), result.matrix_dir
    for e in evals:  # n/a cells need no model
        attention, reason = eval_attention(e, member.shared_qk)
        if attention is None:
            cells[(member.spec, e)] = Cell(member.spec, e, NA, reason=reason)
    done = member.finished()
    decoding = decoding_label(decoding_of(member, cfg))
    todo, ckpt = _todo(member, cells, evals, done, matrix_dir, decoding)
    if todo and done is None:
        if not cfg.matrix.train_missing:
            _mark(cells, member, todo, MISSING,
                  f"no finished training in {member.run_dir} (matrix.train_missing=false); "
                  f"train it with: {member.command}")
            save()
            return
        try:
            done = train_member_model(member)
        except MatrixError:
            raise
        except Exception as err:
            log.exception("training %s failed", member.spec)
            _mark(cells, member, todo, FAILED,
                  f"training failed: {type(err).__name__}: {err}".replace("\n", " ")[:500])
            save()
            return
        result.trained.append(member.spec)
        todo, ckpt = _todo(member, cells, evals, done, matrix_dir, decoding)  # a resumed, finished run keeps its cells
    elif done is not None:
        member.check_saved_config()
    result.reused += [(member.spec, e) for e in evals if e not in todo]
    if not todo:
        log.info("%s: all %d cells current, nothing to decode", member.spec, len(evals))
        save()
        return
    log.info("%s: decoding %s with %s (%s)", member.spec, manifest, ", ".join(todo), ckpt)
    recogniser = load_checkpoint(ckpt, member)
    ckpt_rel, step = _relative(ckpt, matrix_dir), int(done["global_step"])
    for e in todo:
        start = time.perf_counter()
        cell = decode_cell(member, recogniser, e, manifest, cfg)
        cell.checkpoint, cell.train_step, cell.decoding = ckpt_rel, step, decoding
        cells[cell.key] = cell
        result.decoded.append(cell.key)
        save()
        log.info("  %s / %s: %s %s (%.1f s)", member.spec, e, cell.status, cell_text(cell),
                 time.perf_counter() - start)


# ----------------------------------------------------------------------------- outputs
def _description(cfg: DictConfig, manifest: str | None, cells: Cells) -> str:
    utts = {c.utterances for c in cells.values() if c.status == OK and c.utterances}
    where = f"`{manifest}`" if manifest else f"the {cfg.matrix.split} split"
    count = f" ({', '.join(str(u) for u in sorted(utts))} utterances)" if utts else ""
    return f"Matrix `{cfg.matrix.name}`: {cfg.matrix.split} split {where}{count}, {_decoder_text(cfg)}."


def _decoder_text(cfg: DictConfig) -> str:
    """How the cells were decoded, in words (for matrix.md)."""
    spec = OmegaConf.to_container(cfg.matrix.decoding, resolve=False) if cfg.matrix.get("decoding") else {}
    if spec.get("name", "greedy") == "greedy":
        return "greedy CTC decoding"
    lm_spec = spec.get("lm") or {}
    lm = f"`{lm_spec['path']}`" if lm_spec.get("path") else (
        "the model's own word LM" if lm_spec.get("source", "none") != "none" else None)
    return (f"CTC beam search (beam {spec.get('beam_size')}, lexicon {spec.get('lexicon', {}).get('source')}"
            + (f", LM {lm} weight {spec.get('lm_weight')}, word score {spec.get('word_score')}" if lm else ", no LM")
            + ")")


def _commands(invocation: Sequence[str], members: Sequence[Member]) -> list[str]:
    lines = ["# the whole matrix (trains what is missing, then decodes every pair):"]
    lines.append(" ".join(["fastasr-matrix", *(shlex.quote(o) for o in invocation)]))
    if members:
        lines.append("# or each model alone (a Hydra multirun of these is equivalent):")
        lines += [m.command for m in members]
    return lines


def write_outputs(
    cfg: DictConfig, result: MatrixResult, members: Sequence[Member], manifest: str | None,
    invocation: Sequence[str] = (),
) -> None:
    """matrix.md and matrix.png (matrix.csv is kept current while running)."""
    train, evals = list(cfg.matrix.train), list(cfg.matrix.eval)
    title = f"Approximation matrix `{cfg.matrix.name}`"
    write_markdown(
        result.matrix_dir / MD_FILE, result.cells, train, evals, title,
        _description(cfg, manifest, result.cells), _commands(invocation, members),
    )
    plot_heatmap(result.matrix_dir / PNG_FILE, result.cells, train, evals,
                 title=f"matrix {cfg.matrix.name}: {cfg.matrix.split} {metric_name(result.cells.values())}")


# ----------------------------------------------------------------------------- the matrix
def run_matrix(cfg: DictConfig, invocation: Sequence[str] = ()) -> MatrixResult:
    """Train what is missing, decode every pair not yet in matrix.csv, write the outputs.

    ``cfg`` is the composed ``cross_eval`` config. Members are composed from ``train.yaml``
    with Hydra's compose API, initialised here on the project's config directory when it is
    not already (it is under ``fastasr-matrix``). ``invocation``: the
    command-line overrides, recorded in matrix.md.
    """
    if not GlobalHydra.instance().is_initialized():
        with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return run_matrix(cfg, invocation)
    m = cfg.matrix
    train, evals = list(m.train), list(m.eval)
    check_spec_lists(train, evals)
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

    save()
    write_outputs(cfg, result, members, manifest, invocation)
    try:
        log_to_wandb(cfg, matrix_dir, cells)
    except Exception as err:  # the files are the record; a dashboard hiccup is not fatal
        log.warning("wandb logging of the matrix failed: %s: %s", type(err).__name__, err)
    summary = {"trained": result.trained, "decoded": len(result.decoded), "reused": len(result.reused),
               "failed": [f"{c.eval} on {c.train}" for c in result.failed]}
    (matrix_dir / "last_invocation.json").write_text(json.dumps(summary, indent=2) + "\n")
    log.info("matrix written to %s: %s", matrix_dir, summary)
    return result
