"""The layout of a run directory, in one place.

A training run (``outputs/runs/<name>``, or a matrix member's ``.../runs/<spec>``) holds::

    config.yaml          the resolved config it was trained with (written by training.train)
    checkpoints/         best-*.ckpt, last.ckpt (every epoch end), step-last.ckpt (every N steps),
                         epochNNN-scoreX.ckpt (every epoch's weights, X the validation PER/CER; averaging)
    fit_done.json        written once fit ended normally (callbacks.FitCompletionMarker)
    wandb_run_id.txt     the wandb run id, so a resumed run continues the same wandb run
    csv/version_*/metrics.csv   the CSV logger's metrics (one version per (re)start)
    tensorboard/ wandb/  the other loggers' files
    attention_maps/      PNGs of the attention-map callback
    results.json         evaluate.py's result, in an evaluation's run directory
    recogs-<tag>.txt errs-<tag>.txt errs-units-<tag>.txt   beside it: per-utterance hypotheses and
                         aligned errors of one decoding (tag = manifest stem and decoder, e.g. test-beam)
    tune.json            the decoding tuner's grid (python -m fastasr.cli.tune), in its run directory
    transcripts.jsonl    a transcription's output (fastasr-transcribe): one JSON line per file
    transcribe.json      its report: files transcribed, files that could not be (and why), settings, speed
    transcripts.ctm srt/<id>.srt   its optional CTM file and SubRip subtitles

Everything that reads or writes these names goes through :class:`RunDir`. This module
imports neither torch nor Lightning at import time (``fastasr.studies.report`` uses it).
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
CHECKPOINTS_DIR = "checkpoints"
FIT_DONE_FILE = "fit_done.json"
WANDB_RUN_ID_FILE = "wandb_run_id.txt"
CSV_DIR = "csv"
ATTENTION_MAPS_DIR = "attention_maps"
RESULTS_FILE = "results.json"
TUNE_FILE = "tune.json"
# A transcription's files (fastasr-transcribe).
TRANSCRIPTS_FILE = "transcripts.jsonl"
TRANSCRIBE_REPORT_FILE = "transcribe.json"
CTM_FILE = "transcripts.ctm"
SRT_DIR = "srt"
# Checkpoints a run resumes from: last.ckpt (every epoch end, callbacks.LastCheckpoint), step-last.ckpt (every N steps).
RESUME_NAMES = ("last.ckpt", "step-last.ckpt")
# Every epoch's weights, named by the epoch_checkpoint callback (conf/callbacks/default.yaml).
EPOCH_CHECKPOINT = re.compile(r"^epoch(?P<epoch>\d+)-score(?P<score>[-+0-9.eE]+|nan|inf)\.ckpt$")
# Per-utterance files of one decoding, by kind (fastasr.decoding.recognition_files writes them).
RECOGNITION_FILES = {"recogs": "recogs-{tag}.txt", "errs": "errs-{tag}.txt", "errs_units": "errs-units-{tag}.txt"}


def _write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``: a kill
    never leaves a half-written (or empty) file under that name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def _write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    _write_text_atomic(path, json.dumps(data, indent=2) + "\n")


class RunDir:
    """One run directory: where each file lives, and the few reads and writes on them.

    ``RunDir(path)`` creates nothing; :meth:`create` makes the directory.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    @classmethod
    def of_checkpoint(cls, ckpt_path: str | os.PathLike) -> RunDir:
        """The run directory a checkpoint file lies in (the parent of its ``checkpoints/``)."""
        path = Path(ckpt_path)
        if path.parent.name != CHECKPOINTS_DIR:
            raise ValueError(f"{ckpt_path}: not in a run directory's {CHECKPOINTS_DIR}/ folder; expected "
                             f"<run dir>/{CHECKPOINTS_DIR}/<name>.ckpt as training writes it")
        return cls(path.parent.parent)

    def create(self) -> RunDir:
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    # ------------------------------------------------------------------ where things are
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    @property
    def fit_done_file(self) -> Path:
        return self.path / FIT_DONE_FILE

    @property
    def wandb_run_id_file(self) -> Path:
        return self.path / WANDB_RUN_ID_FILE

    @property
    def attention_maps(self) -> Path:
        return self.path / ATTENTION_MAPS_DIR

    @property
    def results_file(self) -> Path:
        return self.path / RESULTS_FILE

    @property
    def tune_file(self) -> Path:
        return self.path / TUNE_FILE

    @property
    def transcripts_file(self) -> Path:
        return self.path / TRANSCRIPTS_FILE

    @property
    def transcribe_report_file(self) -> Path:
        return self.path / TRANSCRIBE_REPORT_FILE

    @property
    def ctm_file(self) -> Path:
        return self.path / CTM_FILE

    @property
    def srt_dir(self) -> Path:
        return self.path / SRT_DIR

    def recognition_files(self, tag: str) -> dict[str, Path]:
        """The per-utterance files of one decoding tagged ``tag``, by kind: ``recogs``,
        ``errs`` (word alignment) and ``errs_units`` (unit alignment)."""
        return {kind: self.path / name.format(tag=tag) for kind, name in RECOGNITION_FILES.items()}

    def metrics_files(self) -> list[Path]:
        """Every ``csv/version_*/metrics.csv`` (a resumed run adds a version), in version order."""
        def version(path: Path) -> int:
            match = re.search(r"version_(\d+)", path.parent.name)
            return int(match.group(1)) if match else 0

        return sorted(self.path.glob(f"{CSV_DIR}/version_*/metrics.csv"), key=version)

    # ------------------------------------------------------------------ checkpoints
    def finished_checkpoint(self, done: Mapping[str, Any] | None = None) -> Path:
        """The checkpoint to decode a finished run with: ``best_ckpt``, else ``last_ckpt`` of
        the ``fit_done.json`` record ``done`` (looked up by name in ``checkpoints/`` too, so a
        moved run directory still works), else the newest ``best-*.ckpt``, else ``last.ckpt``."""
        for key in ("best_ckpt", "last_ckpt"):
            if done and done.get(key):
                path = Path(done[key])
                for candidate in (path, self.checkpoints / path.name):
                    if candidate.is_file():
                        return candidate
        best = sorted(self.checkpoints.glob("best-*.ckpt"))
        if best:
            return best[-1]
        if (self.checkpoints / "last.ckpt").is_file():
            return self.checkpoints / "last.ckpt"
        raise FileNotFoundError(f"{self.path}: no checkpoint to decode in {self.checkpoints}")

    def epoch_checkpoints(self) -> list[tuple[int, float, Path]]:
        """``(epoch, score, path)`` of every ``epochNNN-scoreX.ckpt`` in ``checkpoints/``, by
        epoch (X: the validation unit error rate, lower is better; nan when it was not logged)."""
        found = []
        for path in self.checkpoints.glob("epoch*.ckpt"):
            match = EPOCH_CHECKPOINT.match(path.name)
            if match:
                found.append((int(match["epoch"]), float(match["score"]), path))
        return sorted(found)

    def latest_checkpoint(self) -> Path | None:
        """Newest of ``last.ckpt`` and ``step-last.ckpt`` by training step, or None.

        The checkpoints are read with ``torch.load(weights_only=True)``.
        """
        found = [self.checkpoints / n for n in RESUME_NAMES if (self.checkpoints / n).is_file()]
        if len(found) <= 1:
            return found[0] if found else None
        import torch

        return max(found, key=lambda p: torch.load(p, map_location="cpu", weights_only=True)["global_step"])

    def resolve_ckpt_path(self, ckpt_path: str | os.PathLike | None) -> str | None:
        """Turn ``ckpt_path`` (null | auto | last | PATH) into the checkpoint to resume, or None.

        null: start fresh (refused when this run already has checkpoints); auto: resume the
        latest checkpoint if any; last: resume it, which must exist; PATH: that file.
        """
        if ckpt_path in (None, "null", "none"):
            if self.latest_checkpoint() is not None:
                raise FileExistsError(
                    f"{self.checkpoints} already holds checkpoints of run '{self.name}'; "
                    "pass ckpt_path=last to resume it or name=<new name> for a fresh run"
                )
            return None
        if ckpt_path in ("auto", "last"):
            found = self.latest_checkpoint()
            if found is None and ckpt_path == "last":
                raise FileNotFoundError(f"ckpt_path=last: no last.ckpt or step-last.ckpt in {self.checkpoints}")
            if found is not None:
                log.info("resuming from %s", found)
            return None if found is None else str(found)
        path = Path(ckpt_path)
        if not path.is_file():
            raise FileNotFoundError(f"ckpt_path={ckpt_path}: no such checkpoint file")
        return str(path)

    # ------------------------------------------------------------------ completion marker
    def read_fit_done(self) -> dict[str, Any] | None:
        """The ``fit_done.json`` record, or None when the run has not finished (or the file is torn)."""
        if not self.fit_done_file.is_file():
            return None
        try:
            return json.loads(self.fit_done_file.read_text())
        except json.JSONDecodeError:
            return None

    def write_fit_done(self, record: Mapping[str, Any]) -> Path:
        """Write ``fit_done.json`` atomically (a kill never leaves half a file)."""
        _write_json_atomic(self.fit_done_file, record)
        return self.fit_done_file

    def clear_fit_done(self) -> None:
        self.fit_done_file.unlink(missing_ok=True)

    # ------------------------------------------------------------------ other records
    def wandb_run_id(self) -> str:
        """The run's wandb id, created (12 hex digits) and kept on first use.

        Only global rank 0 writes the file (``fastasr.distributed.is_rank_zero_process``; under
        DDP the other ranks' loggers log nothing, and torchrun starts every rank at once), and it
        writes it atomically; an empty file (left by an older, killed writer) is not trusted."""
        from fastasr.distributed import is_rank_zero_process  # imports torch; rundir must not

        if self.wandb_run_id_file.is_file():
            run_id = self.wandb_run_id_file.read_text().strip()
            if run_id:
                return run_id
        run_id = uuid.uuid4().hex[:12]
        if is_rank_zero_process():
            _write_text_atomic(self.wandb_run_id_file, run_id + "\n")
        return run_id

    def write_results(self, result: Mapping[str, Any]) -> Path:
        """Write ``results.json`` (an evaluation's numbers)."""
        _write_json_atomic(self.results_file, result)
        return self.results_file

    def write_transcribe_report(self, report: Mapping[str, Any]) -> Path:
        """Write ``transcribe.json`` (a transcription's report)."""
        _write_json_atomic(self.transcribe_report_file, report)
        return self.transcribe_report_file

    def read_results(self) -> dict[str, Any] | None:
        if not self.results_file.is_file():
            return None
        try:
            return json.loads(self.results_file.read_text())
        except json.JSONDecodeError:
            return None

    def add_to_results(self, fields: Mapping[str, Any]) -> bool:
        """Add ``fields`` to an existing ``results.json`` (what training learnt about the run,
        beside its final decoding's numbers); False, and nothing written, when there is none."""
        results = self.read_results()
        if results is None:
            return False
        self.write_results({**results, **fields})
        return True
