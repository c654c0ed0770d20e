"""Checkpoint averaging: the element-wise mean of several checkpoints' weights (as NeMo,
icefall, ESPnet and SpeechBrain average the last or best N epochs before decoding).

Training keeps the weights of every epoch as ``checkpoints/epochNNN-scoreX.ckpt`` (the
``epoch_checkpoint`` callback; X is the validation unit error rate, lower is better; the
names are read by :meth:`fastasr.rundir.RunDir.epoch_checkpoints`), so
``python evaluate.py ckpt_path=... average.last=5`` (or ``average.best=5``) decodes the
average of the 5 newest (or best-scoring) epochs of the run ``ckpt_path`` belongs to, and
training with ``final_average`` ends by writing that average as ``checkpoints/averaged.ckpt``
(:func:`write_averaged_checkpoint`), which its test and final decoding then use.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from fastasr.rundir import RunDir

log = logging.getLogger(__name__)

MODEL_PREFIX = "model."  # the LightningModule's name for the CTCModel's weights


def _load_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The weights of a Lightning checkpoint (``state_dict``) or of a bare state dict
    (``torch.load(weights_only=True)``: tensors and plain data only)."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    state = ckpt.get("state_dict", ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: no state_dict of tensors; expected a Lightning checkpoint or a state dict")
    return state


def average_checkpoints(paths: Sequence[str | os.PathLike]) -> dict[str, torch.Tensor]:
    """Average the weights of ``paths``.

    Floating-point tensors are averaged (accumulated in float64, returned in their own
    dtype); integer and boolean tensors (counters, masks, buffers such as
    ``num_batches_tracked``) are taken from the last checkpoint. Every checkpoint must have
    the same keys and shapes.
    """
    if not paths:
        raise ValueError("average_checkpoints: no checkpoints given")
    last = _load_state_dict(paths[-1])
    sums = {k: v.to(torch.float64) for k, v in last.items() if v.is_floating_point()}
    for path in paths[:-1]:
        state = _load_state_dict(path)
        if state.keys() != last.keys():
            diff = sorted(set(state) ^ set(last))
            raise ValueError(f"{path} and {paths[-1]} hold different weights: {diff[:5]}")
        for k in sums:
            if state[k].shape != last[k].shape:
                raise ValueError(f"{path}: {k} has shape {tuple(state[k].shape)}; "
                                 f"{paths[-1]} has {tuple(last[k].shape)}")
            sums[k] += state[k].to(torch.float64)
    return {k: (sums[k] / len(paths)).to(v.dtype) if k in sums else v.clone() for k, v in last.items()}


def select_checkpoints(run_dir: RunDir, last: int | None = None, best: int | None = None) -> list[Path]:
    """The ``last`` newest or ``best`` lowest-scoring epoch checkpoints of ``run_dir``
    (exactly one of the two), oldest epoch first."""
    if (last is None) == (best is None):
        raise ValueError(f"average: give exactly one of last=N and best=N (got last={last}, best={best})")
    n = last if last is not None else best
    if n < 1:
        raise ValueError(f"average: N={n}; expected >= 1")
    found = run_dir.epoch_checkpoints()
    if len(found) < n:
        raise FileNotFoundError(
            f"average: {n} epoch checkpoints wanted, {len(found)} in {run_dir.checkpoints} (epochNNN-scoreX.ckpt, "
            "written by the epoch_checkpoint callback of conf/callbacks/default.yaml)")
    if last is not None:
        chosen = found[-n:]
    else:
        chosen = sorted(found, key=lambda f: (math.inf if math.isnan(f[1]) else f[1], -f[0]))[:n]
    return [p for _, _, p in sorted(chosen)]


def average_into(model: torch.nn.Module, ckpt_path: str | os.PathLike, last: int | None = None,
                 best: int | None = None) -> list[Path]:
    """Load into ``model`` (a recogniser's ``CTCModel``) the average of the ``last``/``best``
    N epoch checkpoints of the run ``ckpt_path`` lies in; nothing when both are None.
    Returns the averaged files."""
    if last is None and best is None:
        return []
    paths = select_checkpoints(RunDir.of_checkpoint(ckpt_path), last=last, best=best)
    state = average_checkpoints(paths)
    weights = {k.removeprefix(MODEL_PREFIX): v for k, v in state.items() if k.startswith(MODEL_PREFIX)}
    if not weights:
        raise ValueError(f"{paths[-1]}: no '{MODEL_PREFIX}*' weights; expected checkpoints written by fastasr training")
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as err:
        raise ValueError(f"the epoch checkpoints of {paths[-1].parent} do not fit the model of {ckpt_path}: "
                         f"{err}") from err
    log.info("averaged %d checkpoints: %s", len(paths), ", ".join(p.name for p in paths))
    return paths


AVERAGED_NAME = "averaged.ckpt"  # in a run's checkpoints/: never resumed from (RunDir.latest_checkpoint)


def write_averaged_checkpoint(template: str | os.PathLike, last: int | None = None,
                              best: int | None = None) -> tuple[Path, list[Path]] | None:
    """Write ``averaged.ckpt`` beside ``template`` (a checkpoint of the run, normally its best):
    the template with its weights replaced by the average of the run's ``last``/``best`` N epoch
    checkpoints, so it decodes, evaluates and transcribes like any checkpoint. Fewer epochs
    than N: all of them (logged). Returns ``(path, averaged files)``, or None when the run has
    no epoch checkpoints or neither N is given.
    """
    if last is None and best is None:
        return None
    run_dir = RunDir.of_checkpoint(template)
    available = len(run_dir.epoch_checkpoints())
    if available == 0:
        log.warning("final_average: no epoch checkpoints in %s; decoding %s as it is", run_dir.checkpoints, template)
        return None
    wanted = last if last is not None else best
    if available < wanted:
        log.info("final_average: %d epoch checkpoints wanted, %d written; averaging those", wanted, available)
    n = min(wanted, available)
    paths = select_checkpoints(run_dir, last=n if last is not None else None, best=n if best is not None else None)
    averaged = average_checkpoints(paths)
    ckpt = torch.load(template, map_location="cpu", weights_only=True)
    if ckpt["state_dict"].keys() != averaged.keys():
        raise ValueError(f"{template} and the epoch checkpoints {paths[-1].name} hold different weights")
    ckpt["state_dict"] = averaged
    out = Path(template).with_name(AVERAGED_NAME)
    tmp = out.with_suffix(".ckpt.tmp")
    torch.save(ckpt, tmp)
    os.replace(tmp, out)  # a kill never leaves a half-written averaged.ckpt
    log.info("final_average: %s = the mean of %s", out, ", ".join(p.name for p in paths))
    return out, paths
