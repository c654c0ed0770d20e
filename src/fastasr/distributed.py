"""Running as one of several processes (DDP under Lightning's launcher, torchrun or SLURM).

Before the ``Trainer`` exists, a process learns whether it is global rank 0 from the
launcher's environment (``RANK`` from torchrun, ``SLURM_PROCID`` from srun, ``LOCAL_RANK``
and ``NODE_RANK`` from Lightning's own launcher), so that only rank 0 writes the run's files.
"""

from __future__ import annotations

import os
from typing import Any

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
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1):
        return None
    return sum((p.sum() * 0.0 for p in module.parameters() if p.requires_grad),
               torch.zeros((), device=next(module.parameters()).device))


def gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (``[obj]`` outside torch.distributed). Collective:
    every rank must call it."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        out: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(out, obj)
        return out
    return [obj]
