"""A Kaldi data directory (as WSJ and Switchboard recipes prepare them) → one manifest.

    fastasr-corpus kaldi SRC OUT [--name NAME] [--allow-pipes]

writes ``OUT/<NAME>.jsonl`` (``NAME``: SRC's directory name, e.g. ``train_si284``). ``SRC``
holds ``wav.scp`` (``<recording-id> <path>`` or ``<recording-id> <command> |``),
``text`` (``<utterance-id> <words>``), optional ``segments`` (``<utterance-id>
<recording-id> <start-s> <end-s>``, end ``-1`` = to the end) and optional ``utt2spk``.
Relative paths are tried from the working directory (Kaldi's convention: the recipe
directory) and then from SRC.

Audio: a plain file without ``segments`` is referenced where it is. Commands (``sph2pipe
... |``, ``sox ... - |``) are run only with ``--allow-pipes`` (they are shell commands from
the file: without the flag the first one is an error naming its line); each recording's
command runs once and the audio it prints (WAV) is decoded. With ``segments`` (or a
command), each utterance's audio is cut and written as 16-bit WAV at the source rate to
``OUT/wav/<NAME>/<utterance-id>.wav``, so training never runs commands or seeks.

``text`` is normalised for character targets (``normalize_transcript`` with bracketed
tags such as ``[laughter]`` or ``<NOISE>`` dropped). Bad lines, failing commands,
unreadable audio and empty segments are reported and skipped.
"""

from __future__ import annotations

import io
import logging
import subprocess
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import soundfile as sf

from fastasr.corpora import command
from fastasr.corpora.command import write_split
from fastasr.corpora.paths import CorpusLayoutError, require_dir
from fastasr.corpora.skipped import Skipped, duration_or_skip
from fastasr.corpora.text import normalize_transcript
from fastasr.data.audio import write_wav

log = logging.getLogger(__name__)
LAYOUT = "a Kaldi data directory with wav.scp and text (optional segments, utt2spk)"


def read_table(path: Path, skipped: Skipped, fields: int = 2) -> dict[str, tuple[int, list[str]]]:
    """``<key> <rest>`` lines → ``{key: (line number, rest split into fields - 1 parts)}``;
    with ``fields`` > 2 the rest is split on whitespace and must have ``fields - 1`` parts."""
    table: dict[str, tuple[int, list[str]]] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1 if fields == 2 else -1)
        if len(parts) != fields:
            skipped.add(f"{path} line {lineno}", "malformed line", f"{line!r}; expected {fields} fields")
            continue
        if parts[0] in table:
            skipped.add(f"{path} line {lineno}", "duplicate key", parts[0])
            continue
        table[parts[0]] = (lineno, [p.strip() for p in parts[1:]])
    return table


def is_command(spec: str) -> bool:
    """Whether a ``wav.scp`` value is a command (Kaldi's ``... |``)."""
    return spec.rstrip().endswith("|")


def resolve_path(spec: str, src: Path) -> Path:
    """A ``wav.scp`` path: absolute, or relative to the working directory, else to ``src``."""
    path = Path(spec)
    if path.is_absolute() or path.exists():
        return path
    return src / spec


def load_recording(spec: str, src: Path) -> tuple[np.ndarray, int]:
    """Mono float32 samples ``(T,)`` and rate of a ``wav.scp`` value (a file or a command)."""
    if is_command(spec):
        done = subprocess.run(spec.rstrip()[:-1], shell=True, capture_output=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"exit status {done.returncode}: {done.stderr.decode(errors='replace')[-300:].strip()}")
        data, rate = sf.read(io.BytesIO(done.stdout), dtype="float32", always_2d=True)
    else:
        data, rate = sf.read(str(resolve_path(spec, src)), dtype="float32", always_2d=True)
    return data.mean(axis=1), int(rate)


def _segments(src: Path, skipped: Skipped) -> dict[str, tuple[str, float, float]] | None:
    """``segments`` → ``{utterance: (recording, start s, end s or -1)}``, or None without the file."""
    path = src / "segments"
    if not path.is_file():
        return None
    out = {}
    for utt, (lineno, (rec, start, end)) in read_table(path, skipped, fields=4).items():
        try:
            out[utt] = (rec, float(start), float(end))
        except ValueError:
            skipped.add(f"{path} line {lineno}", "malformed line", f"times {start!r} {end!r}; expected seconds")
    return out


