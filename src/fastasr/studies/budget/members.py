"""The models of the budget study: one per (attention, depth), each a ``train.py`` run in its
own directory, composed and trained as :mod:`fastasr.studies.matrix.members` does for the matrix.

A member is ``python train.py experiment=<budget.experiment> member=<attention>
model.layers=<layers> trainer.max_time=<budget.max_time> trainer.max_epochs=-1
paths.run_dir=<budget_dir>/runs/<attention>-L<layers> ...`` (the exact line is in budget.md).
The default experiment, ``matrix_member_base``, is the matrix's: the attention and Q/K sharing
come from the member's spec (one rule, :mod:`fastasr.studies.matrix.rules`), ``recipe=builtin``, no
test pass. Everything else (sizes, optimiser, schedule, batches) is the same for every member:
``budget.overrides``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

import fastasr.config
from fastasr.rundir import RunDir
from fastasr.studies.budget.clock import TrainingClock
from fastasr.studies.matrix.members import Member, train_member_model
from fastasr.studies.matrix.rules import MatrixError, train_member
from fastasr.training.derived_config import resolve_train_config

CLOCK_CALLBACK = "training_clock"  # key of TrainingClock in a member's callbacks
_CLOCK_TARGET = f"{TrainingClock.__module__}.{TrainingClock.__qualname__}"


class BudgetError(MatrixError):
    """A budget study configuration that cannot be run as asked."""


def max_time_seconds(value: Any, where: str = "budget.max_time") -> float:
    """Seconds of a wall-clock budget (:func:`fastasr.config.max_time_seconds`); a bad one is a
    :class:`BudgetError`."""
    try:
        return fastasr.config.max_time_seconds(value, where)
    except ValueError as err:
        raise BudgetError(str(err)) from None


@dataclass(frozen=True)
class MemberSpec:
    """One member of the study: its attention spec, encoder depth and own extra overrides."""

    attention: str
    layers: int
    overrides: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The member's name and run directory: ``<attention>-L<layers>`` (``i-clustered-100-L4``)."""
        return f"{self.attention}-L{self.layers}"


def member_specs(members: Sequence[Any]) -> list[MemberSpec]:
    """The members of ``budget.members`` (mappings ``{attention, layers[, overrides]}``),
    checked: a valid attention spec, a depth ≥ 1, no member twice."""
    if not members:
        raise BudgetError("budget.members is empty; expected e.g. [{attention: full, layers: 2}, ...]")
    specs: list[MemberSpec] = []
    for i, entry in enumerate(members):
        entry = OmegaConf.to_container(entry, resolve=True) if isinstance(entry, DictConfig) else entry
        if not isinstance(entry, Mapping) or "attention" not in entry or "layers" not in entry:
            raise BudgetError(f"budget.members[{i}]: {entry!r}; expected {{attention: <spec>, layers: <depth>}}")
        unknown = set(entry) - {"attention", "layers", "overrides"}
        if unknown:
            raise BudgetError(f"budget.members[{i}]: unknown key(s) {sorted(unknown)}; "
                              "expected attention, layers and optionally overrides")
        try:
            train_member(str(entry["attention"]))
        except ValueError as err:
            raise BudgetError(f"budget.members[{i}]: {err}") from None
        layers = entry["layers"]
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise BudgetError(f"budget.members[{i}]: layers {layers!r}; expected an integer ≥ 1")
        specs.append(MemberSpec(str(entry["attention"]), layers, tuple(str(o) for o in entry.get("overrides") or ())))
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BudgetError(f"budget.members lists {', '.join(twice)} twice")
    return specs


