"""Crash-safe checkpoint files: written to a temporary file beside the target, synced, then
renamed over it (``os.replace``), so a checkpoint name only ever holds a complete checkpoint
and the previous one stays in place until the new one is.

Why not Lightning's own ``TorchCheckpointIO`` (2.6)? It serialises to memory and writes
through an fsspec transaction whose local temporary file is made by ``tempfile.mkstemp()`` in
the *system* temporary directory and moved into place with ``shutil.move``. When that
directory is on another filesystem than the run (a node-local ``/tmp``, the run on shared
storage: the usual cluster layout) the move is a copy, and a kill during the copy leaves a
truncated file under the checkpoint's name; a kill during the write leaves a checkpoint-sized
file in ``/tmp``; nothing is fsynced.
"""

from __future__ import annotations

import io
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

log = logging.getLogger(__name__)

#: Test hook: ``"<global step>:<seconds>"`` makes every save of a checkpoint at or after that
#: step stop for that long half-way through writing its temporary file (to kill it there).
STALL_ENV = "FASTASR_TEST_CHECKPOINT_STALL"


def _temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot sync a directory; the rename itself is still atomic
    finally:
        os.close(fd)


def _stall(checkpoint: dict[str, Any]) -> float:
    spec = os.environ.get(STALL_ENV)
    if not spec:
        return 0.0
    step, seconds = spec.split(":")
    return float(seconds) if int(checkpoint.get("global_step", 0)) >= int(step) else 0.0


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves are atomic: ``.<name>.tmp-<pid>`` in the same
    directory, flushed and fsynced, then ``os.replace`` onto ``<name>`` and the directory
    fsynced. Temporary files of an earlier, killed save of the same name are removed first.
    Remote paths (``s3://`` …) fall back to Lightning's own save. Loading is Lightning's."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(f".{path.name}.tmp-*"):
            stale.unlink(missing_ok=True)  # left by a killed save (only global rank 0 saves)
        tmp = _temporary_name(path)
        try:
            with open(tmp, "wb") as f:
                stall = _stall(checkpoint)
                if stall:
                    buffer = io.BytesIO()
                    torch.save(checkpoint, buffer)
                    data = buffer.getvalue()
                    f.write(data[: len(data) // 2])
                    f.flush()
                    log.warning("%s: stalling %.0f s half-way through writing %s", STALL_ENV, stall, tmp)
                    time.sleep(stall)
                    f.write(data[len(data) // 2:])
                else:
                    torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_directory(path.parent)


def portable_optimizer_state(state: dict[str, Any]) -> None:
    """An optimiser's ``state_dict`` as a captured step's run saves it, made loadable by any run,
    in place: ``capturable`` off, each group's learning rate a float and the step counts on the
    host, as an eager optimiser keeps them. A captured run (``capture_steps``) makes them
    capturable again when it starts (``captured_step.make_capturable``); without this a run
    resumed eagerly, or on a CPU, would load a capturable optimiser whose steps refuse host
    tensors. Reads each device value back once (a save, not a step)."""
    for group in state.get("param_groups", []):
        if group.get("capturable"):
            group["capturable"] = False
        if isinstance(group.get("lr"), torch.Tensor):
            group["lr"] = float(group["lr"])
    for values in state.get("state", {}).values():
        step = values.get("step") if isinstance(values, dict) else None
        if isinstance(step, torch.Tensor) and step.device.type != "cpu":
            values["step"] = step.detach().to("cpu", torch.float32)
