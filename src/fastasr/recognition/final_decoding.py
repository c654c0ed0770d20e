"""Training's final decoding: the test split decoded with real words, by the checkpoint alone.

:func:`final_decoding` is what training hands over to after its test (through
:func:`fastasr.training.fit.decode_run`, from the run's ``config.yaml``): the
beam search of ``final_decoding`` (``conf/decoding``), with the vocabulary, LM weight and word
score first chosen on the dev split (:func:`tune_vocabulary_and_weights`, ``final_tuning``),
through the scoring path evaluate.py takes (:func:`fastasr.recognition.scoring.decode_manifest`).
What to decode comes as a :class:`FinalDecodingRequest` (training builds it from its config:
:func:`fastasr.training.fit.final_decoding_request`); nothing here reads a training config.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fastasr.data.tokenizer import unit_metric
from fastasr.decoding.beam import BeamSearchOptions
from fastasr.lm.build import build as build_lm
from fastasr.recognition.loading import load_recogniser
from fastasr.recognition.recogniser import Recogniser
from fastasr.recognition.scoring import (
    DecodeResult,
    TuningResult,
    decode_manifest,
    manifest_emissions,
    tune_recogniser,
)
from fastasr.rundir import RunDir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FinalDecodingRequest:
    """What training asks of its final decoding.

    Attributes:
        decoding: the decoding (a ``conf/decoding`` mapping: ``final_decoding``).
        test_manifest: the split decoded and scored.
        dev_manifest: the split the tuning grid is searched on (None: no tuning).
        tuning: ``final_tuning`` (``lm_weight`` and ``word_score`` lists; optionally
            ``extend_edges``, ``frequent_words``, ``language``, ``beam_size``); None or empty: no tuning.
        loader: the decoding loader's batching (:func:`fastasr.recognition.scoring.decoding_loader`'s
            keyword arguments: frame budget, batch cap, workers, bad-utterance policy).
        training_manifest: the manifest the model was trained on, for the lexicon sources that read
            it (:func:`fastasr.recognition.loading.load_recogniser`); None: none.
        accelerator: where to decode (``cpu``, ``gpu``/``cuda`` or ``auto``).
        seed: the decoding's seed (hashing attentions).
        progress: a progress bar over the test utterances.
    """

    decoding: Mapping[str, Any]
    test_manifest: str
    dev_manifest: str | None = None
    tuning: Mapping[str, Any] | None = None
    loader: Mapping[str, Any] = field(default_factory=dict)
    training_manifest: str | None = None
    accelerator: str = "auto"
    seed: int | None = None
    progress: bool = False


def tune_vocabulary_and_weights(recogniser: Recogniser, request: FinalDecodingRequest, spec: dict[str, Any],
                                run_dir: RunDir) -> TuningResult:
    """Choose the final decoding's vocabulary, LM weight and word score on ``request.dev_manifest``.

    ``request.tuning["frequent_words"]`` lists the vocabularies to try: ``0`` is the recogniser's
    own lexicon and word LM (the training words); ``N`` adds the N most frequent words of
    ``final_tuning.language`` (wordfreq) spelt in the training text's characters, to the lexicon
    and, weighted by their frequency, to a word LM re-estimated from the training text
    (``python -m fastasr.cli.lm build --frequent-words N``; files under the run's ``lm/``). Only a
    char model can spell added words; other units try ``0`` alone. Each vocabulary's (lm_weight,
    word_score) grid is searched (:func:`fastasr.recognition.scoring.tune_recogniser`; grown past an
    edge its best point sits on, up to ``extend_edges`` values per axis) and the lowest
    dev WER (then unit error rate) wins, so a corpus whose test words are the training words
    (spelled letters, digits, commands) keeps its own vocabulary. ``final_tuning.beam_size``
    (optional) is the beam the grid searches with, narrower than the final decoding's own: the
    grid re-runs the search once per point, and its best weights carry to the wider beam.

    The model runs over dev once (:func:`fastasr.recognition.scoring.manifest_emissions`); each
    vocabulary re-runs only the search. Returns the winner's :class:`~fastasr.recognition.scoring.TuningResult`
    with ``vocabularies`` (``[{"frequent_words", "lexicon", "lm", "best", "points"}, ...]``),
    ``beam_size`` (the grid's) and ``decoding`` (the chosen spec) set."""
    tuning, accelerator = request.tuning or {}, request.accelerator
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
    dev = manifest_emissions(recogniser, request.dev_manifest, accelerator=accelerator,
                             **request.loader)  # the model runs once; each vocabulary re-runs the search
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
        tuned = tune_recogniser(recogniser, request.dev_manifest, dict(candidate, beam_size=grid_beam),
                                list(tuning["lm_weight"]), list(tuning["word_score"]),
                                accelerator=accelerator, extend_edges=int(tuning.get("extend_edges") or 0),
                                emissions=dev)
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


def final_decoding(request: FinalDecodingRequest, ckpt: str | None, run_dir: RunDir,
                   averaged_from: list[str] | None = None) -> DecodeResult | None:
    """Decode ``request.test_manifest`` with ``ckpt`` by ``request.decoding`` (a ``conf/decoding``
    option; beam search by default), through the decoding path evaluate.py takes, so that a
    training ends with the word error rate over real words.

    The lexicon and word LM are the checkpoint's own (written at training start, see
    :func:`build_module`), so this is what ``python evaluate.py ckpt_path=CKPT decoding=beam_lm``
    gives later, wherever the checkpoint is. Skipped (None) when no lexicon can be had for the
    model (a subword model, or a phoneme model whose training manifest has no phonemes): beam
    search would give phonetic words only. An LM that cannot be had is left out with a warning.
    With ``request.tuning`` (``{lm_weight: [...], word_score: [...]}``, optionally
    ``frequent_words`` and ``language``) and an LM, the LM weight and word score, and the
    vocabulary, are first chosen on the dev split (:func:`tune_vocabulary_and_weights`; never the
    test split), and the grids are kept in ``results.json`` under ``tuned_on_dev``.
    ``averaged_from``: the epoch checkpoints ``ckpt`` averages (``final_average``), recorded as
    ``averaged_checkpoints``. Writes ``results.json`` and the recogs/errs files to the run directory.
    """
    if not ckpt:
        return None
    spec = dict(request.decoding)
    recogniser = load_recogniser(ckpt, training_manifest=request.training_manifest)
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
    tuned = None
    if (request.tuning and request.dev_manifest and spec.get("name") == "beam"
            and (spec.get("lm") or {}).get("source") != "none"):
        tuned = tune_vocabulary_and_weights(recogniser, request, spec, run_dir)
        spec = tuned.decoding
    decoded = decode_manifest(recogniser, request.test_manifest, accelerator=request.accelerator, seed=request.seed,
                              decoding=spec, out_dir=run_dir.path, progress=request.progress, **request.loader)
    tuned_on_dev = None if tuned is None else {k: getattr(tuned, k) for k in ("manifest", "best", "points",
                                                                            "vocabularies", "beam_size")}
    decoded = replace(decoded, ckpt_path=str(ckpt), tuned_on_dev=tuned_on_dev, averaged_checkpoints=averaged_from)
    run_dir.write_results(decoded.to_dict())
    log.info("test, %s decoding (%s words): %s", decoded.decoding["name"], decoded.words,
             {k: getattr(decoded, k) for k in ("per", "cer", "wer", "decode_seconds")})
    return decoded
