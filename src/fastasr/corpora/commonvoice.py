"""Common Voice (one language of a release) → ``train.jsonl``, ``dev.jsonl``, ``test.jsonl``.

    fastasr-corpus commonvoice SRC OUT [--sample-rate 16000]

``SRC`` is the language directory of an extracted release (``cv-corpus-*/<lang>/``,
holding ``train.tsv``, ``dev.tsv``, ``test.tsv`` and ``clips/*.mp3``), or the release
directory when it holds one language. The TSVs are read as tab-separated with no quoting
(sentences contain quotes); ``path`` names the clip, ``sentence`` the transcript and
``client_id`` the speaker.

Audio: MP3 is decoded by soundfile (libsndfile ≥ 1.1 has MP3; the soundfile wheels ship
one), so manifests point at the clips where they are. ``--sample-rate R`` instead decodes
every clip once and writes 16-bit WAV at ``R`` Hz under ``OUT/wav/<split>/`` (faster
epochs, more disk).

``text`` is the sentence normalised for character targets (``normalize_transcript``:
NFKC, lower case, punctuation and symbols → spaces, apostrophes inside words kept,
letters of every script kept). Missing or unreadable clips and sentences empty after
normalisation are reported and skipped.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Sequence
from pathlib import Path

import soundfile as sf

from fastasr.corpora import command
from fastasr.corpora.command import write_split
from fastasr.corpora.paths import CorpusLayoutError, require_dir
from fastasr.corpora.skipped import Skipped, duration_or_skip
from fastasr.corpora.text import normalize_transcript
from fastasr.data.audio import load_audio, write_wav

log = logging.getLogger(__name__)
LAYOUT = "a Common Voice language directory with train.tsv, dev.tsv, test.tsv and clips/"
SPLITS = ("train", "dev", "test")
COLUMNS = ("path", "sentence")


def find_language_dir(src: Path) -> Path:
    """``src`` if it holds ``train.tsv``, else its only subdirectory that does."""
    if (src / "train.tsv").is_file():
        return src
    langs = sorted(d for d in src.iterdir() if d.is_dir() and (d / "train.tsv").is_file())
    if len(langs) == 1:
        return langs[0]
    if langs:
        raise CorpusLayoutError(f"{src}: holds several languages ({', '.join(d.name for d in langs)}); "
                                "pass one language directory")
    raise CorpusLayoutError(f"{src}: no train.tsv here or in a subdirectory; expected {LAYOUT}")


def check_mp3() -> None:
    """A clear error when this libsndfile cannot decode MP3."""
    if "MP3" not in sf.available_formats():
        raise CorpusLayoutError(f"libsndfile {sf.__libsndfile_version__} cannot decode MP3; Common Voice needs "
                                "libsndfile ≥ 1.1 (install soundfile ≥ 0.12 from its wheels)")


def read_split(tsv: Path, clips: Path, skipped: Skipped) -> list[dict]:
    """Records of one split's TSV (clips referenced where they are)."""
    with open(tsv, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise CorpusLayoutError(f"{tsv}: header {reader.fieldnames}; expected columns {list(COLUMNS)} "
                                    "(and client_id)")
        records = []
        for lineno, row in enumerate(reader, start=2):
            where = f"{tsv} line {lineno}"
            text = normalize_transcript(row.get("sentence") or "")
            if not text:
                skipped.add(where, "empty transcript", repr(row.get("sentence")))
                continue
            clip = clips / (row.get("path") or "")
            if not row.get("path") or not clip.is_file():
                skipped.add(where, "clip missing", str(clip))
                continue
            duration = duration_or_skip(clip, skipped)
            if duration is None:
                continue
            rec = {"id": clip.stem, "audio_filepath": str(clip.resolve()), "duration": round(duration, 6),
                   "text": text}
            if row.get("client_id"):
                rec["speaker"] = row["client_id"]
            records.append(rec)
    return records


def to_wav(records: list[dict], wav_dir: Path, sample_rate: int, skipped: Skipped) -> list[dict]:
    """Decode each record's clip once to 16-bit WAV at ``sample_rate``; returns the records
    pointing at the WAVs (clips that fail to decode are skipped)."""
    wav_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for rec in records:
        try:
            wav = load_audio(rec["audio_filepath"], sample_rate)
        except Exception as e:  # reported and skipped
            skipped.add(rec["audio_filepath"], "unreadable audio", str(e).strip())
            continue
        path = wav_dir / f"{rec['id']}.wav"
        write_wav(path, wav, sample_rate)
        out.append(rec | {"audio_filepath": str(path.resolve()), "duration": round(wav.shape[0] / sample_rate, 6)})
    return out


def convert(src: str | Path, out: str | Path, sample_rate: int | None = None) -> dict[str, list[dict]]:
    """Write ``OUT/{train,dev,test}.jsonl``; returns the records of each split."""
    lang = find_language_dir(require_dir(src, LAYOUT))
    missing = [f"{s}.tsv" for s in SPLITS if not (lang / f"{s}.tsv").is_file()]
    if not (lang / "clips").is_dir():
        missing.append("clips/")
    if missing:
        raise CorpusLayoutError(f"{lang}: no {', '.join(missing)} (a half-extracted release?); expected {LAYOUT}")
    check_mp3()
    written = {}
    for split in SPLITS:
        skipped = Skipped("clip")
        records = read_split(lang / f"{split}.tsv", lang / "clips", skipped)
        if sample_rate:
            records = to_wav(records, Path(out) / "wav" / split, sample_rate, skipped)
        write_split(out, split, records, skipped, lang / f"{split}.tsv")
        written[split] = records
    return written


def main(argv: Sequence[str] | None = None) -> int:
    p = command.parser("commonvoice", __doc__, "the language directory (train/dev/test.tsv, clips/)",
                       "output directory for train/dev/test.jsonl")
    p.add_argument("--sample-rate", type=int, help="decode the clips once to 16-bit WAV at this rate")
    return command.run(p, argv, lambda a: convert(a.src, a.out, a.sample_rate))
