"""Running the study: train (or resume) what is not finished, time each model's forward pass,
read every curve back, write budget.csv, budget_curves.csv, budget.md, the figures and the
wandb table.

Resumable like the matrix (:mod:`fastasr.studies.matrix.running`): a member whose run directory holds
``fit_done.json`` for this budget is reused; one without it is trained with ``ckpt_path=auto``,
so an interrupted run resumes from its last checkpoint with what is left of its budget
(Lightning's Timer travels in the checkpoint); a member whose training failed is retried on
the next invocation. A forward timing is kept while the checkpoint it timed is unchanged.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from fastasr.config import CONFIG_DIR
from fastasr.data.tokenizer import unit_metric
from fastasr.studies.budget.curves import (
    CurvePoint,
    best_point,
    later_epoch_seconds,
    logged_values,
    read_curve,
)
from fastasr.studies.budget.forward import measure_member
from fastasr.studies.budget.members import (
    BudgetError,
    BudgetMember,
    compose_budget_member,
    max_time_seconds,
    member_specs,
    train_budget_member,
)
from fastasr.studies.budget.render import markdown, plot_forward, plot_time
from fastasr.studies.budget.table import (
    CSV_COLUMNS,
    CSV_FILE,
    CURVES_FILE,
    FAILED,
    FORWARD_PNG,
    MD_FILE,
    MISSING,
    OK,
    TIME_PNG,
    BudgetRow,
    mark_pareto,
    mark_time_to_target,
    read_rows,
    write_curves,
    write_rows,
)
from fastasr.studies.matrix.dashboard import log_study
from fastasr.studies.matrix.rules import MatrixError

log = logging.getLogger(__name__)


@dataclass
class BudgetResult:
    """What :func:`run_budget` did: the directory, the rows and curves, and which work it did."""

    budget_dir: Path
    rows: dict[str, BudgetRow] = field(default_factory=dict)
    curves: dict[str, list[CurvePoint]] = field(default_factory=dict)
    trained: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    timed: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[BudgetRow]:
        return [r for r in self.rows.values() if r.status == FAILED]


def _relative(path: Path, base: Path) -> str:
    try:
        return os.path.relpath(path, base)
    except ValueError:  # another drive (Windows)
        return str(path)


def _reason(prefix: str, err: BaseException) -> str:
    return f"{prefix}{type(err).__name__}: {err}".replace("\n", " ")[:500]


def _fill_from_logs(row: BudgetRow, curve: list[CurvePoint], done: dict, run_dir: Path) -> None:
    """The row's curve figures, and its peak memory and test error from the run's CSV logs."""
    best = best_point(curve)
    last = curve[-1] if curve else None
    row.best_dev = best.dev if best else None
    row.best_at_seconds = best.train_seconds if best else None
    row.final_dev = last.dev if last else None
    row.train_seconds = last.train_seconds if last else None
    row.epochs = last.epochs if last else None
    row.updates = int(done.get("global_step", last.updates if last else 0))
    row.seconds_per_epoch = (row.train_seconds / row.epochs) if last and last.epochs > 0 else None
    row.seconds_per_later_epoch = later_epoch_seconds(curve)
    peaks = logged_values(run_dir, "perf/peak_memory_mb")
    row.peak_memory_mb = max(peaks) if peaks else None
    tests = logged_values(run_dir, f"test/{row.metric}")
    row.test = tests[-1] if tests else None


def _timing_current(previous: BudgetRow | None, ckpt_rel: str, step: int, cfg: DictConfig) -> bool:
    f = cfg.budget.forward
    return (previous is not None and previous.status == OK and previous.forward_seconds is not None
            and previous.checkpoint == ckpt_rel and previous.train_step == step
            and previous.forward_split == f.split and previous.forward_repeats == int(f.repeats))


def _run_member(cfg: DictConfig, member: BudgetMember, previous: BudgetRow | None, result: BudgetResult) -> BudgetRow:
    """Bring one member up to date: train or resume it if needed, time its forward pass if
    not timed yet, read its curve."""
    metric = unit_metric(str(member.cfg.data.tokenizer))
    row = BudgetRow(member.spec, member.attention, member.layers, metric=metric)
    done = member.finished()
    if done is None:
        if not cfg.budget.train_missing:
            row.status, row.reason = MISSING, (f"no finished training in {member.run_dir} "
                                               f"(budget.train_missing=false); train it with: {member.command}")
            return row
        try:
            done = train_budget_member(member)
        except MatrixError:  # a wrong configuration: stop, naming it
            raise
        except Exception as err:  # one broken member must not stop the study; the next invocation retries it
            log.exception("training %s failed", member.spec)
            row.status, row.reason = FAILED, _reason("training failed: ", err)
            result.curves[member.spec] = read_curve(member.run_dir, metric)
            return row
        result.trained.append(member.spec)
    else:
        member.check_saved_config()
        result.reused.append(member.spec)
        log.info("%s: finished for this budget in %s; reused", member.spec, member.run_dir)

    curve = read_curve(member.run_dir, metric)
    result.curves[member.spec] = curve
    _fill_from_logs(row, curve, done, member.run_dir)
    ckpt = member.checkpoint(done)
    row.checkpoint, row.train_step = _relative(ckpt, Path(cfg.budget_dir)), int(done["global_step"])
    f = cfg.budget.forward
    if _timing_current(previous, row.checkpoint, row.train_step, cfg):
        for key in ("forward_seconds", "forward_seconds_epoch", "forward_split", "forward_utterances",
                    "forward_frames", "forward_repeats", "parameters"):
            setattr(row, key, getattr(previous, key))
        row.status = OK
        return row
    log.info("%s: timing the forward pass over the %s split (%d passes) with %s", member.spec, f.split,
             int(f.repeats), ckpt)
    try:
        timed, parameters = measure_member(
            str(ckpt), OmegaConf.to_container(member.cfg.data, resolve=True), split=str(f.split),
            repeats=int(f.repeats), accelerator=str(cfg.budget.accelerator), seed=int(cfg.seed))
    except Exception as err:
        log.exception("forward timing of %s failed", member.spec)
        row.status, row.reason = FAILED, _reason("forward timing failed: ", err)
        return row
    result.timed.append(member.spec)
    row.forward_seconds, row.forward_seconds_epoch = timed.seconds, timed.epoch_seconds
    row.forward_split, row.forward_utterances, row.forward_frames = str(f.split), timed.utterances, timed.frames
    row.forward_repeats, row.parameters = int(f.repeats), parameters
    row.status = OK
    log.info("%s: forward %.2f s over %d %s utterances (passes %s) → %.1f s per training epoch",
             member.spec, timed.seconds, timed.utterances, f.split,
             ", ".join(f"{p:.2f}" for p in timed.passes), timed.epoch_seconds)
    return row


# ----------------------------------------------------------------------------- outputs
def _notes(cfg: DictConfig, members: Sequence[BudgetMember], target: float | None = None) -> list[str]:
    b = cfg.budget
    data = members[0].cfg.data if members else None
    f = b.forward
    timed = ("the training split itself" if f.split == "train" else
             f"the {f.split} split, scaled to the training set by audio duration (train audio / timed audio)")
    notes = [
        f"Budget: each member trains until `trainer.max_time={b.max_time}` of wall-clock time (Lightning's "
        "Timer: training, validation and checkpoints inside `fit`; a resumed run keeps the time it had spent) "
        "or its epoch ends; the validation at the stop is included.",
        "Curve (budget_time.png, budget_curves.csv): the dev error at every validation against the Timer's "
        "training time then (`budget/train_seconds`, logged by `fastasr.studies.budget.clock.TrainingClock`).",
        "best dev: the lowest dev error of the curve; final dev: the last. updates: optimiser steps; epochs: "
        "passes over the training set, fractional; s / epoch: training time / epochs (validation included), "
        "with its ratio to the full-attention member of the same depth where there is one; after the first: "
        "the same from the validation that ends the first epoch to the last (the first epoch's start-up left "
        "out: data loading's first batches, a GPU's kernels compiled), where half an epoch or more followed it.",
        f"forward s / epoch (budget_forward.png, the paper's Figure 1 x-axis): after training, the model of the "
        f"best checkpoint runs over every batch of {timed} in eval mode without gradients, features computed "
        f"beforehand; the fastest of {int(f.repeats)} passes counts. Device: `budget.accelerator={b.accelerator}`.",
        "Pareto: no other member is at least as fast (forward per epoch) and at least as accurate (best dev), "
        "better in one.",
        "peak memory: the largest `perf/peak_memory_mb` the run logged (the training process's peak RSS on a "
        "CPU, the CUDA allocator's peak on a GPU; reset when each member's training starts, so that members "
        "trained in one process each report their own); test: the test error of the best checkpoint (members run "
        "with `test=true`; — otherwise).",
        "time to target: training time of the first validation at or below the common target, the highest of "
        "the members' best dev errors (the lowest error every member reached)"
        + (f": {target:.2f} %." if target is not None else "; none yet."),
    ]
    if data is not None:
        notes.append(f"Data: `{data.train_manifest}` (train), `{data.dev_manifest}` (dev); batches of at most "
                     f"{data.max_frames_per_batch} frames priced `{data.length_cost}`ly.")
    return notes


def _commands(invocation: Sequence[str], members: Sequence[BudgetMember]) -> list[str]:
    lines = ["# the whole study (trains or resumes what is not finished, then times and plots):"]
    lines.append(" ".join(["python -m fastasr.cli.budget", *(shlex.quote(o) for o in invocation)]))
    if members:
        lines.append("# or each member alone (then rerun the line above to time and plot them):")
        lines += [m.command for m in members]
    return lines


def write_outputs(cfg: DictConfig, result: BudgetResult, members: Sequence[BudgetMember],
                  invocation: Sequence[str] = ()) -> None:
    """budget.csv, budget_curves.csv, budget.md, budget_time.png, budget_forward.png."""
    d = result.budget_dir
    rows = list(result.rows.values())
    front = mark_pareto(rows)
    target = mark_time_to_target(rows, result.curves)
    write_rows(d / CSV_FILE, rows)
    write_curves(d / CURVES_FILE, rows, result.curves)
    b = cfg.budget
    budget_s = max_time_seconds(b.max_time)
    data = f"`data={b.data}`" if b.get("data") else "the experiment's data"
    description = (f"Budget study `{b.name}`: {len(rows)} models on {data}, each trained for "
                   f"{b.max_time} (DD:HH:MM:SS) of wall-clock time, dev error against training time "
                   f"and against forward time per epoch (Figure 1 of Vyas et al. 2020).")
    title = f"Accuracy for a compute budget: `{b.name}`"
    (d / MD_FILE).write_text(markdown(rows, front, title, description, _notes(cfg, members, target),
                                      _commands(invocation, members)))
    plot_time(d / TIME_PNG, rows, result.curves, budget_s, title=f"budget {b.name}: dev error against training time")
    plot_forward(d / FORWARD_PNG, rows, front, title=f"budget {b.name}: best dev error against forward time per epoch")


def log_to_wandb(cfg: DictConfig, result: BudgetResult) -> Path | None:
    """The study as one wandb run (``budget.wandb`` mode): budget.csv as the table
    ``budget/table``, both figures, each member's best dev error in the summary."""
    b = cfg.budget
    rows = list(result.rows.values())
    return log_study(
        b.get("wandb"), project=b.get("wandb_project", "fastasr"), name=f"budget-{b.name}", job_type="budget",
        run_root=result.budget_dir, config={"budget": OmegaConf.to_container(b, resolve=True)},
        table_key="budget/table", columns=CSV_COLUMNS, rows=[[r.to_row()[k] for k in CSV_COLUMNS] for r in rows],
        images={"budget/time": result.budget_dir / TIME_PNG, "budget/forward": result.budget_dir / FORWARD_PNG},
        summary={f"budget/{r.member}/best_dev": r.best_dev for r in rows if r.best_dev is not None},
    )


