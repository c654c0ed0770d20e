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

from fastasr.data.shapes import UTTERANCES_KEY
from fastasr.decoding import ErrorRates, GreedyDecoder
from fastasr.decoding.emissions import batch_emissions, transcribe_one
from fastasr.distributed import loss_without_update
from fastasr.model import CTCModel
from fastasr.recognition.recogniser import RECOGNISER_KEY, Recogniser
from fastasr.training.callbacks.throughput import HOST_LENGTHS_KEY
from fastasr.training.captured_step import CapturedSteps
from fastasr.training.checkpoint_io import portable_optimizer_state
from fastasr.training.lr_schedules import BudgetSchedule, budget_progress, build_lr_schedulers


class HostLengths:
    """A batch's frame and label lengths as the loader made them, on the host: torch's CUDA
    CTC reads its lengths there, so given these it copies nothing back from the GPU (no host
    synchronisation in the step). Not a tensor, nor anything with ``.to``: Lightning's batch
    transfer leaves it where it is."""

    def __init__(self, features: torch.Tensor, targets: torch.Tensor) -> None:
        self.features, self.targets = features, targets


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
        capture_steps: ``capture_steps`` resolved: True to capture each batch shape's training
            step as CUDA graphs where it can run (:mod:`fastasr.training.captured_step`; the
            hooks ``training_step``, ``backward``, ``configure_gradient_clipping`` and
            ``optimizer_step`` route to it), False for eager steps only.
    """

    def __init__(
        self,
        recogniser: Recogniser | Mapping[str, Any],
        optimizer: Mapping[str, Any] | None = None,
        scheduler: Mapping[str, Any] | None = None,
        log_examples: int = 2,
        capture_steps: bool | str = False,
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
        # the captured steps' hooks are CapturingASRLitModule's (lit_module_class)
        self.captured = CapturedSteps(self.model, capture_steps) if capture_steps not in (False, None) else None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Write the recogniser bundle as plain data (``checkpoint["recogniser"]``)."""
        checkpoint[RECOGNISER_KEY] = self.recogniser.to_dict()

    # ---------------------------------------------------------------- forward / loss
    def forward(self, features: torch.Tensor, lengths: torch.Tensor):
        return self.model(features, lengths)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Lightning's transfer; a batch bound for a GPU keeps its lengths on the host too
        (:class:`HostLengths`), for CTC."""
        host = None
        if device.type != "cpu" and isinstance(batch, Mapping) and "feature_lengths" in batch:
            host = HostLengths(batch["feature_lengths"], batch["target_lengths"])
        batch = super().transfer_batch_to_device(batch, device, dataloader_idx)
        if host is not None:
            batch[HOST_LENGTHS_KEY] = host
        return batch

    def _ctc(self, log_probs: torch.Tensor, out_lengths: torch.Tensor, batch: Mapping[str, Any]) -> torch.Tensor:
        """CTC loss of each utterance over its label length, averaged over the batch (nats per label).
        On a GPU the lengths it reads are the host's (:class:`HostLengths`): the model's output
        lengths computed there by the front end's rule, which ``out_lengths`` are on the device."""
        target_lengths = batch["target_lengths"]
        host = batch.get(HOST_LENGTHS_KEY)
        if host is not None:
            out_lengths = self.model.frontend.out_lengths(host.features)
            target_lengths = host.targets
        per_utt = F.ctc_loss(
            log_probs.transpose(0, 1).float(),
            batch["targets"],
            out_lengths,
            target_lengths,
            blank=self.tokenizer.blank_id,
            reduction="none",
            zero_infinity=True,
        )
        per_label = per_utt / batch["target_lengths"].clamp(min=1)
        if UTTERANCES_KEY in batch:  # padded to a batch shape: the empty rows' 0 not counted
            return per_label.sum() / batch[UTTERANCES_KEY]
        return per_label.mean()

    def _loss(self, batch: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        log_probs, out_lengths = self.model(batch["features"], batch["feature_lengths"])
        return self._ctc(log_probs, out_lengths, batch), log_probs, out_lengths

    def _training_loss(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The final layer's CTC loss; with intermediate CTC (``model.inter_ctc_layers``),
        ``(1 - w) * final + w * mean(intermediate)`` (Lee & Watanabe 2021), each part logged."""
        weight = self.model.inter_ctc_weight
        captured = self.captured.forward(batch, self._train_forward) if self.captured is not None else None
        if captured is not None:  # this shape's forward graph: CTC on its outputs
            log_probs, out_lengths, inter = captured
            if not weight:
                return self._ctc(log_probs, out_lengths, batch)
        elif not weight:
            return self._loss(batch)[0]
        else:
            log_probs, out_lengths, inter = self.model.forward_with_intermediate(batch["features"],
                                                                                 batch["feature_lengths"])
        final = self._ctc(log_probs, out_lengths, batch)
        intermediate = torch.stack([self._ctc(lp, out_lengths, batch) for lp in inter]).mean()
        bs = len(batch["ids"])
        self.log("train/final_ctc", final, batch_size=bs)
        self.log("train/inter_ctc", intermediate, batch_size=bs)
        return (1.0 - weight) * final + weight * intermediate

    def _train_forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The training forward a captured step records: ``([log_probs, *intermediate], out_lengths)``."""
        if self.model.inter_ctc_weight:
            log_probs, out_lengths, inter = self.model.forward_with_intermediate(features, lengths)
            return [log_probs, *inter], out_lengths
        log_probs, out_lengths = self.model(features, lengths)
        return [log_probs], out_lengths

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
        parameter's norm back, a host sync each on a GPU: 150 a step of the paper's model). NaN
        for a step whose gradients ``callbacks.nonfinite_loss`` dropped, rather than the last
        step's value again."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0) if grads else \
            torch.full((), float("nan"), device=self.device)
        self.log("train/grad_norm", norm)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's clipping, where a parameter has a gradient: a step whose gradients
        ``callbacks.nonfinite_loss`` dropped has none to clip (and torch's clipping by value
        fails on an empty list)."""
        if any(p.grad is not None for p in self.parameters()):
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

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


class CapturingASRLitModule(ASRLitModule):
    """:class:`ASRLitModule` whose training steps are captured where they can be
    (``capture_steps``; :mod:`fastasr.training.captured_step`): Lightning's hooks of the step
    (``backward``, ``configure_gradient_clipping``, ``optimizer_step``) route a captured step's
    parts, and fall through to Lightning's own in an eager step. A class of its own so that a run
    without capture runs the plain module's hooks, untouched (:func:`lit_module_class`)."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The plain module's, and the optimiser's state saved as an eager run keeps it
        (:func:`fastasr.training.checkpoint_io.portable_optimizer_state`): a captured run's
        checkpoint resumes eagerly, on a CPU or captured again."""
        super().on_save_checkpoint(checkpoint)
        for state in checkpoint.get("optimizer_states", []):
            portable_optimizer_state(state)

    def on_train_start(self) -> None:
        optimizers = self.trainer.optimizers
        self.captured.start(self.device, optimizers[0] if optimizers else None, self.trainer.world_size,
                            ddp=self.trainer.strategy.model, accumulate=self.trainer.accumulate_grad_batches)

    def backward(self, loss: torch.Tensor, *args, **kwargs) -> None:
        """Lightning's backward; in a captured step it reaches the forward graph's outputs only,
        and the shape's backward graph goes on from their gradients. Under DDP the gradients
        are then averaged over the processes (:meth:`CapturedSteps.reduce_gradients`)."""
        super().backward(loss, *args, **kwargs)
        self.captured.backward()
        self.captured.reduce_gradients()

    def on_before_optimizer_step(self, optimizer) -> None:
        """The plain module's ``train/grad_norm`` log in an eager step; a captured step logs its
        update graph's norm after the replay instead (:meth:`optimizer_step`)."""
        if self.captured.current is None:
            super().on_before_optimizer_step(optimizer)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's clipping; in a captured step the update graph clips (the same setting)."""
        if self.captured.current is not None:
            self.captured.clip = (gradient_clip_val, gradient_clip_algorithm)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        """Lightning's optimiser step; in a captured step the optimiser's ``step`` replays the
        shape's update graph (:meth:`fastasr.training.captured_step.CapturedSteps.optimizer_step`),
        and ``train/grad_norm`` is the norm it took (read by no one until Lightning logs it)."""
        if not self.captured.active:
            return super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        inner = getattr(optimizer, "optimizer", optimizer)  # LightningOptimizer -> the torch optimiser
        with self.captured.optimizer_step(inner):
            optimizer.step(closure=optimizer_closure)
        if self.captured.grad_norm is not None:
            self.log("train/grad_norm", self.captured.grad_norm)


def lit_module_class(capture_steps: bool | str) -> type[ASRLitModule]:
    """The LightningModule class of a run: :class:`CapturingASRLitModule` with ``capture_steps``
    on, else :class:`ASRLitModule`."""
    return ASRLitModule if capture_steps in (False, None) else CapturingASRLitModule
