"""Running as one of several processes (DDP under Lightning's launcher, torchrun or SLURM).

Before the ``Trainer`` exists, a process learns whether it is global rank 0 from the
launcher's environment (``RANK`` from torchrun, ``SLURM_PROCID`` from srun, ``LOCAL_RANK``
and ``NODE_RANK`` from Lightning's own launcher), so that only rank 0 writes the run's files.

The module imports torch only in the functions that use ``torch.distributed``: ``train.py``
reads the launcher's environment (:func:`hydra_overrides_for_rank`) before torch loads, so
that Hydra refuses a mistyped override without the seconds of importing torch and Lightning.
"""

from __future__ import annotations

import atexit
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_RANK_VARIABLES = (
    "RANK",  # torchrun
    "LOCAL_RANK",  # Lightning's launcher (for the processes it starts), torchrun
    "NODE_RANK",  # Lightning on several nodes
    "GROUP_RANK",  # torchrun on several nodes
)


def is_rank_zero_process() -> bool:
    """Whether this process is global rank 0 — the one that writes the run's config, logs and
    checkpoints — judged from the launcher's environment (True when not launched as one of
    several processes)."""
    names = (*_RANK_VARIABLES, "SLURM_PROCID")  # srun: one task per rank
    return all(int(os.environ.get(name, "0")) == 0 for name in names)


def leave_process_group() -> None:
    """Destroy the default process group, if this process is in one (else nothing)."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


_LEAVE_AT_EXIT = False


def leave_process_group_at_exit() -> None:
    """Have this process leave its process group when the interpreter exits (registered once).

    Lightning's DDP strategy keeps the group alive after ``fit`` and ``test``, and torch does not
    destroy it at exit: gloo's worker threads then outlive the interpreter's teardown, and the
    process can abort with "terminate called without an active exception" (status -6) after its
    work is done (pytorch/pytorch#190489). An :mod:`atexit` handler runs while the interpreter
    is still whole, on a normal end and on ``SystemExit`` (the SIGTERM exit status) alike."""
    global _LEAVE_AT_EXIT
    if not _LEAVE_AT_EXIT:
        atexit.register(leave_process_group)
        _LEAVE_AT_EXIT = True


def hydra_overrides_for_rank(argv: list[str]) -> list[str]:
    """Hydra overrides to add to ``argv`` so that a rank > 0 writes nothing into the run
    directory: no ``.hydra/`` config copy, no ``<job>.log`` (its log goes to the console).
    Lightning's own launcher passes the first to the processes it starts; torchrun starts
    every rank with the same command line."""
    if is_rank_zero_process():
        return []
    wanted = {"hydra.output_subdir": "null", "hydra/job_logging": "stdout"}
    given = {arg.split("=", 1)[0].lstrip("+~") for arg in argv}
    return [f"{key}={value}" for key, value in wanted.items() if key not in given]


def loss_without_update(module: torch.nn.Module) -> torch.Tensor | None:
    """What a training step returns for a batch with nothing to learn from (every utterance
    skipped): None on one process (Lightning then skips backward and the update), and under
    DDP a zero that touches every trainable parameter, so this rank still joins the gradient
    all-reduce of the others (it contributes zero gradients)."""
    import torch

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1):
        return None
    return sum((p.sum() * 0.0 for p in module.parameters() if p.requires_grad),
               torch.zeros((), device=next(module.parameters()).device))


def gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (``[obj]`` outside torch.distributed). Collective:
    every rank must call it."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        out: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(out, obj)
        return out
    return [obj]


def average_gradients(parameters: list[torch.nn.Parameter], world_size: int, group: Any = None) -> None:
    """Average the gradients of ``parameters`` over the ``world_size`` processes of ``group``, in
    place, as DDP's reducer does: each scaled by 1 / ``world_size``, then summed by one
    all-reduce of them laid end to end a dtype (one collective, no host read). A parameter
    without a gradient contributes zeros and gets the average. Collective: every process must
    call it with the same parameters."""
    import torch

    by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
    for p in parameters:
        by_dtype.setdefault(p.grad.dtype if p.grad is not None else p.dtype, []).append(p)
    for members in by_dtype.values():
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in members]
        flat = torch.cat([g.reshape(-1) for g in grads]).mul_(1.0 / world_size)
        torch.distributed.all_reduce(flat, group=group)
        torch._foreach_copy_(grads, [part.view_as(g) for part, g in zip(flat.split([g.numel() for g in grads]), grads)])
        for p, g in zip(members, grads):
            if p.grad is None:
                p.grad = g