# ----------------------------------------------------------------------------- the study
def run_budget(cfg: DictConfig, invocation: Sequence[str] = ()) -> BudgetResult:
    """Train or resume every member not finished for this budget, time the forward passes not
    timed yet, write the outputs. ``cfg``: the composed ``budget`` config (conf/budget.yaml).
    Members are composed from train.yaml with Hydra's compose API, initialised here on the
    project's config directory when it is not already. ``invocation``: the command-line
    overrides, recorded in budget.md."""
    if not GlobalHydra.instance().is_initialized():
        with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return run_budget(cfg, invocation)
    b = cfg.budget
    if not isinstance(b.max_time, str):
        raise BudgetError(f"budget.max_time: {b.max_time!r}; expected a string \"DD:HH:MM:SS\"")
    max_time_seconds(b.max_time)
    specs = member_specs(b.members)
    budget_dir = Path(cfg.budget_dir)
    budget_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, budget_dir / "budget.yaml", resolve=True)
    previous = read_rows(budget_dir / CSV_FILE)
    members = [compose_budget_member(cfg, s) for s in specs]
    result = BudgetResult(budget_dir)
    for member in members:
        result.rows[member.spec] = _run_member(cfg, member, previous.get(member.spec), result)
        # after every member, keeping the rows not redone yet: a kill loses no finished timing
        write_rows(budget_dir / CSV_FILE, [*result.rows.values(),
                                           *(r for m, r in previous.items() if m not in result.rows)])
    write_rows(budget_dir / CSV_FILE, result.rows.values())
    write_outputs(cfg, result, members, invocation)
    try:
        log_to_wandb(cfg, result)
    except Exception as err:  # the files are the record; a dashboard hiccup is not fatal
        log.warning("wandb logging of the budget study failed: %s: %s", type(err).__name__, err)
    summary = {"trained": result.trained, "reused": result.reused, "timed": result.timed,
               "failed": [r.member for r in result.failed]}
    (budget_dir / "last_invocation.json").write_text(json.dumps(summary, indent=2) + "\n")
    log.info("budget study written to %s: %s", budget_dir, summary)
    return result
