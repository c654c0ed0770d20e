"""The transcription job: what ``fastasr-transcribe`` runs (:func:`run_transcription`) around the
recogniser's loop (:mod:`fastasr.recognition.audio_decoding`): its inputs (:func:`resolve_inputs`),
its output files and its closing lines (:func:`summary`); the output formats are
:mod:`fastasr.decoding.transcript_formats`'. The command's usage is in :mod:`fastasr.cli.transcribe`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import torch
from omegaconf import DictConfig, OmegaConf

import fastasr.config  # noqa: F401  (PROJECT_ROOT for conf/paths)
from fastasr.data.audio import BadAudioError
from fastasr.data.bad_audio import SkippedUtterance, describe_skipped
from fastasr.data.manifest import ManifestError, read_manifest
from fastasr.data.recordings import AUDIO_EXTENSIONS, Recording
from fastasr.decoding.transcript_formats import Transcription, ctm_lines, srt_text
from fastasr.decoding.windows import LongFormConfig
from fastasr.progress import show_progress
from fastasr.recognition.evaluation import decoding_label
from fastasr.recognition.loading import load_recogniser
from fastasr.recognition.streaming import stream_recording
from fastasr.rundir import RunDir

log = logging.getLogger(__name__)

MANIFEST_SUFFIXES = (".jsonl", ".json")


# ---------------------------------------------------------------------- inputs
def resolve_inputs(specs: Sequence[str] | str, stdin: IO[str] | None = None) -> tuple[list[Recording],
                                                                                       list[SkippedUtterance]]:
    """The recordings ``specs`` name, and the inputs that name none (with the reason).

    Each spec is a file (an audio file, or a manifest by its ``.jsonl``/``.json`` suffix), a
    directory (its audio files, recursively, sorted), or ``-`` (one such spec per line of
    ``stdin``; blank lines and ``#`` comments skipped). A missing path, a directory without
    audio files and an unreadable manifest are reported, not raised. Ids are made unique
    (``name``, ``name-2``, ...)."""
    specs = [specs] if isinstance(specs, str) else list(specs)
    recordings: list[Recording] = []
    problems: list[SkippedUtterance] = []
    for spec in specs:
        spec = str(spec)
        if spec == "-":
            lines = [line.strip() for line in (stdin if stdin is not None else sys.stdin)]
            found, bad = resolve_inputs([ln for ln in lines if ln and not ln.startswith("#") and ln != "-"])
            recordings += found
            problems += bad
            continue
        path = Path(spec)
        if not path.exists():
            problems.append(SkippedUtterance(path.name or spec, spec, "no such file or directory"))
        elif path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix.lower() in AUDIO_EXTENSIONS and p.is_file())
            if not files:
                problems.append(SkippedUtterance(path.name or spec, spec, "a directory with no audio files in it (searched "
                                                 f"recursively for {', '.join(sorted(AUDIO_EXTENSIONS))})"))
            recordings += [Recording(p.stem, str(p)) for p in files]
        elif path.suffix.lower() in MANIFEST_SUFFIXES:
            try:
                utterances = read_manifest(path, on_error="skip", check_audio=False, require_text=False)
            except (ManifestError, OSError, UnicodeDecodeError) as err:
                problems.append(SkippedUtterance(path.name, spec, f"unusable manifest: {err}"))
                continue
            recordings += [Recording.of(u) for u in utterances]
        else:
            recordings.append(Recording(path.stem, spec))
    seen: dict[str, int] = {}
    unique = []
    for rec in recordings:
        seen[rec.id] = seen.get(rec.id, 0) + 1
        unique.append(rec if seen[rec.id] == 1 else Recording(f"{rec.id}-{seen[rec.id]}", rec.audio_filepath,
                                                               duration=rec.duration))
    return unique, problems


# ---------------------------------------------------------------------- the command
def run_transcription(cfg: DictConfig, stdin: IO[str] | None = None, stdout: IO[str] | None = None,
                      run_dir: str | Path | None = None) -> dict[str, Any]:
    """Transcribe ``cfg.audio`` with ``cfg.ckpt_path`` (``conf/transcribe.yaml``): print
    ``path<TAB>text`` per file on ``stdout``, write the run directory's files (module docstring)
    and return the report (``transcribe.json``): ``transcribed``, ``failed`` (``{"id", "path",
    "reason"}`` each), ``inputs``, ``audio_seconds``, ``wall_seconds`` (reading the inputs to the
    last file written), ``rtf`` (their ratio), ``load_seconds`` (checkpoint and decoder), the
    settings and ``files``."""
    from hydra.core.hydra_config import HydraConfig

    stdout = stdout if stdout is not None else sys.stdout
    if run_dir is None:
        run_dir = (HydraConfig.get().runtime.output_dir if HydraConfig.initialized()
                   else Path(cfg.paths.output_dir) / "transcribe")
    run = RunDir(run_dir).create()
    audio = cfg.audio if isinstance(cfg.audio, str) else list(cfg.audio)
    recordings, failed = resolve_inputs(audio, stdin)
    loading = time.perf_counter()
    attention = OmegaConf.to_container(cfg.attention, resolve=True) if cfg.get("attention") else None
    recogniser = load_recogniser(cfg.ckpt_path, attention)
    decoding = OmegaConf.to_container(cfg.decoding, resolve=True) if cfg.get("decoding") else None
    decoder = recogniser.decoder(decoding)

    auto = " (decoding=auto)" if (decoding or {}).get("name") == "auto" else ""
    log.info("decoding: %s%s, %s words", decoding_label(decoder.describe()), auto,
             "real" if decoder.real_words else "phonetic")
    long_form = LongFormConfig.from_dict(OmegaConf.to_container(cfg.long_form, resolve=True)
                                         if cfg.get("long_form") else None)
    output = cfg.get("output") or {}
    files = {"transcripts": str(run.transcripts_file)}
    if output.get("ctm"):
        files["ctm"] = str(run.ctm_file)
    if output.get("srt"):
        files["srt"] = str(run.srt_dir)
        run.srt_dir.mkdir(parents=True, exist_ok=True)
    transcribed = 0
    audio_seconds = 0.0
    started = time.perf_counter()
    load_seconds = started - loading
    with contextlib.ExitStack() as stack:
        jsonl = stack.enter_context(open(run.transcripts_file, "w", encoding="utf-8"))
        ctm = stack.enter_context(open(run.ctm_file, "w", encoding="utf-8")) if output.get("ctm") else None
        streaming = bool(cfg.get("stream", False))
        if streaming:
            transcriptions = streamed_transcriptions(recogniser, recordings, decoder, cfg)
        else:
            transcriptions = recogniser.iter_transcribe(
                recordings, int(cfg.batch_size), decoding=decoder, long_form=long_form, device=cfg.device,
                num_workers=int(cfg.num_workers), progress=show_progress(cfg.get("progress", "auto")),
                seed=cfg.get("seed"))
        for t in transcriptions:
            if not t.ok:
                failed.append(SkippedUtterance(t.id, t.audio_filepath or t.id, t.error))
                continue
            transcribed += 1
            audio_seconds += t.duration
            print(f"{t.audio_filepath}\t{t.text}", file=stdout, flush=True)
            jsonl.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")
            jsonl.flush()
            if ctm is not None:
                ctm.write(ctm_lines(t))
            if output.get("srt"):
                (run.srt_dir / f"{t.id}.srt").write_text(srt_text(t.words), encoding="utf-8")
    wall = time.perf_counter() - started
    report = {
        "ckpt_path": str(cfg.ckpt_path),
        "inputs": transcribed + len(failed),
        "transcribed": transcribed,
        "failed": [s._asdict() for s in failed],
        "audio_seconds": round(audio_seconds, 3),
        "wall_seconds": round(wall, 3),
        "rtf": round(wall / audio_seconds, 4) if audio_seconds else None,
        "load_seconds": round(load_seconds, 3),
        "attention": recogniser.model.attention_spec,
        "decoding": decoder.describe(),
        "long_form": asdict(long_form),
        "stream": ({"chunk": recogniser.model.decoding_context.describe(recogniser.frame_seconds)}
                   if streaming else None),
        "device": str(cfg.device),
        "files": files,
    }
    run.write_transcribe_report(report)
    report["run_dir"] = str(run.path)
    return report


def streamed_transcriptions(recogniser: Any, recordings: Sequence[Recording], decoder: Any,
                            cfg: DictConfig) -> Any:
    """``stream=true``: each recording fed chunk by chunk (``cfg.chunk`` seconds, ``cfg.left`` of left
    context) through :func:`fastasr.recognition.streaming.stream_recording`, its partial words printed
    on stderr as each chunk completes (``id [seconds] words``); an unusable recording gives a
    Transcription whose ``error`` says why. The model's decoding context is set to the stream's, so
    the report names it."""
    if cfg.get("seed") is not None:
        torch.manual_seed(int(cfg.seed))
    chunk, left = cfg.get("chunk", 0.64), cfg.get("left", "auto")
    recogniser.set_chunked_decoding(chunk, left)
    log.info("streaming: %s", recogniser.model.decoding_context.describe(recogniser.frame_seconds))
    for rec in recordings:
        def show(partial, rec=rec):
            print(f"{rec.id} [{partial.seconds:.2f} s] {partial.text}", file=sys.stderr, flush=True)

        try:
            yield stream_recording(recogniser, rec, chunk, left, decoder, on_partial=show).transcription
        except BadAudioError as err:
            yield Transcription(rec.id, rec.audio_filepath, "", [], [], 0.0, error=err.reason)


def summary(report: dict[str, Any]) -> str:
    """The lines the command ends with on stderr: counts, speed, the decoding, and each failed
    input with its reason."""

    failed = [SkippedUtterance(**f) for f in report["failed"]]
    speed = (f" ({report['audio_seconds']:.1f} s of audio in {report['wall_seconds']:.1f} s, RTF {report['rtf']:.3f})"
             if report["rtf"] is not None else "")
    decoding = report.get("decoding") or {}
    line = f"transcribe: {report['transcribed']} of {report['inputs']} input(s) transcribed{speed}"
    if decoding:
        line += f" by {decoding_label(decoding)}"
    if failed:
        line += f"; {len(failed)} could not be:\n{describe_skipped(failed)}"
    if not report["transcribed"]:
        line += "\ntranscribe: nothing could be transcribed"
    return line + f"\ntranscribe: outputs in {report['run_dir']}"
