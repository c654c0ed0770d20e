"""Count and report the utterances skipped for unusable audio (``batch["skipped"]``).

DataLoader workers are separate processes, so a worker cannot report what it skipped; the
batch carries it (``fastasr.data.bad_audio``). This callback, in the main process of every
rank, collects those records from training, validation and test batches; warns once per file;
stops the run when a whole epoch (or a whole dev/test pass) had nothing usable; and at the end
of ``fit``/``test`` logs one summary naming every skipped file and reason, gathered over all
ranks, and writes it to ``<run dir>/bad_audio.json``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch

from fastasr.data.bad_audio import (
    SkippedUtterance,
    all_bad_error,
    describe_skipped,
    refused,
    skipped_in,
)
from fastasr.distributed import gather_objects

log = logging.getLogger(__name__)


class BadAudioReport(L.Callback):
    """Collects :class:`~fastasr.data.bad_audio.SkippedUtterance` records from the batches.

    Args:
        summary_file: file name (in the trainer's ``default_root_dir``) of the JSON summary
            ``{"skipped": [{"id", "path", "reason", "stage"}, ...]}``; None: log only.

    With ``data.on_bad_utterance=raise`` (the datamodule's ``on_bad_utterance``) the first
    skipped utterance stops the run instead. ``skipped`` (id → record) survives a resume
    (it is in the checkpoint), so the final summary also names files skipped before it.
    """

    def __init__(self, summary_file: str | None = "bad_audio.json") -> None:
        super().__init__()
        self.summary_file = summary_file
        self.skipped: dict[str, dict[str, str]] = {}
        self._counts: dict[str, list[int]] = {}  # stage -> [utterances seen, skipped] this epoch

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"skipped": dict(self.skipped)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped.update(state_dict.get("skipped", {}))

    # ------------------------------------------------------------------ collecting
    def _collect(self, trainer: L.Trainer, stage: str, batch: Any) -> None:
        if not isinstance(batch, dict):
            return
        records = skipped_in(batch)
        counts = self._counts.setdefault(stage, [0, 0])
        counts[0] += len(batch.get("ids") or []) + len(records)
        counts[1] += len(records)
        if records and getattr(trainer.datamodule, "on_bad_utterance", "skip") == "raise":
            raise refused(records[0])
        for s in records:
            if s.id not in self.skipped:
                log.warning("skipped utterance %s (%s): %s", s.id, s.path, s.reason)
                self.skipped[s.id] = {"id": s.id, "path": s.path, "reason": s.reason, "stage": stage}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._collect(trainer, "train", batch)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self._collect(trainer, "dev", batch)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._collect(trainer, "test", batch)

    # ------------------------------------------------------------------ epoch ends
    def _end_pass(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Sum this pass's counts over ranks; log them; stop if nothing was usable."""
        seen, skipped = self._counts.pop(stage, [0, 0])
        totals = trainer.strategy.reduce(torch.tensor([seen, skipped], dtype=torch.float64,
                                                       device=pl_module.device), reduce_op="sum")
        seen, skipped = int(totals[0]), int(totals[1])
        if skipped and stage == "train":
            pl_module.log("data/skipped_utterances", float(skipped), on_step=False, on_epoch=True, reduce_fx="max")
        if seen and skipped == seen:
            records = [SkippedUtterance(r["id"], r["path"], r["reason"]) for r in self._all_skipped()
                       if r["stage"] == stage]
            raise all_bad_error(f"{stage} (epoch {trainer.current_epoch})", records)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._end_pass(trainer, pl_module, "train")

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._end_pass(trainer, pl_module, "dev")

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._end_pass(trainer, pl_module, "test")

    # ------------------------------------------------------------------ summary
    def _all_skipped(self) -> list[dict[str, str]]:
        """Records of every rank, by id, sorted (a collective call under DDP)."""
        merged: dict[str, dict[str, str]] = {}
        for part in gather_objects(self.skipped):
            merged.update(part)
        return [merged[k] for k in sorted(merged)]

    def _summary(self, trainer: L.Trainer) -> None:
        records = self._all_skipped()
        if not trainer.is_global_zero:
            return
        if records:
            listing = describe_skipped(SkippedUtterance(r["id"], r["path"], r["reason"]) for r in records)
            log.warning("%d utterance(s) skipped for unusable audio:\n%s", len(records), listing)
        if self.summary_file is not None and (records or self._summary_path(trainer).exists()):
            path = self._summary_path(trainer)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps({"skipped": records}, indent=2) + "\n")
            tmp.replace(path)

    def _summary_path(self, trainer: L.Trainer) -> Path:
        return Path(trainer.default_root_dir) / str(self.summary_file)

    def on_fit_end(self, trainer, pl_module) -> None:
        self._summary(trainer)

    def on_test_end(self, trainer, pl_module) -> None:
        self._summary(trainer)
