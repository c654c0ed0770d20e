"""Scoring a labelled manifest with a recogniser: decode it (greedy or beam search,
``fastasr.decoding``) and measure the unit and word error rates against its transcripts.

:func:`decode_manifest` is the one scoring path of evaluate.py (``fastasr.recognition.evaluation``), the
decoding tuner, the matrix and training's final decoding; it returns a :class:`DecodeResult`,
whose :meth:`~DecodeResult.to_dict` is what ``results.json`` holds. :func:`decoding_loader`
builds the dataloader of any manifest with the recogniser's tokenizer, features and
subsampling; :func:`tune_recogniser` searches a beam search's LM weight and word score on a
manifest (the emissions computed once, :func:`manifest_emissions`); :func:`decoding_options` and :func:`training_manifest` pick the batching options
and the training manifest out of a data config (``conf/data/*.yaml``).

Transcribing audio without references is the recogniser's own
(:meth:`fastasr.recognition.recogniser.Recogniser.transcribe`)::

    rec = load_recogniser("best.ckpt", attention="i-clustered-100")
    result = decode_manifest(rec, "test.jsonl")      # DecodeResult: result.per, result.wer, result.utterances
    result = decode_manifest(rec, "test.jsonl", decoding={"name": "beam", "lm": {"source": "auto"}})
    json.dumps(result.to_dict())                     # as results.json
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch

from fastasr.data.bad_audio import SkippedAudio
from fastasr.data.datamodule import ASRDataModule
from fastasr.data.manifest import skipped_lines
from fastasr.decoding.emissions import (
    Emission,
    compute_emissions,
    decode_and_score,
    decoding_device,
)
from fastasr.decoding.tune import grid_search
from fastasr.lm.bundled import BundledLM
from fastasr.recognition.recogniser import Recogniser
from fastasr.rundir import RunDir

log = logging.getLogger(__name__)

# Batching keys of a data config (conf/data/*.yaml) that decoding uses.
_LOADER_KEYS = ("max_frames_per_batch", "max_batch_size", "num_workers", "on_bad_utterance")


@dataclass
class DecodeResult:
    """The scores of one decoded manifest (:func:`decode_manifest`).

    Attributes:
        unit_metric: ``per`` (phoneme models) or ``cer`` (character and subword models): the
            name of the unit error rate, and its key in :meth:`to_dict`.
        unit_error_rate: that rate, in percent (:attr:`per` / :attr:`cer`).
        wer: the word error rate, in percent (over phonetic words when ``words == "phonetic"``).
        unit_breakdown, wer_breakdown: ``{"substitutions", "deletions", "insertions",
            "reference", "rate"}`` of each.
        utterances: the utterances scored.
        words: ``real`` (the decoder spells words of a lexicon) or ``phonetic``.
        decoding: the decoder's settings (``describe()``: name, beam size, lexicon, LM, ...).
        forward_seconds: model, features and data loading; ``search_seconds``: the decoder;
            ``decode_seconds``: their sum.
        attention: the attention decoded with (spec string).
        manifest: the manifest scored.
        skipped_audio: ``{"id", "path", "reason"}`` of each utterance left out for unusable audio.
        skipped_lines: ``{"line", "reason"}`` of each manifest line dropped while the manifest was
            read (bad JSON, a missing field, missing or unreadable audio; ``line`` None for
            utterances the tokenizer cannot encode, counted together).
        manifest_lines: the manifest's utterance lines (non-blank); None: not counted.
        search_score: beam search: the sum of the best hypotheses' scores (equal for the same
            emissions, lexicon, LM and settings, whichever of equally scored hypotheses a tie
            picked); None for greedy decoding.
        oov: with a lexicon, the reference words it lacks (``{"words", "missing", "rate",
            "most_frequent"}``); None without one.
        files: the per-utterance ``recogs`` / ``errs`` files written (with ``out_dir``); None: none.
        ckpt_path, averaged_checkpoints, tuned_on_dev: where the model came from, set by
            evaluate.py and training's final decoding; None: not said.
        run_dir: the run directory results.json was written to (not itself in results.json).
    """

    unit_metric: str
    unit_error_rate: float
    wer: float
    unit_breakdown: dict[str, Any]
    wer_breakdown: dict[str, Any]
    utterances: int
    words: str
    decoding: dict[str, Any]
    forward_seconds: float
    search_seconds: float
    decode_seconds: float
    attention: str
    manifest: str
    skipped_audio: list[dict[str, Any]] = field(default_factory=list)
    skipped_lines: list[dict[str, Any]] = field(default_factory=list)
    manifest_lines: int | None = None
    search_score: float | None = None
    oov: dict[str, Any] | None = None
    files: dict[str, str] | None = None
    ckpt_path: str | None = None
    averaged_checkpoints: list[str] | None = None
    tuned_on_dev: dict[str, Any] | None = None
    run_dir: str | None = None

    @property
    def per(self) -> float | None:
        """The phone error rate (%); None for a character or subword model."""
        return self.unit_error_rate if self.unit_metric == "per" else None

    @property
    def cer(self) -> float | None:
        """The character error rate (%); None for a phoneme model."""
        return self.unit_error_rate if self.unit_metric == "cer" else None

    @property
    def skipped_utterances(self) -> int:
        """Manifest lines not scored: dropped while reading, or skipped for unusable audio."""
        return sum(int(s.get("count", 1)) for s in self.skipped_lines) + len(self.skipped_audio)

    def to_dict(self) -> dict[str, Any]:
        """``results.json``: ``{"per"|"cer", "wer", "wer_breakdown", "per_breakdown"|"cer_breakdown",
        "utterances", "words", "decoding", "forward_seconds", "search_seconds", "decode_seconds",
        ["search_score"], ["oov"], ["files"], "attention", "manifest", ["manifest_lines"], "skipped_utterances",
        "skipped_lines", "skipped_audio", ["ckpt_path"], ["averaged_checkpoints"], ["tuned_on_dev"]}`` (bracketed: when set)."""
        metric = self.unit_metric
        out: dict[str, Any] = {metric: self.unit_error_rate, "wer": self.wer, "wer_breakdown": self.wer_breakdown,
                               f"{metric}_breakdown": self.unit_breakdown, "utterances": self.utterances,
                               "words": self.words, "decoding": self.decoding,
                               "forward_seconds": self.forward_seconds, "search_seconds": self.search_seconds,
                               "decode_seconds": self.decode_seconds}
        if self.search_score is not None:
            out["search_score"] = self.search_score
        if self.oov is not None:
            out["oov"] = self.oov
        if self.files is not None:
            out["files"] = self.files
        out.update(attention=self.attention, manifest=self.manifest)
        if self.manifest_lines is not None:
            out["manifest_lines"] = self.manifest_lines
        out.update(skipped_utterances=self.skipped_utterances, skipped_lines=self.skipped_lines,
                   skipped_audio=self.skipped_audio)
        for key in ("ckpt_path", "averaged_checkpoints", "tuned_on_dev"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def decoding_options(data_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The batching options of a data config (``conf/data/*.yaml``) that
    :func:`decoding_loader` takes: frame budget, batch cap, workers, bad-utterance policy."""
    return {k: data_cfg[k] for k in _LOADER_KEYS if data_cfg.get(k) is not None}


