"""Helpers of the tests that run ``train.py`` as a subprocess (DDP, kill-and-resume, refusals).

``RunProbe`` is a Lightning callback the subprocess tests (DDP, kill-and-resume) add to ``train.py`` runs with
``+callbacks.probe._target_=run_probe.RunProbe +callbacks.probe.out=DIR`` (``tests/`` on
PYTHONPATH). It writes what each rank saw to ``DIR/rank<r>.jsonl``, one flushed JSON line per
event, so a killed process leaves its record:

    {"event": "start", "global_step", "epoch", "optimizer": DIR/..pt, "wandb_id", ...}   at on_train_start
    {"event": "batch", "epoch", "batch_idx", "global_step", "ids"}                     each training batch
    {"event": "weights", "global_step", "sha256"}                                     after step 1
    {"event": "val_counts", "unit_edits", "unit_total", ...}                          local counts, each val batch
    {"event": "val_end", "metrics"}                                                   logged val metrics
    {"event": "save", "path", "global_step"}                                          a checkpoint write (this rank)

``kill_at``: in the n-th run of the command (counted by the start records already written), the
process sends itself SIGKILL at the end of training step ``kill_at[n - 1]`` — before that step's
checkpoint is written (Lightning runs ModelCheckpoint after the other callbacks).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sys
from pathlib import Path

import lightning as L
import torch


class RunProbe(L.Callback):
    def __init__(self, out: str, kill_at: list[int] | None = None) -> None:
        super().__init__()
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.kill_at = list(kill_at or [])
        self._file = None
        self._run = 0

    def _write(self, trainer: L.Trainer, **record) -> None:
        if self._file is None:
            self._file = open(self.out / f"rank{trainer.global_rank}.jsonl", "a", buffering=1)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def setup(self, trainer, pl_module, stage) -> None:
        if stage != "fit":
            return
        io = trainer.strategy.checkpoint_io
        save = io.save_checkpoint

        def recording_save(checkpoint, path, storage_options=None):
            self._write(trainer, event="save", path=str(path), global_step=int(checkpoint["global_step"]))
            return save(checkpoint, path, storage_options)

        io.save_checkpoint = recording_save

    def on_train_start(self, trainer, pl_module) -> None:
        previous = [ln for ln in (self.out / f"rank{trainer.global_rank}.jsonl").read_text().splitlines()
                    if '"event": "start"' in ln] if (self.out / f"rank{trainer.global_rank}.jsonl").exists() else []
        self._run = len(previous) + 1
        opt_file = self.out / f"optimizer-run{self._run}-rank{trainer.global_rank}.pt"
        torch.save({"optimizer": trainer.optimizers[0].state_dict(),
                    "scheduler": trainer.lr_scheduler_configs[0].scheduler.state_dict()
                    if trainer.lr_scheduler_configs else None}, opt_file)
        wandb_id = None
        for logger in trainer.loggers:
            if type(logger).__name__ == "WandbLogger" and trainer.is_global_zero:
                wandb_id = logger.experiment.id
        sampler = trainer.train_dataloader.batch_sampler if trainer.train_dataloader is not None else None
        self._write(trainer, event="start", run=self._run, global_step=trainer.global_step,
                    epoch=trainer.current_epoch, optimizer=str(opt_file), wandb_id=wandb_id,
                    sampler_epoch=getattr(sampler, "epoch", None),
                    kept_train_ids=[u.id for u in trainer.datamodule.datasets["train"].utterances])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._write(trainer, event="batch", epoch=trainer.current_epoch, batch_idx=batch_idx,
                    global_step=trainer.global_step, ids=list(batch["ids"]))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == 1 and not getattr(self, "_weights_written", False):
            self._weights_written = True
            h = hashlib.sha256()
            for name, p in sorted(pl_module.state_dict().items()):
                h.update(name.encode())
                h.update(p.detach().cpu().contiguous().numpy().tobytes())
            self._write(trainer, event="weights", global_step=trainer.global_step, sha256=h.hexdigest())
        if self._run <= len(self.kill_at) and trainer.global_step == self.kill_at[self._run - 1]:
            self._write(trainer, event="kill", global_step=trainer.global_step)
            os.kill(os.getpid(), signal.SIGKILL)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        rates = pl_module._rates.get("val")
        if rates is not None and not trainer.sanity_checking:
            self._write(trainer, event="val_counts", unit_edits=rates.unit_edits, unit_total=rates.unit_total,
                        word_edits=rates.word_edits, word_total=rates.word_total, utterances=rates.utterances)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._write(trainer, event="val_end", metrics={k: float(v) for k, v in trainer.callback_metrics.items()
                                                           if k.startswith("val/")})


def read_records(out: Path, rank: int = 0) -> list[dict]:
    """The records a probe wrote for ``rank`` (every run of the command, in order)."""
    path = Path(out) / f"rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


TESTS = Path(__file__).resolve().parent
PROJECT_ROOT = TESTS.parent
TINY_MODEL = ["model.layers=1", "model.d_model=32", "model.heads=2", "model.ff_dim=64"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_env(**extra: str) -> dict[str, str]:
    """The environment of a ``train.py`` subprocess: this checkout's code and ``tests/`` (for the
    probe) on PYTHONPATH, one thread, a free rendezvous port, wandb offline under ``extra``."""
    paths = [str(PROJECT_ROOT / "src"), str(TESTS), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p), OMP_NUM_THREADS="1",
                PYTHONUNBUFFERED="1", MASTER_PORT=str(free_port()), **extra)


def imported_modules(stderr: str) -> set[str]:
    """The modules that ``python -X importtime`` reports on ``stderr``, top-level packages included."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def train_command(corpus: Path, out: Path, probe: Path, *overrides: str) -> list[str]:
    """``python train.py`` on the tiny corpus and model with the probe writing to ``probe``."""
    return [
        sys.executable, str(PROJECT_ROOT / "train.py"),
        "data=manifest", "recipe=builtin", "data.augment.speed_perturb=false",
        f"data.train_manifest={corpus / 'train.jsonl'}", f"data.dev_manifest={corpus / 'dev.jsonl'}", f"data.test_manifest={corpus / 'test.jsonl'}",
        "data.num_workers=0", f"data.cache.dir={corpus / 'feature_cache'}", "model.subsampling=2", *TINY_MODEL,
        "logger=csv", f"paths.output_dir={out}", "trainer.enable_progress_bar=false",
        "+callbacks.probe._target_=run_probe.RunProbe", f"+callbacks.probe.out={probe}", *overrides,
    ]
