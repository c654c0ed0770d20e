"""Say so when a run is not learning: CTC's blank plateau, or a dev loss and error that stopped improving.

On a small corpus a CTC run can sit on the blank plateau (the model emits almost only blanks:
dev PER/CER 90-100 %, the dev loss flat) for thousands of updates. :class:`LearningWatch`
judges every validation from ``after_updates`` updates on and, once per condition, logs one
warning that says what it sees (updates, dev error, the dev loss's trend, the batch in
utterances, the peak learning rate) and what to try, shows ``not_learning`` in the progress bar,
and keeps the warning for the run's results (:func:`learning_warnings`: ``learning_warnings`` in
``train``'s result and in ``results.json``). Its state is in the checkpoint, so a resumed run
neither repeats a warning nor forgets one. The conditions:

``plateau``
    the dev error (``val/per``, or ``val/cer`` for char and subword models) is at least
    ``plateau_error`` (%) at a validation after ``after_updates`` updates.
``stalled``
    after ``after_updates`` updates, over the last ``patience`` validations the best dev loss
    improved on the best before them by less than ``min_delta`` (relative; a rising loss
    improved not at all), and so did the best dev error, which is still at least
    ``stalled_error`` (%). Below that error a flat or rising dev loss is a run that has
    converged or is overfitting (the dev loss of a normal run rises for tens of epochs while
    its error still falls), not one that is not learning.

What the warnings advise is explained in docs/TROUBLESHOOTING.md ("The run says it is not learning").
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import lightning as L

log = logging.getLogger(__name__)

TROUBLESHOOTING = "docs/TROUBLESHOOTING.md#the-run-says-it-is-not-learning"
PROGRESS_BAR_KEY = "not_learning"  # in the progress bar once a warning was given: the number of conditions seen
PLATEAU = "plateau"
STALLED = "stalled"


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _best(values: Sequence[float | None]) -> float | None:
    finite = [v for v in values if v is not None]
    return min(finite) if finite else None


def _improved(before: float | None, after: float | None, min_delta: float) -> bool:
    """Whether ``after`` (the best of a window) beats ``before`` (the best until it) by at least
    ``min_delta`` relative. With nothing before to compare with, it counts as an improvement."""
    if before is None:
        return True
    if after is None:
        return False
    return after < before - min_delta * abs(before)


class LearningWatch(L.Callback):
    """Warns, once per condition, when the dev error sits on CTC's blank plateau or the dev loss
    and error stopped improving (the module docstring defines both).

    Args:
        after_updates: judge from this many updates (optimiser steps) on; before, a plateau is
            normal (≥ 0).
        plateau_error: dev error (%) at or above which the model is on the blank plateau.
        patience: validations over which the best dev loss and error must improve (≥ 1).
        min_delta: the relative improvement of a best that counts (0.01: 1 %; ≥ 0).
        stalled_error: the ``stalled`` condition holds only at a dev error (%) at least this.
        metric: the dev error key; None: ``val/<unit metric>`` of the module (``val/per`` or
            ``val/cer``), else the first of those two that was logged.
        loss: the dev loss key.

    ``warnings`` (a list of dicts: ``condition``, ``update``, ``epoch``, ``metric``,
    ``dev_error``, ``dev_loss``, ``message``) and the validations seen are kept in the checkpoint;
    a checkpoint older than what the callback has seen (the best one, restored for the test) does
    not replace it.
    """

    def __init__(self, after_updates: int = 600, plateau_error: float = 90.0, patience: int = 4,
                 min_delta: float = 0.01, stalled_error: float = 60.0, metric: str | None = None,
                 loss: str = "val/loss") -> None:
        super().__init__()
        if int(after_updates) < 0:
            raise ValueError(f"LearningWatch after_updates={after_updates}; expected ≥ 0")
        if int(patience) < 1:
            raise ValueError(f"LearningWatch patience={patience}; expected ≥ 1")
        if not 0.0 <= float(min_delta) < 1.0:
            raise ValueError(f"LearningWatch min_delta={min_delta}; expected within [0, 1)")
        self.after_updates = int(after_updates)
        self.plateau_error = float(plateau_error)
        self.patience = int(patience)
        self.min_delta = float(min_delta)
        self.stalled_error = float(stalled_error)
        self.metric = metric
        self.loss = loss
        self.warnings: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = []  # one per validation: update, epoch, loss, error (None: not finite)
        self._utterances = 0  # training utterances and batches seen: the mean batch in utterances
        self._batches = 0
        self._show = False  # log the progress-bar flag at the next training batch

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"warnings": [dict(w) for w in self.warnings], "history": [dict(h) for h in self.history],
                "utterances": self._utterances, "batches": self._batches}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if len(state_dict.get("history", [])) < len(self.history):
            # an older checkpoint restored after fit (trainer.test(ckpt_path=best) restores the
            # callbacks too): what this run has seen since stays; a resume starts with nothing
            return
        self.warnings = [dict(w) for w in state_dict.get("warnings", [])]
        self.history = [dict(h) for h in state_dict.get("history", [])]
        self._utterances = int(state_dict.get("utterances", 0))
        self._batches = int(state_dict.get("batches", 0))
        self._show = bool(self.warnings)  # a resumed run shows the flag again

    @property
    def conditions(self) -> list[str]:
        """The conditions warned about so far, in order."""
        return [w["condition"] for w in self.warnings]

    # ------------------------------------------------------------------ hooks
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if isinstance(batch, dict) and batch.get("ids") is not None:
            self._utterances += len(batch["ids"])
            self._batches += 1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # a callback cannot log in on_validation_end, where the decision is taken: the flag goes
        # into the progress bar with the next batch and stays there (Lightning keeps the value)
        if self._show:
            pl_module.log(PROGRESS_BAR_KEY, float(len(self.warnings)), prog_bar=True, on_step=True,
                          on_epoch=False, batch_size=1)
            self._show = False

    def on_validation_end(self, trainer, pl_module) -> None:
        # the epoch's dev metrics are in callback_metrics only from here on (as for ModelCheckpoint)
        if trainer.sanity_checking or getattr(trainer, "fast_dev_run", False):
            return
        metrics = trainer.callback_metrics
        metric = self._metric_key(pl_module, metrics)
        if metric is None:
            return
        self.observe(trainer.global_step, trainer.current_epoch, metrics.get(self.loss), metrics.get(metric),
                     metric=metric, trainer=trainer, pl_module=pl_module)

    def _metric_key(self, pl_module, metrics) -> str | None:
        if self.metric is not None:
            return self.metric if self.metric in metrics else None
        unit = getattr(pl_module, "unit_metric", None)
        candidates = [f"val/{unit}"] if unit else []
        candidates += ["val/per", "val/cer"]
        return next((k for k in candidates if k in metrics), None)

    # ------------------------------------------------------------------ the decision
    def observe(self, update: int, epoch: int, loss: Any, error: Any, metric: str = "val/per",
                trainer: L.Trainer | None = None, pl_module: L.LightningModule | None = None) -> list[str]:
        """Record one validation (dev ``loss``, dev ``error`` in % under the name ``metric``) at
        ``update`` and warn for each condition that holds for the first time. Returns the
        conditions newly warned about."""
        self.history.append({"update": int(update), "epoch": int(epoch), "loss": _finite(loss),
                             "error": _finite(error)})
        if update < self.after_updates:
            return []
        new = [c for c, holds in ((PLATEAU, self._plateau()), (STALLED, self._stalled())) if holds
               and c not in self.conditions]
        for condition in new:
            message = self._message(condition, metric, trainer, pl_module)
            now = self.history[-1]
            self.warnings.append({"condition": condition, "update": now["update"], "epoch": now["epoch"],
                                  "metric": metric, "dev_error": now["error"], "dev_loss": now["loss"],
                                  "message": message})
            if trainer is None or trainer.is_global_zero:
                log.warning("%s", message)
            self._show = True
        return new

    def _plateau(self) -> bool:
        error = self.history[-1]["error"]
        return error is not None and error >= self.plateau_error

    def _window(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return self.history[:-self.patience], self.history[-self.patience:]

    def _stalled(self) -> bool:
        error = self.history[-1]["error"]
        if error is None or error < self.stalled_error or len(self.history) <= self.patience:
            return False
        before, window = self._window()
        for key in ("loss", "error"):
            if _improved(_best([h[key] for h in before]), _best([h[key] for h in window]), self.min_delta):
                return False
        return True

    # ------------------------------------------------------------------ the message
    def _loss_trend(self) -> str:
        """``dev loss 2.710 (best 2.650 at update 480; best of the last 4 validations +2.3 %: rising)``."""
        now = self.history[-1]
        if now["loss"] is None:
            return "dev loss not finite"
        best, at = min((h["loss"], h["update"]) for h in self.history if h["loss"] is not None)
        text = f"dev loss {now['loss']:.3f} (best {best:.3f} at update {at}"
        before, window = self._window()
        b, w = _best([h["loss"] for h in before]), _best([h["loss"] for h in window])
        if len(self.history) > self.patience and b and w is not None:
            change = (w - b) / abs(b)
            trend = "rising" if change > 0 else "flat" if change > -self.min_delta else "falling"
            text += f"; best of the last {self.patience} validations {100 * change:+.1f} %: {trend}"
        return text + ")"

    def _message(self, condition: str, metric: str, trainer: L.Trainer | None,
                 pl_module: L.LightningModule | None) -> str:
        now = self.history[-1]
        name = metric.rsplit("/", 1)[-1].upper()
        best = min(h["error"] for h in self.history if h["error"] is not None)
        error = f"dev {name} {now['error']:.1f} %"
        if condition == PLATEAU:
            seen = (f"{error} (best so far {best:.1f} %), at or above {self.plateau_error:g} %: the model is on "
                    f"CTC's blank plateau, emitting almost only blanks; {self._loss_trend()}")
        else:
            seen = (f"neither the dev loss nor the dev {name} improved by {100 * self.min_delta:g} % over the last "
                    f"{self.patience} validations, and the {error} (best so far {best:.1f} %) is at or above "
                    f"{self.stalled_error:g} %; {self._loss_trend()}")
        head = f"not learning: after {now['update']} updates (epoch {now['epoch']}), {seen}."
        setting = "; ".join(s for s in (self._batch_text(trainer), _lr_text(trainer, pl_module)) if s)
        lowered = _lowered_budget(trainer)
        batch_advice = ("data.min_batches_per_epoch=null (it lowered the batch budget on this corpus), or a larger "
                        "data.max_frames_per_batch" if lowered else "a larger data.max_frames_per_batch (and "
                        "data.min_batches_per_epoch=null)")
        # off the plateau but stuck: a start that can go either way, and another seed often learns
        restart = ("the same command with another seed (a start can stick off the plateau: the model finds "
                   "where the words are but not which they are); " if condition == STALLED else "")
        return (f"{head}" + (f" Training with {setting}." if setting else "") +
                f" What to try: {_input_scale_advice(pl_module)}{restart}a lower optim.lr (half, say); "
                f"a larger batch: {batch_advice}; fewer output units: tokenizer=bpe with a small "
                f"data.vocab_size (about 30). "
                f"See {TROUBLESHOOTING} (callbacks.not_learning sets when this warning is given).")

    def _batch_text(self, trainer: L.Trainer | None) -> str:
        parts = []
        if self._batches:
            parts.append(f"batches of {self._utterances / self._batches:.1f} utterances on average")
        budget, configured = _budgets(trainer)
        if budget is not None:
            text = f"a batch budget of {budget} priced frames"
            if _lowered_budget(trainer):
                minimum = getattr(trainer.datamodule, "min_batches_per_epoch", None)
                text += (f" (data.max_frames_per_batch={configured}, lowered to give "
                         f"data.min_batches_per_epoch={minimum} updates an epoch)")
            parts.append(text)
        return ", ".join(parts)


def _input_scale_advice(pl_module: L.LightningModule | None) -> str:
    """``model.xscaling=true`` first when the module's model adds sinusoids to an unscaled front
    end: its input starts as mostly position, and such starts stuck (docs/RECIPES.md)."""
    model = getattr(pl_module, "model", None)
    if getattr(model, "position_kind", None) != "absolute" or getattr(model, "input_scale", None) != 1.0:
        return ""
    return ("model.xscaling=true (this model adds its sinusoids to the front end's output unscaled, so its "
            "input starts as mostly position; with the scaling, starts that stuck learned); ")


def _budgets(trainer: L.Trainer | None) -> tuple[int | None, int | None]:
    """The data module's training batch budget in priced frames and ``data.max_frames_per_batch``."""
    data = getattr(trainer, "datamodule", None) if trainer is not None else None
    configured = getattr(data, "max_frames_per_batch", None)
    try:
        budget = getattr(data, "train_frames_per_batch", configured)
    except Exception:  # not decided, and cannot be here: say nothing about it
        budget = None
    return (None if budget is None else int(budget)), (None if configured is None else int(configured))


