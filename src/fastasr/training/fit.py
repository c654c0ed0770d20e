"""Training entry: composed config → resolve its ``auto`` values → check → instantiate data,
model, trainer → fit → test.

``python train.py`` (Hydra) calls :func:`train`; tests call it with a composed config. :func:`train`
resolves a copy of it once (:func:`fastasr.training.derived_config.resolve_train_config`: the
tokenizer a top-level ``tokenizer=`` names, the batch price of the attention, the checkpoint monitor,
the precision, a matrix member's attention), checks that once
(:func:`fastasr.training.config_check.check_train_config`), logs what it trains
(:func:`fastasr.training.derived_config.run_summary`) and saves it as the run's ``config.yaml``; the
caller's config is left as it was. After the test it hands over to the final decoding of the run
directory (:func:`decode_run`), which reads that ``config.yaml``.
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, instantiate
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

import fastasr.config  # noqa: F401  (PROJECT_ROOT for conf/paths)
from fastasr.distributed import is_rank_zero_process, leave_process_group_at_exit
from fastasr.progress import show_progress
from fastasr.recognition.checkpoint_averaging import write_averaged_checkpoint
from fastasr.recognition.final_decoding import FinalDecodingRequest, final_decoding
from fastasr.recognition.loading import with_decoding_data
from fastasr.recognition.recogniser import Recogniser
from fastasr.recognition.scoring import DecodeResult, decoding_options, training_manifest
from fastasr.rundir import RunDir
from fastasr.training.callbacks import dropout_decision, report_learning_warnings, reset_peak_memory
from fastasr.training.config_check import check_train_config
from fastasr.training.derived_config import resolve_train_config, run_summary
from fastasr.training.initial_weights import load_initial_weights
from fastasr.training.lit import ASRLitModule, lit_module_class
from fastasr.training.loggers import build_loggers, finish_wandb
from fastasr.training.run_guard import check_run_dir

log = logging.getLogger(__name__)

SIGTERM_EXIT_STATUS = 143  # 128 + SIGTERM: what a shell reports for a job terminated by SIGTERM


def run_dir_of(cfg: DictConfig) -> Path:
    """The run directory: Hydra's output dir when running under Hydra, else ``paths.run_dir``."""
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(cfg.paths.run_dir)


def progress_bar(cfg: DictConfig) -> bool:
    """Lightning's ``enable_progress_bar`` for ``cfg.trainer.enable_progress_bar``: ``auto`` (the
    default), whether stdout, where Lightning draws its bar, is a terminal (in a log file
    ``callbacks.epoch_summary``'s line a validation stands in); true or false as given. Decided
    where the trainer is built, by the process that draws it: ``config.yaml`` keeps ``auto``."""
    return show_progress(cfg.trainer.get("enable_progress_bar", "auto"), sys.stdout)


def build_callbacks(cfg: DictConfig, run_dir: RunDir) -> list[L.Callback]:
    """The callbacks of ``cfg.callbacks``; checkpoints go to the run's checkpoint directory. A
    progress bar's (``callbacks.progress_bar``) only where the run draws one (:func:`progress_bar`)."""
    callbacks = []
    for ccfg in (cfg.get("callbacks") or {}).values():
        if ccfg is None or "_target_" not in ccfg:
            continue
        if issubclass(get_class(ccfg._target_), ProgressBar) and not progress_bar(cfg):
            continue
        writes_checkpoints = issubclass(get_class(ccfg._target_), ModelCheckpoint)
        extra = {"dirpath": str(run_dir.checkpoints)} if writes_checkpoints else {}
        callbacks.append(instantiate(ccfg, **extra))
    return callbacks


def build_module(cfg: DictConfig, datamodule, run_dir: RunDir | None = None) -> ASRLitModule:
    """The LightningModule for ``cfg.model`` with the data's tokenizer, features and CMVN stats.

    ``cfg.model`` is a Hydra partial of the model class its ``_target_`` names; the recogniser
    keeps it as plain data and completes it with the data's sizes, ``vocab_size`` (the tokenizer's)
    and ``feat_in`` (the filterbank bins): :meth:`fastasr.recognition.recogniser.Recogniser.build_model`,
    the one place a model is built, in training and at checkpoint loading alike.

    Its recogniser also carries what word decoding needs, so that a checkpoint decodes by beam
    search + LM without the training data (:func:`fastasr.recognition.recogniser.with_decoding_data`): the
    lexicon of ``data.train_manifest`` and the word LM of ``final_decoding.lm.path`` when set,
    else the corpus's ``lm/words-3gram.arpa`` (built here when missing; in ``run_dir``'s ``lm/``
    when the corpus directory is read-only)."""
    recogniser = Recogniser.from_model_config(
        OmegaConf.to_container(cfg.model, resolve=True), datamodule.tokenizer, datamodule.feature_config
    )
    recogniser = with_decoding_data(recogniser, training_manifest(cfg.data),
                                    lm_path=OmegaConf.select(cfg, "final_decoding.lm.path", default=None),
                                    lm_dir=run_dir.path if run_dir is not None else None)
    capture = cfg.get("capture_steps", False)  # resolved: resolve_train_config
    lit = lit_module_class(capture)(
        recogniser,
        optimizer=OmegaConf.to_container(cfg.optim, resolve=True),
        scheduler=OmegaConf.to_container(cfg.scheduler, resolve=True) if cfg.get("scheduler") else None,
        capture_steps=capture,
    )
    mean, std = datamodule.cmvn_stats
    lit.model.set_cmvn(mean, std)
    return lit


