"""Converters from common corpus layouts to fastasr manifests.

    python -m fastasr.data.converters librispeech SRC OUT.jsonl   # e.g. SRC=LibriSpeech/dev-clean
    python -m fastasr.data.converters kaldi SRC OUT.jsonl         # a Kaldi data dir (WSJ, Switchboard, ...)
    python -m fastasr.data.converters timit SRC OUT.jsonl [--phone-set 39|61] [--core-test] [--include-sa]

Texts are lower-cased. ``audio_filepath`` is written relative to the
manifest when the audio lies under the manifest's directory, else absolute.
Durations come from the audio headers.

* LibriSpeech: every ``*.trans.txt`` below SRC (``<utt-id> <TEXT>`` lines,
  audio ``<utt-id>.flac`` beside it); speaker = first id field.
* Kaldi: ``wav.scp`` (``<utt-id> <path>``; plain paths only, no pipes),
  ``text``, optional ``utt2spk``; ``segments`` is not supported.
* TIMIT: every ``*.phn`` below SRC (any case) with its ``.wav`` (NIST SPHERE
  or RIFF), ``.wrd`` and ``.txt``. ``phonemes`` are the phones of each word of
  the ``.wrd`` alignment (a phone belongs to the word containing its
  midpoint), words joined by ``|``; silences and closures (``h# pau epi`` and
  the ``*cl`` closures, which fold to ``sil``) and the glottal stop ``q`` are
  dropped, as CTC's blank covers silence. ``--phone-set 39`` (default) folds
  the 61 TIMIT phones to the 39 of Lee & Hon (1989) used for scoring
  (``TIMIT_61_TO_39``); ``61`` keeps them (fold the outputs with
  ``fold_timit`` before scoring). SA sentences are skipped unless
  ``--include-sa``; ``--core-test`` keeps the 24 core-test speakers only.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import soundfile as sf

from fastasr.data.manifest import write_manifest

# Lee & Hon (1989) folding of the 61 TIMIT phones onto 39 scoring classes
# (closures, pauses and epenthetic silence → sil; q is deleted).
TIMIT_61_TO_39: dict[str, str | None] = {
    "aa": "aa", "ao": "aa", "ae": "ae", "ah": "ah", "ax": "ah", "ax-h": "ah", "aw": "aw", "ay": "ay",
    "b": "b", "ch": "ch", "d": "d", "dh": "dh", "dx": "dx", "eh": "eh", "er": "er", "axr": "er",
    "ey": "ey", "f": "f", "g": "g", "hh": "hh", "hv": "hh", "ih": "ih", "ix": "ih", "iy": "iy",
    "jh": "jh", "k": "k", "l": "l", "el": "l", "m": "m", "em": "m", "n": "n", "en": "n", "nx": "n",
    "ng": "ng", "eng": "ng", "ow": "ow", "oy": "oy", "p": "p", "r": "r", "s": "s", "sh": "sh",
    "zh": "sh", "t": "t", "th": "th", "uh": "uh", "uw": "uw", "ux": "uw", "v": "v", "w": "w",
    "y": "y", "z": "z",
    "pcl": "sil", "tcl": "sil", "kcl": "sil", "bcl": "sil", "dcl": "sil", "gcl": "sil",
    "h#": "sil", "pau": "sil", "epi": "sil",
    "q": None,
}
TIMIT_SILENCES = frozenset(p for p, f in TIMIT_61_TO_39.items() if f in ("sil", None))

# The 24 speakers of the TIMIT core test set (2 male, 1 female per dialect region).
TIMIT_CORE_TEST_SPEAKERS = frozenset({
    "mdab0", "mwbt0", "felc0", "mtas1", "mwew0", "fpas0", "mjmp0", "mlnt0", "fpkt0",
    "mlll0", "mtls0", "fjlm0", "mbpm0", "mklt0", "fnlp0", "mcmj0", "mjdh0", "fmgd0",
    "mgrt0", "mnjm0", "fdhc0", "mjln0", "mpam0", "fmld0",
})


def fold_timit(phones: Sequence[str]) -> list[str]:
    """Fold 61-set TIMIT phones (``|`` passes through) to the 39-set; ``q`` is dropped."""
    out = []
    for p in phones:
        if p == "|":
            out.append(p)
            continue
        if p not in TIMIT_61_TO_39:
            raise ValueError(f"TIMIT phone {p!r} is not one of the 61; expected one of {sorted(TIMIT_61_TO_39)}")
        folded = TIMIT_61_TO_39[p]
        if folded is not None:
            out.append(folded)
    return out


def _normalize_text(text: str) -> str:
    """Lower-case, keep letters, digits and apostrophes, collapse spaces."""
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


def _duration(path: Path) -> float:
    info = sf.info(str(path))
    return info.frames / float(info.samplerate)


def _table(path: Path) -> dict[str, str]:
    """``<key> <rest of line>`` lines → dict (Kaldi's text/utt2spk/wav.scp)."""
    table = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.strip().split(maxsplit=1)
        if len(parts) < 2:
            raise ValueError(f"{path} line {lineno}: {line!r}; expected '<key> <value>'")
        table[parts[0]] = parts[1]
    return table


def librispeech(src: str | Path) -> list[dict]:
    """Records for every utterance of a LibriSpeech directory (any level: corpus, subset, speaker)."""
    src = Path(src)
    records = []
    for trans in sorted(src.rglob("*.trans.txt")):
        for lineno, line in enumerate(trans.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            parts = line.split(maxsplit=1)
            if len(parts) < 2:
                raise ValueError(f"{trans} line {lineno}: {line!r}; expected '<utterance-id> <TEXT>'")
            utt_id, text = parts
            audio = trans.parent / f"{utt_id}.flac"
            if not audio.is_file():
                raise FileNotFoundError(f"{trans} line {lineno}: audio {audio} not found")
            records.append({
                "id": utt_id, "audio_filepath": str(audio.resolve()), "duration": round(_duration(audio), 6),
                "text": _normalize_text(text), "speaker": utt_id.split("-")[0],
            })
    if not records:
        raise ValueError(f"{src}: no *.trans.txt files; expected a LibriSpeech directory")
    return records


def kaldi(src: str | Path) -> list[dict]:
    """Records for a Kaldi data directory (``wav.scp`` with plain paths, ``text``, optional ``utt2spk``)."""
    src = Path(src)
    for name in ("wav.scp", "text"):
        if not (src / name).is_file():
            raise FileNotFoundError(f"{src}: no {name}; expected a Kaldi data directory")
    if (src / "segments").is_file():
        raise ValueError(f"{src}: has a 'segments' file; segmented recordings are not supported "
                         "(extract the segments to files first)")
    wavs, texts = _table(src / "wav.scp"), _table(src / "text")
    spk = _table(src / "utt2spk") if (src / "utt2spk").is_file() else {}
    records = []
    for utt_id in sorted(texts):
        if utt_id not in wavs:
            raise ValueError(f"{src}/text: utterance {utt_id!r} has no entry in wav.scp")
        path = wavs[utt_id].strip()
        if path.endswith("|") or " " in path:
            raise ValueError(f"{src}/wav.scp: {utt_id} {path!r}; expected a plain file path (no pipes)")
        audio = Path(path) if Path(path).is_absolute() else (src / path)
        if not audio.is_file():
            audio = Path(path)  # Kaldi paths are relative to the recipe dir: try the working directory
        if not audio.is_file():
            raise FileNotFoundError(f"{src}/wav.scp: audio {path!r} of {utt_id} not found")
        rec = {"id": utt_id, "audio_filepath": str(audio.resolve()), "duration": round(_duration(audio), 6),
               "text": _normalize_text(texts[utt_id])}
        if utt_id in spk:
            rec["speaker"] = spk[utt_id]
        records.append(rec)
    if not records:
        raise ValueError(f"{src}/text: no utterances")
    return records


def _ci_sibling(path: Path, suffix: str) -> Path | None:
    """``path`` with another suffix, matching case-insensitively (TIMIT ships upper or lower case)."""
    for cand in (path.with_suffix(suffix.lower()), path.with_suffix(suffix.upper())):
        if cand.is_file():
            return cand
    for cand in path.parent.iterdir():
        if cand.stem.lower() == path.stem.lower() and cand.suffix.lower() == suffix.lower():
            return cand
    return None


def _timing(path: Path) -> list[tuple[int, int, str]]:
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 3:
            raise ValueError(f"{path} line {lineno}: {line!r}; expected '<start> <end> <label>'")
        rows.append((int(parts[0]), int(parts[1]), parts[2].lower()))
    return rows


def timit(src: str | Path, phone_set: int = 39, core_test: bool = False, include_sa: bool = False) -> list[dict]:
    """Records for the TIMIT utterances below ``src`` (e.g. ``TIMIT/TEST``)."""
    if phone_set not in (39, 61):
        raise ValueError(f"phone_set {phone_set}; expected 39 or 61")
    src = Path(src)
    records = []
    for phn in sorted(p for p in src.rglob("*") if p.suffix.lower() == ".phn"):
        speaker, sentence = phn.parent.name.lower(), phn.stem.lower()
        if sentence.startswith("sa") and not include_sa:
            continue
        if core_test and speaker not in TIMIT_CORE_TEST_SPEAKERS:
            continue
        audio = _ci_sibling(phn, ".wav")
        wrd, txt = _ci_sibling(phn, ".wrd"), _ci_sibling(phn, ".txt")
        if audio is None or wrd is None or txt is None:
            raise FileNotFoundError(f"{phn}: missing .wav, .wrd or .txt beside it")
        phones, words = _timing(phn), _timing(wrd)
        word_phones: list[list[str]] = [[] for _ in words]
        for start, end, p in phones:
            if p not in TIMIT_61_TO_39:
                raise ValueError(f"{phn}: phone {p!r} is not a TIMIT phone")
            if p in TIMIT_SILENCES:
                continue
            mid = (start + end) / 2
            for w, (ws, we, _) in enumerate(words):
                if ws <= mid < we:
                    word_phones[w].append(p if phone_set == 61 else TIMIT_61_TO_39[p])
                    break
        phonemes = " | ".join(" ".join(ps) for ps in word_phones if ps)
        text_line = txt.read_text().split(maxsplit=2)
        text = _normalize_text(text_line[2] if len(text_line) == 3 else " ".join(w for _, _, w in words))
        records.append({
            "id": f"{speaker}_{sentence}", "audio_filepath": str(audio.resolve()),
            "duration": round(_duration(audio), 6), "text": text, "phonemes": phonemes, "speaker": speaker,
        })
    if not records:
        raise ValueError(f"{src}: no TIMIT utterances (*.phn) found" + (" for the core test set" if core_test else ""))
    return records


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fastasr.data.converters", description="corpus → manifest")
    p.add_argument("corpus", choices=("librispeech", "kaldi", "timit"))
    p.add_argument("src", help="corpus directory")
    p.add_argument("out", help="output manifest (.jsonl)")
    p.add_argument("--phone-set", type=int, choices=(39, 61), default=39, help="timit: phone set")
    p.add_argument("--core-test", action="store_true", help="timit: core test speakers only")
    p.add_argument("--include-sa", action="store_true", help="timit: keep the SA sentences")
    args = p.parse_args(argv)
    if args.corpus == "librispeech":
        records = librispeech(args.src)
    elif args.corpus == "kaldi":
        records = kaldi(args.src)
    else:
        records = timit(args.src, args.phone_set, args.core_test, args.include_sa)
    write_manifest(args.out, records)
    print(f"{len(records)} utterances, {sum(r['duration'] for r in records) / 3600:.2f} h → {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