def convert(src: str | Path, out: str | Path, name: str | None = None, allow_pipes: bool = False) -> list[dict]:
    """Write ``OUT/<name>.jsonl`` from the data directory ``src``; returns its records."""
    src = require_dir(src, LAYOUT)
    for required in ("wav.scp", "text"):
        if not (src / required).is_file():
            raise CorpusLayoutError(f"{src}: no {required}; expected {LAYOUT}")
    name = name or src.resolve().name
    skipped = Skipped("utterance")
    wavs = read_table(src / "wav.scp", skipped)
    if not allow_pipes:
        for rec, (lineno, (spec,)) in wavs.items():
            if is_command(spec):
                raise CorpusLayoutError(
                    f"{src / 'wav.scp'} line {lineno}: {rec} {spec!r} is a command (ends with '|'); "
                    "run with --allow-pipes to execute the commands of this file")
    texts = read_table(src / "text", skipped)
    speakers = {u: v[0] for u, (_, v) in read_table(src / "utt2spk", skipped).items()} \
        if (src / "utt2spk").is_file() else {}
    segments = _segments(src, skipped)

    by_recording: dict[str, list[str]] = defaultdict(list)
    for utt, (lineno, (raw,)) in texts.items():
        rec = segments[utt][0] if segments is not None and utt in segments else utt
        if segments is not None and utt not in segments:
            skipped.add(f"{src / 'text'} line {lineno}", "no segments entry", utt)
        elif rec not in wavs:
            skipped.add(f"{src / 'text'} line {lineno}", "no wav.scp entry", rec)
        elif not normalize_transcript(raw, drop_tags=True):
            skipped.add(f"{src / 'text'} line {lineno}", "empty transcript", repr(raw))
        else:
            by_recording[rec].append(utt)

    wav_dir = Path(out) / "wav" / name
    records = []
    for rec in sorted(by_recording):
        spec = wavs[rec][1][0]
        utts = sorted(by_recording[rec])
        base = {u: {"id": u, "text": normalize_transcript(texts[u][1][0], drop_tags=True)} for u in utts}
        for u in utts:
            if u in speakers:
                base[u]["speaker"] = speakers[u]
        if segments is None and not is_command(spec):  # a plain file: reference it
            duration = duration_or_skip(resolve_path(spec, src), skipped)
            if duration is not None:
                records.append(base[utts[0]] | {"audio_filepath": str(resolve_path(spec, src).resolve()),
                                                "duration": round(duration, 6)})
            continue
        try:
            samples, rate = load_recording(spec, src)
        except Exception as e:  # a failing command or unreadable audio: skip its utterances
            for u in utts:
                skipped.add(f"{u} of {rec} ({spec})", "recording unreadable", str(e).strip())
            continue
        wav_dir.mkdir(parents=True, exist_ok=True)
        for u in utts:
            _, start, end = segments[u] if segments is not None else (rec, 0.0, -1.0)
            a = max(0, int(round(start * rate)))
            b = samples.shape[0] if end < 0 else min(samples.shape[0], int(round(end * rate)))
            if b <= a:
                skipped.add(f"{u} of {rec}", "empty segment", f"{start}-{end} s of {samples.shape[0] / rate:.2f} s")
                continue
            path = wav_dir / f"{u}.wav"
            write_wav(path, samples[a:b], rate)
            records.append(base[u] | {"audio_filepath": str(path.resolve()), "duration": round((b - a) / rate, 6)})
    records.sort(key=lambda r: r["id"])
    write_split(out, name, records, skipped, src)
    return records


def main(argv: Sequence[str] | None = None) -> int:
    p = command.parser("kaldi", __doc__, "the Kaldi data directory (wav.scp, text, [segments, utt2spk])",
                       "output directory (OUT/<name>.jsonl, OUT/wav/<name>/ for cut audio)")
    p.add_argument("--name", help="manifest name (default: SRC's directory name)")
    p.add_argument("--allow-pipes", action="store_true", help="run the 'cmd |' entries of wav.scp")
    return command.run(p, argv, lambda a: convert(a.src, a.out, a.name, a.allow_pipes))