def training_manifest(data_cfg: Mapping[str, Any]) -> str | None:
    """The training manifest of a data config (``data.train_manifest``), or None when it is
    unset (null or ``???``): training builds the recogniser's lexicon and LM from it; decoding
    reads it only for ``decoding.lexicon.source`` train/spelling, and for checkpoints that carry
    no lexicon or LM (``auto``); the vocabulary is the checkpoint's."""
    value = data_cfg.get("train_manifest")
    return None if value in (None, "???") else str(value)


def decoding_loader(recogniser: Recogniser, manifest: str | os.PathLike, *, max_frames_per_batch: int = 16000,
                    max_batch_size: int | None = None, num_workers: int = 0,
                    on_bad_utterance: str = "skip") -> torch.utils.data.DataLoader:
    """The evaluation dataloader of ``manifest`` with the recogniser's tokenizer, features and
    subsampling: batches as described in ``fastasr.data.datamodule`` (no shuffling, no
    filtering; utterances with units unknown to the tokenizer are skipped or raise)."""
    datamodule = ASRDataModule(
        tokenizer=recogniser.tokenizer.kind, vocab=recogniser.tokenizer, features=recogniser.features,
        subsampling_factor=recogniser.subsampling, max_frames_per_batch=max_frames_per_batch,
        max_batch_size=max_batch_size, num_workers=num_workers, on_bad_utterance=on_bad_utterance,
    )
    return datamodule.dataloader_for(manifest)


