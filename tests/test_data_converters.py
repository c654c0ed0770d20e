"""Corpus converters on tiny fake LibriSpeech, Kaldi and TIMIT directories."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf

from fastasr.data import converters
from fastasr.data.manifest import read_manifest


def tone(seconds, rate=16000):
    return (0.1 * np.sin(np.arange(int(seconds * rate)) * 0.05)).astype(np.float32)


def test_librispeech(tmp_path):
    d = tmp_path / "LibriSpeech" / "dev-clean" / "19" / "198"
    d.mkdir(parents=True)
    (d / "19-198.trans.txt").write_text("19-198-0000 HELLO WORLD\n19-198-0001 IT'S A TEST\n")
    sf.write(d / "19-198-0000.flac", tone(1.0), 16000)
    sf.write(d / "19-198-0001.flac", tone(0.5), 16000)
    out = tmp_path / "libri.jsonl"
    assert converters.main(["librispeech", str(tmp_path / "LibriSpeech"), str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert recs[0]["audio_filepath"] == "LibriSpeech/dev-clean/19/198/19-198-0000.flac"  # relative
    utts = read_manifest(out, on_error="raise")
    assert [(u.id, u.text, u.speaker) for u in utts] == [
        ("19-198-0000", "hello world", "19"), ("19-198-0001", "it's a test", "19")]
    assert utts[0].duration == pytest.approx(1.0) and utts[1].duration == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no \\*.trans.txt"):
        converters.librispeech(tmp_path / "empty_dir_does_not_matter")


def make_kaldi(tmp_path):
    d = tmp_path / "data" / "train"
    d.mkdir(parents=True)
    wav_dir = tmp_path / "audio"
    wav_dir.mkdir()
    sf.write(wav_dir / "a.wav", tone(0.8, 8000), 8000, subtype="PCM_16")
    sf.write(wav_dir / "b.wav", tone(0.4), 16000, subtype="PCM_16")
    (d / "wav.scp").write_text(f"spk1-a {wav_dir / 'a.wav'}\nspk2-b {wav_dir / 'b.wav'}\n")
    (d / "text").write_text("spk1-a THE CAT SAT.\nspk2-b Hello\n")
    (d / "utt2spk").write_text("spk1-a spk1\nspk2-b spk2\n")
    return d


def test_kaldi(tmp_path):
    d = make_kaldi(tmp_path)
    out = tmp_path / "manifests" / "train.jsonl"
    converters.main(["kaldi", str(d), str(out)])
    utts = read_manifest(out, on_error="raise")
    assert [(u.id, u.text, u.speaker) for u in utts] == [("spk1-a", "the cat sat", "spk1"), ("spk2-b", "hello", "spk2")]
    assert utts[0].duration == pytest.approx(0.8)
    (d / "segments").write_text("x y 0 1\n")
    with pytest.raises(ValueError, match="segments"):
        converters.kaldi(d)
    (d / "segments").unlink()
    (d / "wav.scp").write_text("spk1-a sox a.wav -t wav - |\nspk2-b b.wav\n")
    with pytest.raises(ValueError, match="plain file path"):
        converters.kaldi(d)


def write_timit_utt(root, region, speaker, sent, words, fmt="WAV"):
    d = root / "TEST" / region / speaker.upper()
    d.mkdir(parents=True, exist_ok=True)
    base = d / sent.upper()
    n = 16000
    sf.write(base.with_suffix(".WAV"), tone(1.0), 16000, format=fmt, subtype="PCM_16")
    # phones: h# then the words' phones (with a closure), pau, h#
    phn = [(0, 2000, "h#")]
    wrd = []
    t = 2000
    for word, phones in words:
        start = t
        for p in phones:
            phn.append((t, t + 1000, p))
            t += 1000
        wrd.append((start, t, word))
    phn.append((t, n, "h#"))
    base.with_suffix(".PHN").write_text("".join(f"{a} {b} {p}\n" for a, b, p in phn))
    base.with_suffix(".WRD").write_text("".join(f"{a} {b} {w}\n" for a, b, w in wrd))
    base.with_suffix(".TXT").write_text(f"0 {n} {' '.join(w for w, _ in words).capitalize()}.\n")


def test_timit(tmp_path):
    root = tmp_path / "TIMIT"
    write_timit_utt(root, "DR1", "FELC0", "SI1386", [("she", ["sh", "ix"]), ("had", ["hv", "ae", "dcl", "d"])],
                    fmt="NIST")
    write_timit_utt(root, "DR1", "FELC0", "SA1", [("she", ["sh", "iy"])])
    write_timit_utt(root, "DR2", "MABC0", "SX100", [("a", ["ax"]), ("cat", ["kcl", "k", "q", "ae", "tcl", "t"])])
    out = tmp_path / "timit.jsonl"
    converters.main(["timit", str(root), str(out)])
    utts = {u.id: u for u in read_manifest(out, on_error="raise")}
    assert set(utts) == {"felc0_si1386", "mabc0_sx100"}  # SA sentences skipped
    assert utts["felc0_si1386"].phonemes == "sh ih | hh ae d"  # folded to 39, closures dropped
    assert utts["felc0_si1386"].text == "she had" and utts["felc0_si1386"].speaker == "felc0"
    assert utts["mabc0_sx100"].phonemes == "ah | k ae t"  # q deleted
    assert utts["felc0_si1386"].duration == pytest.approx(1.0)

    raw = converters.timit(root, phone_set=61, include_sa=True)
    assert len(raw) == 3
    assert {r["id"]: r["phonemes"] for r in raw}["felc0_si1386"] == "sh ix | hv ae d"
    core = converters.timit(root, core_test=True)
    assert [r["id"] for r in core] == ["felc0_si1386"]


def test_timit_folding_table():
    table = converters.TIMIT_61_TO_39
    assert len(table) == 61
    assert len({v for v in table.values() if v is not None}) == 39
    assert converters.fold_timit(["ao", "|", "ax-h", "q", "zh", "pau"]) == ["aa", "|", "ah", "sh", "sil"]
    assert len(converters.TIMIT_CORE_TEST_SPEAKERS) == 24
    with pytest.raises(ValueError, match="not one of the 61"):
        converters.fold_timit(["xx"])
