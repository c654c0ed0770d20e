"""Training entry: compose config → derive its computed values → instantiate data, model,
trainer → fit → test.

``python train.py`` (Hydra) calls :func:`train`; tests call it with a composed config. The values
a config derives from others (``data.tokenizer`` from a top-level ``tokenizer=``, the batch price
of the attention, the checkpoint monitor, a matrix member's attention) are filled in by
:func:`fastasr.derived_config.derive_train_config` at its start.
"""

from __future__ import annotations

import copy
import logging
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.utils import get_class, instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf, open_dict

import fastasr.config  # noqa: F401  (PROJECT_ROOT for conf/paths)
from fastasr.callbacks import report_learning_warnings, reset_peak_memory
from fastasr.checkpoint_averaging import write_averaged_checkpoint
from fastasr.config_check import ConfigError, check_run_dir, check_train_config
from fastasr.data.tokenizer import unit_metric
from fastasr.decoding.beam import BeamSearchOptions
from fastasr.derived_config import derive_train_config
from fastasr.distributed import is_rank_zero_process, leave_process_group_at_exit
from fastasr.lit import ASRLitModule
from fastasr.lm.build import build as build_lm
from fastasr.loggers import build_loggers, finish_wandb
from fastasr.progress import show_progress
from fastasr.recogniser import Recogniser, load_recogniser, with_decoding_data
from fastasr.rundir import RunDir
from fastasr.scoring import (
    DecodeResult,
    TuningResult,
    decode_manifest,
    decoding_options,
    manifest_emissions,
    training_manifest,
    tune_recogniser,
)

log = logging.getLogger(__name__)

SIGTERM_EXIT_STATUS = 143  # 128 + SIGTERM: what a shell reports for a job terminated by SIGTERM


def run_dir_of(cfg: DictConfig) -> Path:
    """The run directory: Hydra's output dir when running under Hydra, else ``paths.run_dir``."""
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(cfg.paths.run_dir)


def build_callbacks(cfg: DictConfig, run_dir: RunDir) -> list[L.Callback]:
    """The callbacks of ``cfg.callbacks``; checkpoints go to the run's checkpoint directory."""
    callbacks = []
    for ccfg in (cfg.get("callbacks") or {}).values():
        if ccfg is None or "_target_" not in ccfg:
            continue
        writes_checkpoints = issubclass(get_class(ccfg._target_), ModelCheckpoint)
        extra = {"dirpath": str(run_dir.checkpoints)} if writes_checkpoints else {}
        callbacks.append(instantiate(ccfg, **extra))
    return callbacks


def build_module(cfg: DictConfig, datamodule, run_dir: RunDir | None = None) -> ASRLitModule:
    """The LightningModule for ``cfg.model`` with the data's tokenizer, features and CMVN stats.

    ``cfg.model`` is a Hydra partial of the model class its ``_target_`` names; the recogniser
    keeps it as plain data and completes it with the data's sizes, ``vocab_size`` (the tokenizer's)
    and ``feat_in`` (the filterbank bins): :meth:`fastasr.recogniser.Recogniser.build_model`,
    the one place a model is built, in training and at checkpoint loading alike.

    Its recogniser also carries what word decoding needs, so that a checkpoint decodes by beam
    search + LM without the training data (:func:`fastasr.recogniser.with_decoding_data`): the
    lexicon of ``data.train_manifest`` and the word LM of ``final_decoding.lm.path`` when set,
    else the corpus's ``lm/words-3gram.arpa`` (built here when missing; in ``run_dir``'s ``lm/``
    when the corpus directory is read-only)."""
    recogniser = Recogniser.from_model_config(
        OmegaConf.to_container(cfg.model, resolve=True), datamodule.tokenizer, datamodule.feature_config
    )
    recogniser = with_decoding_data(recogniser, training_manifest(cfg.data),
                                    lm_path=OmegaConf.select(cfg, "final_decoding.lm.path", default=None),
                                    lm_dir=run_dir.path if run_dir is not None else None)
    lit = ASRLitModule(
        recogniser,
        optimizer=OmegaConf.to_container(cfg.optim, resolve=True),
        scheduler=OmegaConf.to_container(cfg.scheduler, resolve=True) if cfg.get("scheduler") else None,
    )
    mean, std = datamodule.cmvn_stats
    lit.model.set_cmvn(mean, std)
    return lit


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
        test: training's own test of the split (greedy; :attr:`fastasr.lit.ASRLitModule.test_result`:
            ``per``/``cer``, ``wer``, ``utterances``, ``attention``, ...); None: not tested.
        final_decoding: the test split by ``final_decoding`` (:class:`fastasr.scoring.DecodeResult`).
        learning_warnings: :mod:`fastasr.callbacks.not_learning`'s warnings ([]: the run learnt).
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

    @property
    def tested_ckpt(self) -> str | None:
        """The checkpoint the test and the final decoding read: the averaged weights, else the best."""
        return self.averaged_ckpt or self.best_ckpt