def decode_manifest(recogniser: Recogniser, manifest: str | os.PathLike, *, accelerator: str = "auto",
                    seed: int = 1234, decoding: Mapping[str, Any] | None = None, out_dir: str | os.PathLike | None = None,
                    progress: bool = False, **loader_options: Any) -> DecodeResult:
    """Decode and score ``manifest`` with ``recogniser.model`` (its current attention): the one
    scoring path of evaluate.py, the decoding tuner, the matrix and training's final decoding.

    Args:
        accelerator: ``cpu``, ``gpu`` or ``auto`` (the GPU when there is one).
        seed: fixes the randomised attentions' hashing.
        decoding: a ``conf/decoding`` mapping (``{"name": "beam", "lexicon": ..., "lm": ...,
            "beam_size": ...}``; ``name: auto``: the recogniser's :attr:`~Recogniser.words_decoding`); None: greedy. ``lexicon.source`` / ``lm.source`` ``auto`` use
            the recogniser's own lexicon and word LM (``recogniser.lexicon`` / ``.lm``).
            The lexicon sources ``train`` / ``spelling`` read the recogniser's
            :attr:`~Recogniser.training_manifest` (``load_recogniser(..., training_manifest=)``).
        out_dir: a run directory to write the per-utterance ``recogs-*`` / ``errs-*`` files
            to (tag: the manifest's stem and the decoder's name, e.g. ``test-beam``); None: none.
        progress: a bar on stderr over the utterances, forward pass and search
            (:func:`fastasr.progress.progress_bar`; evaluate.py's ``progress`` setting).
        loader_options: the batching keyword arguments of :func:`decoding_loader`.

    Returns the :class:`DecodeResult` (``to_dict()``: the content of results.json).

    Unusable audio (``fastasr.data.bad_audio``) is skipped, counted and named in the result
    and the log (``on_bad_utterance="raise"``: the first one raises ``BadAudioError``); a
    manifest with no usable audio raises ``AllAudioBadError``.
    """
    if recogniser.model is None:
        raise ValueError("decode_manifest: the recogniser has no model; get one from load_recogniser(ckpt_path)")
    L.seed_everything(seed, workers=True)
    device = decoding_device(accelerator)
    decoder = recogniser.decoder(decoding)
    loader = decoding_loader(recogniser, manifest, **loader_options)
    tag = f"{Path(manifest).stem}-{decoder.describe()['name']}"
    files = RunDir(out_dir).recognition_files(tag) if out_dir is not None else None
    skipped = SkippedAudio(loader_options.get("on_bad_utterance", "skip"))
    scores = decode_and_score(recogniser.model, skipped.batches(loader), recogniser.tokenizer, decoder, device, files,
                              progress=progress, total=len(loader.dataset), desc=f"decode {Path(manifest).name}")
    skipped_audio = skipped.finish(str(manifest))
    lines, dropped = skipped_lines(manifest)  # those the loader's manifest reader dropped (and logged)
    unaccounted = lines - len(dropped) - scores["utterances"] - len(skipped_audio)
    if unaccounted > 0:  # the datamodule drops utterances with units the tokenizer cannot encode
        dropped.append({"line": None, "count": unaccounted,
                        "reason": f"{unaccounted} utterance(s) with units the model's tokenizer cannot encode "
                                  "(named in the log)"})
    metric = recogniser.unit_metric
    return DecodeResult(
        unit_metric=metric, unit_error_rate=scores[metric], wer=scores["wer"],
        unit_breakdown=scores[f"{metric}_breakdown"], wer_breakdown=scores["wer_breakdown"],
        utterances=scores["utterances"], words=scores["words"], decoding=scores["decoding"],
        forward_seconds=scores["forward_seconds"], search_seconds=scores["search_seconds"],
        decode_seconds=scores["decode_seconds"], attention=recogniser.model.attention_spec, manifest=str(manifest),
        skipped_audio=skipped_audio, skipped_lines=dropped, manifest_lines=lines,
        search_score=scores.get("search_score"), oov=scores.get("oov"),
        files=scores.get("files"),
    )


