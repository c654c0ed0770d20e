"""Scoring a labelled manifest with a recogniser: decode it (greedy or beam search,
``fastasr.decoding``) and measure the unit and word error rates against its transcripts.

:func:`decode_manifest` is the one scoring path of evaluate.py (``fastasr.evaluation``), the
decoding tuner, the matrix and training's final decoding; it returns a :class:`DecodeResult`,
whose :meth:`~DecodeResult.to_dict` is what ``results.json`` holds. :func:`decoding_loader`
builds the dataloader of any manifest with the recogniser's tokenizer, features and
subsampling; :func:`decoding_options` and :func:`training_manifest` pick the batching options
and the training manifest out of a data config (``conf/data/*.yaml``).

Transcribing audio without references is the recogniser's own
(:meth:`fastasr.recogniser.Recogniser.transcribe`)::

    rec = load_recogniser("best.ckpt", attention="i-clustered-100")
    result = decode_manifest(rec, "test.jsonl")      # DecodeResult: result.per, result.wer, result.utterances
    result = decode_manifest(rec, "test.jsonl", decoding={"name": "beam", "lm": {"source": "auto"}})
    json.dumps(result.to_dict())                     # as results.json
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch

from fastasr.data.bad_audio import SkippedAudio
from fastasr.data.datamodule import ASRDataModule
from fastasr.data.manifest import skipped_lines
from fastasr.decoding.builder import build_decoder
from fastasr.decoding.transcribe import decode_and_score, decoding_device
from fastasr.recogniser import Recogniser
from fastasr.rundir import RunDir

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
                    seed: int = 1234, decoding: Mapping[str, Any] | None = None,
                    train_manifest: str | os.PathLike | None = None, out_dir: str | os.PathLike | None = None,
                    progress: bool = False, **loader_options: Any) -> DecodeResult:
    """Decode and score ``manifest`` with ``recogniser.model`` (its current attention): the one
    scoring path of evaluate.py, the decoding tuner, the matrix and training's final decoding.

    Args:
        accelerator: ``cpu``, ``gpu`` or ``auto`` (the GPU when there is one).
        seed: fixes the randomised attentions' hashing.
        decoding: a ``conf/decoding`` mapping (``{"name": "beam", "lexicon": ..., "lm": ...,
            "beam_size": ...}``; ``name: auto``: the recogniser's :attr:`~Recogniser.words_decoding`); None: greedy. ``lexicon.source`` / ``lm.source`` ``auto`` use
            the recogniser's own lexicon and word LM (``recogniser.lexicon`` / ``.lm``).
        train_manifest: where the lexicon of ``lexicon.source: train | spelling`` comes from (the
            words and pronunciations spoken in training), and ``auto``'s lexicon and LM for a
            recogniser that carries none (older checkpoints); None: no such lexicon.
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
    decoder, _ = build_decoder(recogniser.decoding_spec(decoding), recogniser.tokenizer, train_manifest,
                               bundled_lexicon=recogniser.lexicon, bundled_lm=recogniser.lm)
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