@dataclass
class BudgetMember(Member):
    """A :class:`~fastasr.studies.matrix.members.Member` trained to a wall-clock budget: ``spec`` is
    the member's name (``full-L2``), ``layers`` its depth, ``max_time_s`` its budget."""

    layers: int = 0
    max_time_s: float = 0.0

    def trained_budget_s(self) -> float | None:
        """The ``trainer.max_time`` (s) the run directory was last trained with (its config.yaml)."""
        saved = RunDir(self.run_dir).config_file
        if not saved.is_file():
            return None
        value = OmegaConf.select(OmegaConf.load(saved), "trainer.max_time", default=None)
        try:
            return None if value is None else max_time_seconds(
                OmegaConf.to_container(value) if isinstance(value, DictConfig) else value)
        except BudgetError:
            return None

    def finished(self) -> dict[str, Any] | None:
        """The ``fit_done.json`` record when training is complete for this budget; None when it
        is not (no record, or the run was trained for a smaller budget: it continues)."""
        done = super().finished()
        if done is None:
            return None
        trained = self.trained_budget_s()
        if trained is not None and trained + 1e-6 < self.max_time_s:
            return None
        return done

    def check_saved_config(self) -> None:
        """Refuse a run directory trained with another model config (the matrix's rule)."""
        try:
            super().check_saved_config()
        except MatrixError as err:
            raise BudgetError(f"{err} (for the budget study: give it another budget.name)") from None


def member_overrides(cfg: DictConfig, spec: MemberSpec) -> list[str]:
    """The train.py overrides of one member (``cfg``: the composed ``budget`` config)."""
    b = cfg.budget
    run_dir = Path(cfg.budget_dir) / "runs" / spec.name
    overrides = [
        f"experiment={b.experiment}",
        f"member={spec.attention}",
        f"name=budget-{b.name}-{spec.name}",
        f"paths.output_dir={cfg.paths.output_dir}",
        f"paths.run_dir={run_dir}",
    ]
    if b.get("data"):
        overrides.append(f"data={b.data}")
    overrides += [
        f"model.layers={spec.layers}",
        f"trainer.max_time={b.max_time}",
        "trainer.max_epochs=-1",
        f"test={'true' if b.get('test') else 'false'}",  # the best checkpoint's test error (greedy), or none
        "final_decoding=null",
        f"++callbacks.{CLOCK_CALLBACK}._target_={_CLOCK_TARGET}",
        f"++logger.wandb.group=budget-{b.name}",
    ]
    overrides += [str(o) for o in (b.get("overrides") or [])]
    overrides += list(spec.overrides)
    overrides += [str(o) for o in (b.get("extra_overrides") or [])]
    return overrides


def compose_budget_member(cfg: DictConfig, spec: MemberSpec) -> BudgetMember:
    """Compose train.yaml for one member with Hydra (what ``python train.py <overrides>`` sees).
    Hydra must be initialised with the project's config directory. Raises :class:`BudgetError`
    when the composed run would not be the member asked for (attention, depth, budget, clock)."""
    attention, shared_qk = train_member(spec.attention)
    overrides = member_overrides(cfg, spec)
    composed = resolve_train_config(hydra.compose(config_name="train", overrides=overrides))
    wanted_s = max_time_seconds(cfg.budget.max_time)
    problems = []
    if str(composed.model.get("attention")) != attention:
        problems.append(f"model.attention={composed.model.get('attention')}, expected {attention} "
                        "(budget.experiment must leave attention to the member's spec: matrix_member_base)")
    if bool(composed.model.get("shared_qk")) != shared_qk:
        problems.append(f"model.shared_qk={composed.model.get('shared_qk')}, expected {shared_qk}")
    if int(composed.model.layers) != spec.layers:
        problems.append(f"model.layers={composed.model.layers}, expected {spec.layers} (set by an override?)")
    trained_for = composed.trainer.get("max_time")
    if trained_for is None or max_time_seconds(trained_for, "trainer.max_time") != wanted_s:
        problems.append(f"trainer.max_time={trained_for}, expected budget.max_time={cfg.budget.max_time}")
    if problems:
        raise BudgetError(f"member {spec.name}: " + "; ".join(problems))
    run_dir = Path(composed.paths.run_dir)
    return BudgetMember(spec.name, attention, shared_qk, overrides, composed, run_dir,
                        layers=spec.layers, max_time_s=wanted_s)


def train_budget_member(member: BudgetMember) -> dict[str, Any]:
    """Train (or resume, ``ckpt_path=auto``: the Timer's spent time comes back with the
    checkpoint, so the run gets what is left of its budget) one member; returns its
    ``fit_done.json`` record (:func:`fastasr.studies.matrix.members.train_member_model`)."""
    return train_member_model(member)  # which refuses a run directory of another model config first