def train(cfg: DictConfig, run_dir: str | Path | None = None) -> TrainingResult:
    """Fit (or resume) a model, then score the best checkpoint on the test split.

    ``run_dir``: where the run lives (checkpoints, logs, config.yaml); None: the running
    Hydra job's output directory, else ``cfg.paths.run_dir`` (:func:`run_dir_of`).
    """
    check_train_config(cfg)  # config mistakes fail here, naming the key, before any audio is read
    derive_train_config(cfg)  # the values that follow from others: before config.yaml is written
    L.seed_everything(cfg.seed, workers=True)
    run_dir = RunDir(run_dir if run_dir is not None else run_dir_of(cfg))
    if is_rank_zero_process():  # a resumed checkpoint must be this config's; a finished run is kept as it is
        ckpt_path = check_run_dir(cfg, run_dir)
    else:  # DDP ranks > 0: rank 0 has checked the same directory
        ckpt_path = run_dir.resolve_ckpt_path(cfg.get("ckpt_path"))
    run_dir.create()
    if is_rank_zero_process():  # DDP: only global rank 0 writes the run's files
        OmegaConf.save(cfg, run_dir.config_file, resolve=True)

    # the subsampling factor's one home is the model config; the label-length filter needs it
    datamodule = instantiate(cfg.data, subsampling_factor=cfg.model.get("subsampling", 1), _convert_="all")
    datamodule.setup("fit")
    lit = build_module(cfg, datamodule, run_dir)

    trainer: L.Trainer = instantiate(
        cfg.trainer,
        callbacks=build_callbacks(cfg, run_dir),
        logger=build_loggers(cfg, run_dir) or False,
        default_root_dir=str(run_dir.path),
    )
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
                result.final_decoding = final_decoding(cfg, best or result.last_ckpt, run_dir,
                                                       averaged_from=result.averaged_from)
            except Exception:  # the model is trained and tested; a decoding setting must not lose that
                log.exception("final decoding failed; the run is complete: decode it with "
                              "python evaluate.py ckpt_path=%s decoding=...", best or result.last_ckpt)
    # callbacks.not_learning's warnings ([] when the run learnt), also into the final decoding's results.json
    decoded = result.final_decoding is not None
    result.learning_warnings = report_learning_warnings(trainer, run_dir if decoded else None)
    finish_wandb()
    return result


