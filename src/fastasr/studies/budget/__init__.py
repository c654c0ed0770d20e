"""The budget study (Figure 1 of Vyas et al. 2020): which attention and depth give the best
dev error for a given compute budget.

    python -m fastasr.cli.budget [budget=default|smoke] [overrides]        (make budget)

Each *member* — an attention spec at an encoder depth, e.g. full at 2, 4 and 6 layers,
i-clustered-100/200 at 4 and 6, clustered-100 at 6 — is a ``train.py`` run in
``${paths.output_dir}/budget/<name>/runs/<attention>-L<layers>/`` that trains to one fixed
wall-clock budget (``trainer.max_time``; everything else the same for every member). After
training, each model's forward pass is timed. The study directory receives ``budget.csv``
(one row per member), ``budget_curves.csv`` (every validation), ``budget.md``,
``budget_time.png`` (dev error against training time), ``budget_forward.png`` (best dev error
against forward time per epoch, the paper's axes, Pareto front marked) and a wandb table.
Finished runs are reused, interrupted ones resume with what is left of their budget, failed
ones are retried (docs/BUDGET.md).

Modules: :mod:`~fastasr.studies.budget.members` (members, composing, training; reuses
:mod:`fastasr.studies.matrix.members`), :mod:`~fastasr.studies.budget.clock` (the training-time callback),
:mod:`~fastasr.studies.budget.curves` (curves from the CSV logs), :mod:`~fastasr.studies.budget.forward`
(forward timing), :mod:`~fastasr.studies.budget.table` (budget.csv, Pareto front),
:mod:`~fastasr.studies.budget.render` (Markdown, figures), :mod:`~fastasr.studies.budget.running` (the run
loop); the command is :mod:`fastasr.cli.budget`.
"""

from fastasr.studies.budget.clock import TrainingClock
from fastasr.studies.budget.curves import CurvePoint, best_point, read_curve
from fastasr.studies.budget.members import (
    BudgetError,
    BudgetMember,
    MemberSpec,
    compose_budget_member,
    max_time_seconds,
    member_specs,
)
from fastasr.studies.budget.running import BudgetResult, run_budget
from fastasr.studies.budget.table import (
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
    read_rows,
)

__all__ = [
    "CSV_FILE", "CURVES_FILE", "FAILED", "FORWARD_PNG", "MD_FILE", "MISSING", "OK", "TIME_PNG",
    "BudgetError", "BudgetMember", "BudgetResult", "BudgetRow", "CurvePoint", "MemberSpec", "TrainingClock",
    "best_point", "compose_budget_member", "mark_pareto", "max_time_seconds", "member_specs", "read_curve",
    "read_rows", "run_budget",
]