def start_from(cfg: DictConfig, lit: ASRLitModule, *, resuming: bool) -> None:
    """``init_from=CKPT``: the new run's model starts from that checkpoint's weights
    (:func:`fastasr.training.initial_weights.load_initial_weights`), the report in the run's log; a
    resumed run continues from its own checkpoint instead.

    Raises:
        InitialWeightsError: a checkpoint that cannot be loaded into this model (one line).
    """
    source = cfg.get("init_from")
    if not source:
        return
    if resuming:
        log.info("init_from=%s: not read, the run resumes from its own checkpoint", source)
        return
    report = load_initial_weights(lit.model, lit.recogniser, source)
    for line in report.summary():
        log.info(line)


def final_decoding_request(cfg: DictConfig) -> FinalDecodingRequest:
    """What the final decoding of a training run decodes, from its config: ``final_decoding``
    over ``data.test_manifest``, tuned by ``final_tuning`` on ``data.dev_manifest``, batched as
    ``data`` batches, on the device training ran on, with the run's seed."""
    accelerator = cfg.trainer.get("accelerator")  # decode where training ran
    tuning = cfg.get("final_tuning")
    return FinalDecodingRequest(
        decoding=OmegaConf.to_container(cfg.final_decoding, resolve=True),
        test_manifest=str(cfg.data.test_manifest),
        dev_manifest=str(cfg.data.dev_manifest),  # check_train_config requires it
        tuning=OmegaConf.to_container(tuning, resolve=True) if tuning else None,
        loader=decoding_options(cfg.data),
        training_manifest=training_manifest(cfg.data),
        accelerator=accelerator if accelerator in ("cpu", "gpu", "cuda") else "auto",
        seed=cfg.get("seed"),
        # the same setting as training's bar, judged on stderr, where the decoding's bar goes
        progress=show_progress(cfg.trainer.get("enable_progress_bar", "auto")),
    )


def decode_run(run_dir: RunDir, ckpt: str, *, out: RunDir | None = None, overrides: Sequence[str] = (),
               averaged_from: list[str] | None = None) -> DecodeResult | None:
    """The final decoding of a training run, as its ``config.yaml`` (with the OmegaConf dot-list
    ``overrides``) asks (:func:`final_decoding_request`), by ``ckpt``; files and ``results.json``
    to ``out`` (default: the run directory). What :func:`train` hands over to after its test, and
    what ``python -m fastasr.cli.redecode`` repeats."""
    cfg = OmegaConf.merge(OmegaConf.load(run_dir.config_file), OmegaConf.from_dotlist(list(overrides)))
    return final_decoding(final_decoding_request(cfg), ckpt, out or run_dir, averaged_from=averaged_from)


@dataclass
class TrainingResult:
    """What :func:`train` returns.

    Attributes:
        run_dir: the run directory.
        best_ckpt: the checkpoint of the lowest monitored dev error (None: none written).
        last_ckpt: the latest checkpoint (None: none written).
        val: the last validation's ``val/*`` metrics.
        averaged_ckpt: the averaged weights (``final_average``), which the test and the final
            decoding read; ``averaged_from``: the epoch checkpoints averaged.
        test: training's own test of the split (greedy; :attr:`fastasr.training.lit.ASRLitModule.test_result`:
            ``per``/``cer``, ``wer``, ``utterances``, ``attention``, ...); None: not tested.
        final_decoding: the test split by ``final_decoding`` (:class:`fastasr.recognition.scoring.DecodeResult`).
        learning_warnings: :mod:`fastasr.training.callbacks.not_learning`'s warnings ([]: the run learnt).
        dropout: :mod:`fastasr.training.callbacks.budget_dropout`'s decision (None: no such callback,
            or no epoch ended).
    """

    run_dir: str
    best_ckpt: str | None = None
    last_ckpt: str | None = None
    val: dict[str, float] = field(default_factory=dict)
    averaged_ckpt: str | None = None
    averaged_from: list[str] | None = None
    test: dict[str, Any] | None = None
    final_decoding: DecodeResult | None = None
    learning_warnings: list[dict[str, Any]] = field(default_factory=list)
    dropout: dict[str, Any] | None = None

    @property
    def tested_ckpt(self) -> str | None:
        """The checkpoint the test and the final decoding read: the averaged weights, else the best."""
        return self.averaged_ckpt or self.best_ckpt