class TrainPreflight(Callback):
    """Hydra callback of ``train.py`` (conf/hydra/default.yaml): before Hydra creates the run
    directory and writes its ``.hydra/`` and ``train.log``, check the config
    (:func:`fastasr.config_check.check_train_config`) and what it would do to the run directory
    (:func:`fastasr.config_check.check_run_dir`). A refusal prints its message, without a
    traceback, and exits with status 2: a rejected command leaves no trace in any run directory.
    :func:`train` checks again (it is also called without Hydra)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not is_rank_zero_process():
            return
        cfg = copy.deepcopy(config)
        with open_dict(cfg):
            run_dir = Path(str(cfg.hydra.run.dir))
            del cfg["hydra"]
        try:
            check_train_config(cfg)
            check_run_dir(derive_train_config(cfg), RunDir(run_dir))
        except (ConfigError, FileExistsError, FileNotFoundError) as err:
            print(f"train.py: {err}", file=sys.stderr)
            raise SystemExit(2) from None


def tune_vocabulary_and_weights(recogniser: Recogniser, cfg: DictConfig, spec: dict[str, Any],
                                run_dir: RunDir, accelerator: str) -> TuningResult:
    """Choose the final decoding's vocabulary, LM weight and word score on the dev split.

    ``cfg.final_tuning.frequent_words`` lists the vocabularies to try: ``0`` is the recogniser's
    own lexicon and word LM (the training words); ``N`` adds the N most frequent words of
    ``final_tuning.language`` (wordfreq) spelt in the training text's characters, to the lexicon
    and, weighted by their frequency, to a word LM re-estimated from the training text
    (``python -m fastasr.cli.lm build --frequent-words N``; files under the run's ``lm/``). Only a
    char model can spell added words; other units try ``0`` alone. Each vocabulary's (lm_weight,
    word_score) grid is searched (:func:`fastasr.scoring.tune_recogniser`) and the lowest
    dev WER (then unit error rate) wins, so a corpus whose test words are the training words
    (spelled letters, digits, commands) keeps its own vocabulary. ``final_tuning.beam_size``
    (optional) is the beam the grid searches with, narrower than the final decoding's own: the
    grid re-runs the search once per point, and its best weights carry to the wider beam.

    The model runs over dev once (:func:`fastasr.scoring.manifest_emissions`); each
    vocabulary re-runs only the search. Returns the winner's :class:`~fastasr.scoring.TuningResult`
    with ``vocabularies`` (``[{"frequent_words", "lexicon", "lm", "best", "points"}, ...]``),
    ``beam_size`` (the grid's) and ``decoding`` (the chosen spec) set."""
    tuning = cfg.final_tuning
    train_manifest = recogniser.training_manifest
    sizes = [int(n) for n in (tuning.get("frequent_words") or [0])]
    if recogniser.tokenizer.kind != "char" and any(sizes):
        log.info("final tuning: frequent_words %s left out: added words are spelt, and this is a %s model",
                 [n for n in sizes if n], recogniser.tokenizer.kind)
        sizes = [0]
    if any(sizes) and not (train_manifest and Path(train_manifest).is_file()):
        log.warning("final tuning: frequent_words %s left out: the training manifest %s (whose text the LM is "
                    "estimated from) is not here", [n for n in sizes if n], train_manifest)
        sizes = [0]
    grid_beam = int(tuning.get("beam_size") or spec.get("beam_size") or BeamSearchOptions.beam_size)
    dev = manifest_emissions(recogniser, cfg.data.dev_manifest, accelerator=accelerator,
                             **decoding_options(cfg.data))  # the model runs once; each vocabulary re-runs the search
    vocabularies, searches = [], []  # per vocabulary: its results.json entry; its tune result and decoding spec
    for n in dict.fromkeys(sizes):
        candidate = dict(spec)
        files = {"lexicon": None, "lm": None}
        if n:
            language = str(tuning.get("language") or "en")
            stem = run_dir.path / "lm" / f"words-3gram-{language}{n}"
            files = {"lexicon": str(stem.with_suffix(".lex")), "lm": str(stem.with_suffix(".arpa"))}
            if not all(Path(f).is_file() for f in files.values()):
                info = build_lm([train_manifest], files["lm"], frequent_words=n, language=language,
                                lexicon_out=files["lexicon"])
                log.info("final tuning: word LM with the %d most frequent %s words: %s (%d words not in the "
                         "training text)", n, language, files["lm"], info["added_words"])
            for key, path in files.items():
                candidate[key] = dict(candidate.get(key) or {}, path=path)
        tuned = tune_recogniser(recogniser, cfg.data.dev_manifest, dict(candidate, beam_size=grid_beam),
                                tuning.lm_weight, tuning.word_score,
                                accelerator=accelerator, emissions=dev)
        point = dict(tuned.best, frequent_words=n)
        vocabularies.append({"frequent_words": n, **files, "best": point, "points": tuned.points})
        searches.append((tuned, candidate))
        log.info("final tuning, frequent_words=%d: best dev WER %.2f (lm_weight=%g word_score=%g)", n,
                 point["wer"], point["lm_weight"], point["word_score"])
    unit = unit_metric(recogniser.tokenizer.kind)  # the tie-break after WER; on a full tie the first listed wins
    i = min(range(len(vocabularies)), key=lambda i: (vocabularies[i]["best"]["wer"], vocabularies[i]["best"][unit]))
    (tuned, candidate), point = searches[i], vocabularies[i]["best"]
    log.info("final decoding: frequent_words=%d lm_weight=%g word_score=%g, tuned on the dev split "
             "(dev WER %.2f)", point["frequent_words"], point["lm_weight"], point["word_score"], point["wer"])
    return replace(tuned, best=point, vocabularies=vocabularies, beam_size=grid_beam,
                   decoding=dict(candidate, lm_weight=point["lm_weight"], word_score=point["word_score"]))


def final_decoding(cfg: DictConfig, ckpt: str | None, run_dir: RunDir,
                   averaged_from: list[str] | None = None) -> DecodeResult | None:
    """Decode the test split with ``ckpt`` by ``cfg.final_decoding`` (a ``conf/decoding``
    option; beam search by default), through the decoding path evaluate.py takes, so that a
    training ends with the word error rate over real words.

    The lexicon and word LM are the checkpoint's own (written at training start, see
    :func:`build_module`), so this is what ``python evaluate.py ckpt_path=CKPT decoding=beam_lm``
    gives later, wherever the checkpoint is. Skipped (None) when no lexicon can be had for the
    model (a subword model, or a phoneme model whose training manifest has no phonemes): beam
    search would give phonetic words only. An LM that cannot be had is left out with a warning.
    With ``cfg.final_tuning`` (``{lm_weight: [...], word_score: [...]}``, optionally
    ``frequent_words`` and ``language``) and an LM, the LM weight and word score, and the
    vocabulary, are first chosen on the dev split (:func:`tune_vocabulary_and_weights`; never the
    test split), and the grids are kept in ``results.json`` under ``tuned_on_dev``.
    ``averaged_from``: the epoch checkpoints ``ckpt`` averages (``final_average``), recorded as
    ``averaged_checkpoints``. Writes ``results.json`` and the recogs/errs files to the run directory.
    """
    if not ckpt:
        return None
    spec = OmegaConf.to_container(cfg.final_decoding, resolve=True)
    recogniser = load_recogniser(ckpt, training_manifest=training_manifest(cfg.data))
    lexicon = spec.get("lexicon") or {}
    if not lexicon.get("path") and recogniser.resolved_lexicon_source(lexicon) == "none":
        log.info("final decoding skipped: no lexicon for this %s model (final_decoding.lexicon)",
                 recogniser.tokenizer.kind)
        return None
    if spec.get("name") == "beam":
        lm = spec.get("lm") or {}
        try:
            resolved = recogniser.decoding_lm(lm)
        except FileNotFoundError as err:
            resolved, lm = None, {"source": "none", "path": None}
            log.warning("final decoding without an LM: %s", err)
        if isinstance(resolved, str) and not Path(resolved).is_file():
            log.warning("final decoding without an LM: %s does not exist", resolved)
            lm = {"source": "none", "path": None}
        spec["lm"] = lm
    accelerator = cfg.trainer.get("accelerator")  # decode where training ran
    accelerator = accelerator if accelerator in ("cpu", "gpu", "cuda") else "auto"
    tuning = cfg.get("final_tuning")
    tuned = None
    if tuning and spec.get("name") == "beam" and (spec.get("lm") or {}).get("source") != "none":
        tuned = tune_vocabulary_and_weights(recogniser, cfg, spec, run_dir, accelerator)
        spec = tuned.decoding
    decoded = decode_manifest(recogniser, cfg.data.test_manifest, accelerator=accelerator, seed=cfg.seed,
                              decoding=spec, out_dir=run_dir.path,
                              progress=bool(cfg.trainer.get("enable_progress_bar", True)) and show_progress("auto"),
                              **decoding_options(cfg.data))
    tuned_on_dev = None if tuned is None else {k: getattr(tuned, k) for k in ("manifest", "best", "points",
                                                                            "vocabularies", "beam_size")}
    decoded = replace(decoded, ckpt_path=str(ckpt), tuned_on_dev=tuned_on_dev, averaged_checkpoints=averaged_from)
    run_dir.write_results(decoded.to_dict())
    log.info("test, %s decoding (%s words): %s", decoded.decoding["name"], decoded.words,
             {k: getattr(decoded, k) for k in ("per", "cer", "wer", "decode_seconds")})
    return decoded
