"""The LightningModule: CTC loss, greedy decoding, PER/WER, optimiser and schedule.

It trains (and scores) the model of a :class:`fastasr.recognition.recogniser.Recogniser` and writes that
bundle — model config, attention, tokenizer, features — into every checkpoint once, as plain
data (``checkpoint["recogniser"]``); the global CMVN statistics are buffers of the model, so
``fastasr.recognition.recogniser.load_recogniser(path)`` alone gives a working recogniser.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_info

from fastasr.decoding import ErrorRates, GreedyDecoder
from fastasr.decoding.emissions import batch_emissions, transcribe_one
from fastasr.distributed import loss_without_update
from fastasr.model import CTCModel
from fastasr.recognition.recogniser import RECOGNISER_KEY, Recogniser
from fastasr.training.lr_schedules import BudgetSchedule, budget_progress, build_lr_schedulers


class ASRLitModule(L.LightningModule):
    """Trains and scores the :class:`fastasr.model.CTCModel` of a recogniser.

    Args:
        recogniser: the bundle (or its :meth:`~fastasr.recognition.recogniser.Recogniser.to_dict`); its
            ``model`` is used when set (decoding a loaded checkpoint), else a new one is built.
            ``self.recogniser`` is the bundle carrying ``self.model``.
        optimizer: Hydra config of a partial optimiser (``_partial_: true``).
        scheduler: Hydra config of a partial LR scheduler plus the Lightning keys
            ``monitor``/``interval``/``frequency`` and an optional linear warm-up
            (``warmup_steps``, ``warmup_start_factor``; :mod:`fastasr.training.lr_schedules`);
            None for a constant rate.
        log_examples: decoded dev examples printed after each validation.
    """

    def __init__(
        self,
        recogniser: Recogniser | Mapping[str, Any],
        optimizer: Mapping[str, Any] | None = None,
        scheduler: Mapping[str, Any] | None = None,
        log_examples: int = 2,
    ):
        super().__init__()
        # the recogniser goes into checkpoints once, by on_save_checkpoint, not as a hyper-parameter
        self.save_hyperparameters(ignore=["recogniser"])
        if not isinstance(recogniser, Recogniser):
            recogniser = Recogniser.from_dict(recogniser)
        self.model: CTCModel = recogniser.model if recogniser.model is not None else recogniser.build_model()
        self.recogniser = recogniser.with_model(self.model)
        self.tokenizer = recogniser.tokenizer
        self.unit_metric = recogniser.unit_metric
        # no lexicon: a phoneme model's val/test WER is over phonetic words (evaluate.py's greedy
        # decoding maps them to real words through the recogniser's lexicon when it has one)
        self._greedy = GreedyDecoder(self.tokenizer)
        self._rates: dict[str, ErrorRates] = {}
        self.test_result: dict[str, Any] = {}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Write the recogniser bundle as plain data (``checkpoint["recogniser"]``)."""
        checkpoint[RECOGNISER_KEY] = self.recogniser.to_dict()

    # ---------------------------------------------------------------- forward / loss
    def forward(self, features: torch.Tensor, lengths: torch.Tensor):
        return self.model(features, lengths)

    def _ctc(self, log_probs: torch.Tensor, out_lengths: torch.Tensor, batch: Mapping[str, Any]) -> torch.Tensor:
        """CTC loss of each utterance over its label length, averaged over the batch (nats per label)."""
        per_utt = F.ctc_loss(
            log_probs.transpose(0, 1).float(),
            batch["targets"],
            out_lengths,
            batch["target_lengths"],
            blank=self.tokenizer.blank_id,
            reduction="none",
            zero_infinity=True,
        )
        return (per_utt / batch["target_lengths"].clamp(min=1)).mean()

    def _loss(self, batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        log_probs, out_lengths = self.model(batch["features"], batch["feature_lengths"])
        return self._ctc(log_probs, out_lengths, batch), log_probs, out_lengths

    def _training_loss(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The final layer's CTC loss; with intermediate CTC (``model.inter_ctc_layers``),
        ``(1 - w) * final + w * mean(intermediate)`` (Lee & Watanabe 2021), each part logged."""
        weight = self.model.inter_ctc_weight
        if not weight:
            return self._loss(batch)[0]
        log_probs, out_lengths, inter = self.model.forward_with_intermediate(batch["features"], batch["feature_lengths"])
        final = self._ctc(log_probs, out_lengths, batch)
        intermediate = torch.stack([self._ctc(lp, out_lengths, batch) for lp in inter]).mean()
        bs = len(batch["ids"])
        self.log("train/final_ctc", final, batch_size=bs)
        self.log("train/inter_ctc", intermediate, batch_size=bs)
        return (1.0 - weight) * final + weight * intermediate

    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor | None:
        if not batch["ids"]:  # every utterance skipped for bad audio (fastasr.data.bad_audio)
            return loss_without_update(self)
        loss = self._training_loss(batch)
        bs = len(batch["ids"])
        self.log("train/loss", loss, prog_bar=True, batch_size=bs)
        self.log("train/frames", batch["feature_lengths"].sum().float(), reduce_fx="sum", batch_size=bs)
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        """Log ``train/grad_norm``, the gradients' L2 norm before clipping, as a tensor on the
        device: one foreach norm, no read back to the host (Lightning's ``grad_norm`` reads every
        parameter's norm back, a host sync each on a GPU: 150 a step of the paper's model)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if grads:
            self.log("train/grad_norm", torch.nn.utils.get_total_norm(grads, norm_type=2.0))

    # ---------------------------------------------------------------- evaluation
    def _eval_step(self, stage: str, batch: Mapping[str, Any]) -> None:
        if not batch["ids"]:  # all skipped for bad audio, or a DDP rank's empty padding batch:
            # log with weight 0, so that every rank joins the epoch-end sync of the loss
            self.log(f"{stage}/loss", torch.zeros((), device=self.device), prog_bar=stage == "val", batch_size=0,
                     sync_dist=True)
            return
        loss, log_probs, out_lengths = self._loss(batch)
        self.log(f"{stage}/loss", loss, prog_bar=stage == "val", batch_size=len(batch["ids"]), sync_dist=True)
        self.score(stage, batch, log_probs, out_lengths)

    def score(self, stage: str, batch: Mapping[str, Any], log_probs: torch.Tensor, out_lengths: torch.Tensor) -> None:
        """Add a batch's greedy decoding to the ``stage`` error-rate accumulator, by the path
        evaluate.py's greedy decoding takes (:func:`fastasr.decoding.emissions.batch_emissions`
        → :class:`fastasr.decoding.GreedyDecoder` → :func:`fastasr.decoding.emissions.transcribe_one`):
        the same hypotheses, reference words and scored units."""
        transcripts = [transcribe_one(e, self._greedy, self.tokenizer)
                       for e in batch_emissions(batch, log_probs, out_lengths, self.tokenizer)]
        self._rates.setdefault(stage, ErrorRates()).add(transcripts, keep_examples=self.hparams.log_examples)

    def _finish(self, stage: str) -> dict[str, float]:
        rates = self._rates.pop(stage, ErrorRates())
        # edit counts summed over DDP ranks: corpus-level rates (the same value on every rank)
        rates = rates.summed_over_processes(lambda t: self.trainer.strategy.reduce(t.to(self.device), reduce_op="sum"))
        result = rates.compute()
        values = {self.unit_metric: result["uer"], "wer": result["wer"]}
        for name, value in values.items():
            self.log(f"{stage}/{name}", value, prog_bar=True, sync_dist=True)
        for ref, hyp in rates.examples:
            rank_zero_info(f"[{stage}] REF: {ref}\n[{stage}] HYP: {hyp}")
        return {**values, "utterances": rates.utterances}

    def validation_step(self, batch: Mapping[str, Any], batch_idx: int) -> None:
        self._eval_step("val", batch)

    def on_validation_epoch_end(self) -> None:
        self._finish("val")

    def on_test_epoch_start(self) -> None:
        self._test_start = time.perf_counter()

    def test_step(self, batch: Mapping[str, Any], batch_idx: int) -> None:
        self._eval_step("test", batch)

    def on_test_epoch_end(self) -> None:
        result = self._finish("test")
        result["decode_seconds"] = time.perf_counter() - self._test_start
        result["attention"] = self.model.attention_spec
        self.test_result = result

    # ---------------------------------------------------------------- optimisation
    def configure_optimizers(self):
        if self.hparams.optimizer is None:
            raise ValueError("no optimizer config: set optim=... (e.g. optim=radam)")
        optimizer = instantiate(dict(self.hparams.optimizer))(params=self.parameters())
        schedulers = build_lr_schedulers(optimizer, self.hparams.scheduler)
        for entry in schedulers:
            if isinstance(entry["scheduler"], BudgetSchedule):  # follows the trainer's time/step/epoch budget
                entry["scheduler"].progress = lambda: budget_progress(self.trainer)
        if not schedulers:
            return optimizer
        return [optimizer], schedulers