@dataclass
class TuningResult:
    """A search of the beam search's LM weight and word score on a manifest (:func:`tune_recogniser`).

    Attributes:
        manifest: the manifest searched on (the dev split).
        best: the best point, ``{"lm_weight", "word_score", "wer", <unit metric>, "seconds"}``.
        points: every point, best first (lowest WER, then unit error rate).
        lm: the LM searched with: a file path, or where the recogniser's own LM was read at
            training time; ``lm_sha256``: that LM's hash when it is the recogniser's own.
        skipped_audio: the utterances whose audio was left out (reported, not fatal).
        ckpt_path: the checkpoint tuned (``python -m fastasr.cli.tune``).
        vocabularies, beam_size, decoding: training's final tuning
            (:func:`fastasr.recognition.final_decoding.tune_vocabulary_and_weights`): each vocabulary tried with its
            best point and grid, the grid's beam, and the decoding spec chosen.
    """

    manifest: str
    best: dict[str, float]
    points: list[dict[str, float]]
    lm: str | None = None
    lm_sha256: str | None = None
    skipped_audio: list[dict[str, Any]] = field(default_factory=list)
    ckpt_path: str | None = None
    vocabularies: list[dict[str, Any]] | None = None
    beam_size: int | None = None
    decoding: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data, as ``tune.json`` holds it: ``ckpt_path`` (when set), ``manifest``, ``lm``,
        ``lm_sha256``, ``best``, ``points``, ``skipped_audio``, and the final tuning's keys when set."""
        out = {"ckpt_path": self.ckpt_path} if self.ckpt_path is not None else {}
        out.update(manifest=self.manifest, lm=self.lm, lm_sha256=self.lm_sha256, best=self.best,
                   points=self.points, skipped_audio=self.skipped_audio)
        out.update({k: getattr(self, k) for k in ("vocabularies", "beam_size", "decoding")
                    if getattr(self, k) is not None})
        return out


def manifest_emissions(recogniser: Recogniser, manifest: str, *, accelerator: str = "auto",
                       **loader_options: Any) -> tuple[list[Emission], list]:
    """``manifest``'s emissions under ``recogniser`` and the utterances whose audio was left out
    (reported, not fatal). ``loader_options``: :func:`decoding_options`."""
    loader = decoding_loader(recogniser, manifest, **loader_options)
    skipped = SkippedAudio(loader_options.get("on_bad_utterance", "skip"))  # unusable audio: left out, reported
    start = time.perf_counter()
    emissions = compute_emissions(recogniser.model, skipped.batches(loader), recogniser.tokenizer,
                                  decoding_device(accelerator))
    skipped_audio = skipped.finish(str(manifest))
    log.info("emissions of %d utterances of %s in %.1f s", len(emissions), manifest, time.perf_counter() - start)
    return emissions, skipped_audio


def tune_recogniser(recogniser: Recogniser, manifest: str, decoding: Mapping[str, Any], lm_weights: Sequence[float],
                    word_scores: Sequence[float], *, accelerator: str = "auto", extend_edges: int = 0,
                    emissions: tuple[list[Emission], list] | None = None, **loader_options: Any) -> TuningResult:
    """Compute ``manifest``'s emissions with ``recogniser`` once (or take ``emissions``, what
    :func:`manifest_emissions` returned for it) and search the (lm_weight, word_score) grid of
    the ``decoding`` config over them, grown past an edge the best point sits on up to
    ``extend_edges`` values per axis (:func:`fastasr.decoding.tune.grid_search`).
    ``loader_options``: :func:`decoding_options` of a data config."""
    if emissions is None:
        emissions = manifest_emissions(recogniser, manifest, accelerator=accelerator, **loader_options)
    emissions, skipped_audio = emissions
    spec = dict(decoding, name="beam")
    lexicon = recogniser.decoding_lexicon(spec.get("lexicon"))  # built once for the grid

    def decoder_for(lm_weight: float, word_score: float):
        return recogniser.decoder(dict(spec, lm_weight=lm_weight, word_score=word_score), lexicon=lexicon)

    points = grid_search(emissions, recogniser.tokenizer, decoder_for, list(lm_weights), list(word_scores),
                         extend_edges=extend_edges)
    lm = recogniser.decoding_lm(spec.get("lm"))
    return TuningResult(manifest=str(manifest), best=points[0], points=points,
                        lm=lm.path if isinstance(lm, BundledLM) else lm,  # the checkpoint's LM: where it was built
                        lm_sha256=lm.sha256 if isinstance(lm, BundledLM) else None, skipped_audio=skipped_audio)