def train(cfg: DictConfig, run_dir: str | Path | None = None) -> TrainingResult:
    """Fit (or resume) a model, then score the best checkpoint on the test split.

    ``run_dir``: where the run lives (checkpoints, logs, config.yaml); None: the running
    Hydra job's output directory, else ``cfg.paths.run_dir`` (:func:`run_dir_of`).
    """
    # the values that follow from others are filled in before config.yaml is written; config
    # mistakes fail here, naming the key, before any audio is read
    cfg = resolve_train_config(copy.deepcopy(cfg))
    check_train_config(cfg)
    if is_rank_zero_process():
        choices = dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else {}
        for line in run_summary(cfg, choices).splitlines():
            log.info(line)
    L.seed_everything(cfg.seed, workers=True)
    run_dir = RunDir(run_dir if run_dir is not None else run_dir_of(cfg))
    if is_rank_zero_process():  # a resumed checkpoint must be this config's; a finished run is kept as it is
        ckpt_path = check_run_dir(cfg, run_dir)
    else:  # DDP ranks > 0: rank 0 has checked the same directory
        ckpt_path = run_dir.resolve_ckpt_path(cfg.get("ckpt_path"))
    run_dir.create()
    if is_rank_zero_process():  # DDP: only global rank 0 writes the run's files
        OmegaConf.save(cfg, run_dir.config_file, resolve=True)

    callbacks, loggers = build_callbacks(cfg, run_dir), build_loggers(cfg, run_dir) or False
    # the subsampling factor's one home is the model config; the label-length filter needs it
    datamodule = instantiate(cfg.data, subsampling_factor=cfg.model.get("subsampling", 1), _convert_="all")
    datamodule.setup("fit")
    # the initial weights and training's random stream start from the seed, whatever the data's
    # preparation drew: statistics computed or read from their cache, features built or found
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    lit = build_module(cfg, datamodule, run_dir)
    start_from(cfg, lit, resuming=ckpt_path is not None)

    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers,
                                     default_root_dir=str(run_dir.path), enable_progress_bar=progress_bar(cfg))
    reset_peak_memory()  # this run's peak, not an earlier run's in the same process
    leave_process_group_at_exit()  # DDP: the process group Lightning is about to start ends with the process
    try:
        # checkpoints hold tensors and plain data only (the recogniser bundle included)
        trainer.fit(lit, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except SIGTERMException:
        # Lightning stops after the batch it is in and raises SystemExit *without* a code,
        # i.e. exit status 0: a cluster job script could not tell a preempted run from a
        # finished one. callbacks.PreemptionCheckpoint has by now written step-last.ckpt at
        # this step (in on_exception, before Lightning's teardown), so `last` below is normally it
        # (or last.ckpt of the same step). Say where to resume and exit as a terminated process does.
        last = run_dir.latest_checkpoint()
        log.warning("SIGTERM: training stopped at step %d; rerun the same command to resume from %s",
                    trainer.global_step, last or "the start (no checkpoint was written yet)")
        raise SystemExit(SIGTERM_EXIT_STATUS) from None

    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    last = run_dir.latest_checkpoint()
    result = TrainingResult(
        run_dir=str(run_dir.path), best_ckpt=best or None, last_ckpt=str(last) if last else None,
        val={k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")},
    )
    average = cfg.get("final_average")
    if average and best and trainer.is_global_zero and not trainer.fast_dev_run:
        written = write_averaged_checkpoint(best, last=average.get("last"), best=average.get("best"))
        if written:  # the test and the final decoding read the averaged weights
            best = str(written[0])
            result.averaged_ckpt = best
            result.averaged_from = [str(p) for p in written[1]]
    if trainer.world_size > 1:  # every rank tests the same checkpoint
        best = trainer.strategy.broadcast(best)
    if cfg.get("test") and not trainer.fast_dev_run:
        trainer.test(lit, datamodule=datamodule, ckpt_path=best or None, weights_only=True)
        result.test = lit.test_result
        log.info("test: %s", lit.test_result)
        if cfg.get("final_decoding") and trainer.is_global_zero:
            try:
                result.final_decoding = decode_run(run_dir, best or result.last_ckpt,
                                                   averaged_from=result.averaged_from)
            except Exception:  # the model is trained and tested; a decoding setting must not lose that
                log.exception("final decoding failed; the run is complete: decode it with "
                              "python evaluate.py ckpt_path=%s decoding=...", best or result.last_ckpt)
    # callbacks.not_learning's warnings ([] when the run learnt), also into the final decoding's results.json
    decoded = result.final_decoding is not None
    result.learning_warnings = report_learning_warnings(trainer, run_dir if decoded else None)
    result.dropout = dropout_decision(trainer)
    if decoded and result.dropout is not None:  # results.json says which dropout the model trained with
        run_dir.add_to_results({"budget_dropout": result.dropout})
    finish_wandb()
    return result