def _lowered_budget(trainer: L.Trainer | None) -> bool:
    budget, configured = _budgets(trainer)
    return budget is not None and configured is not None and budget < configured


def _lr_text(trainer: L.Trainer | None, pl_module: L.LightningModule | None) -> str:
    """The peak learning rate (``optim.lr``, which the warm-up and decay scale) and the present one."""
    hparams = getattr(pl_module, "hparams", None) or {}
    peak = _finite((hparams.get("optimizer") or {}).get("lr"))
    current = None
    optimizers = getattr(trainer, "optimizers", None) if trainer is not None else None
    if optimizers:
        group = optimizers[0].param_groups[0]
        current = _finite(group.get("lr"))
        if peak is None:
            peak = _finite(group.get("initial_lr", group.get("lr")))
    if peak is None:
        return ""
    return f"a peak learning rate of {peak:g} (optim.lr)" + (f", {current:g} now" if current is not None else "")


def learning_warnings(trainer: L.Trainer) -> list[dict[str, Any]]:
    """The warnings of the trainer's :class:`LearningWatch` callbacks: [] when it saw none, or when
    none is configured."""
    found: list[dict[str, Any]] = []
    for callback in getattr(trainer, "callbacks", None) or []:
        if isinstance(callback, LearningWatch):
            found.extend(dict(w) for w in callback.warnings)
    return found


def report_learning_warnings(trainer: L.Trainer, run_dir: Any | None = None) -> list[dict[str, Any]]:
    """:func:`learning_warnings`, repeated in the log as the run's last word when there are any,
    and written as ``learning_warnings`` into ``run_dir``'s ``results.json`` when it has one
    (``run_dir``: a :class:`fastasr.rundir.RunDir`; None: no file). Global rank 0 writes."""
    warnings = learning_warnings(trainer)
    if not trainer.is_global_zero:
        return warnings
    for w in warnings:
        log.warning("this run was not learning (%s at update %d): see learning_warnings in the results, and %s",
                    w["condition"], w["update"], TROUBLESHOOTING)
    if run_dir is not None:
        run_dir.add_to_results({"learning_warnings": warnings})
    return warnings
