"""Lightning callbacks for the dashboards and the matrix.

    ThroughputLogger      seconds per training batch, samples/frames per second, peak memory
    AttentionMapLogger    attention maps of one fixed dev utterance at each validation (PNG + loggers)
    RunInfoLogger         the attention variant, its parameters and the run config, to every logger
    FitCompletionMarker   ``fit_done.json`` in the run directory once ``fit`` has finished
    LargestBatchProbe     forward+backward on the largest training batches before training (OOM at minute one)
    BadAudioReport        counts utterances skipped for unusable audio; one summary naming every file
    NonFiniteLossGuard    skips the update of a batch with a NaN/inf loss; stops after several in a row
    PreemptionCheckpoint  on SIGTERM, a resumable checkpoint of the current step (``step-last.ckpt``)
    LastCheckpoint        a resumable checkpoint of every epoch end (``last.ckpt``)
    LearningWatch         one warning when the run is not learning (CTC's blank plateau, a stalled dev loss)
    BudgetDropout         dropout where the training budget affords many epochs (decided after the first)
    EpochSummary          one line a validation in the run's log (epoch, step, time, losses, error rates)
    FreezeLoaded          a fine-tuned model's front end and encoder fixed for its first updates (``init_from``)

Names are imported on first use, so importing one callback does not import the others.
Where their files go in a run directory is :mod:`fastasr.rundir`'s business.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BadAudioReport": "bad_audio",
    "NonFiniteLossError": "nonfinite_loss",
    "NonFiniteLossGuard": "nonfinite_loss",
    "AttentionMapLogger": "attention_maps",
    "render_attention_maps": "attention_maps",
    "mean_l1_distance": "attention_maps",
    "FitCompletionMarker": "completion",
    "LargestBatchProbe": "largest_batches",
    "PreemptionCheckpoint": "preemption",
    "LastCheckpoint": "last_checkpoint",
    "LearningWatch": "not_learning",
    "BudgetDropout": "budget_dropout",
    "EpochSummary": "epoch_summary",
    "FreezeLoaded": "freeze_loaded",
    "dropout_decision": "budget_dropout",
    "learning_warnings": "not_learning",
    "report_learning_warnings": "not_learning",
    "RunInfoLogger": "run_info",
    "attention_info": "run_info",
    "ThroughputLogger": "throughput",
    "peak_memory_mb": "throughput",
    "reset_peak_memory": "throughput",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
