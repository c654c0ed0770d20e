"""Manifest reading: validation, clear errors, skip/raise modes."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from fastasr.data.audio import write_wav
from fastasr.data.manifest import (
    MAX_WARNINGS,
    ManifestError,
    Utterance,
    read_manifest,
    write_manifest,
)


@pytest.fixture()
def corpus(tmp_path):
    (tmp_path / "wav").mkdir()
    for name in ("a", "b"):
        write_wav(tmp_path / "wav" / f"{name}.wav", np.zeros(1600), 16000)
    (tmp_path / "wav" / "notaudio.wav").write_text("this is not a RIFF file")
    return tmp_path


def good(**over):
    rec = {"audio_filepath": "wav/a.wav", "duration": 0.1, "text": "hello world"}
    rec.update(over)
    return json.dumps(rec)


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_reads_relative_and_absolute_paths(corpus):
    absb = str(corpus / "wav" / "b.wav")
    m = write_lines(corpus / "m.jsonl", [
        good(phonemes="h ə | w ɜː l d", speaker=7),
        "",
        good(audio_filepath=absb, id="utt-b", text="  bye "),
    ])
    utts = read_manifest(m, on_error="raise")
    assert [u.id for u in utts] == ["a", "utt-b"]
    assert utts[0].audio_filepath == str((corpus / "wav" / "a.wav").resolve())
    assert utts[0].phonemes == "h ə | w ɜː l d" and utts[0].speaker == "7"
    assert utts[1].audio_filepath == str((corpus / "wav" / "b.wav").resolve()) and utts[1].text == "bye"
    assert utts[1].phonemes is None


BAD_LINES = {
    "missing file": (good(audio_filepath="wav/nope.wav"), ["audio_filepath", "nope.wav", "expected an existing audio file"]),
    "empty text": (good(text="  "), ["text", "expected non-empty"]),
    "zero duration": (good(duration=0.0), ["duration 0.0 s", "expected > 0"]),
    "negative duration": (good(duration=-1), ["duration -1 s", "expected > 0"]),
    "nan duration": ('{"audio_filepath": "wav/a.wav", "duration": NaN, "text": "x"}', ["duration nan", "finite"]),
    "string duration": (good(duration="3"), ["duration '3'", "expected a number"]),
    "non-audio file": (good(audio_filepath="wav/notaudio.wav"), ["notaudio.wav", "not readable audio"]),
    "bad json": ('{"audio_filepath": "wav/a.wav", "duration": 1', ["not valid JSON", "expected one JSON object"]),
    "missing field": ('{"audio_filepath": "wav/a.wav", "text": "hi"}', ["missing field 'duration'", "expected fields"]),
    "not an object": ("[1, 2]", ["JSON list", "expected an object"]),
    "empty phonemes": (good(phonemes=""), ["phonemes", "expected non-empty"]),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_bad_line_raise_mode(corpus, case):
    line, expected = BAD_LINES[case]
    m = write_lines(corpus / "train.jsonl", [good(), line, good()])
    with pytest.raises(ManifestError) as err:
        read_manifest(m, on_error="raise")
    msg = str(err.value)
    assert "train.jsonl line 2:" in msg, msg
    for part in expected:
        assert part in msg, (part, msg)


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_bad_line_skip_mode(corpus, case, caplog):
    line, expected = BAD_LINES[case]
    m = write_lines(corpus / "train.jsonl", [good(), line, good(audio_filepath="wav/b.wav")])
    with caplog.at_level(logging.WARNING, logger="fastasr.data.manifest"):
        utts = read_manifest(m)  # skip is the default
    assert [u.id for u in utts] == ["a", "b"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("line 2:" in w and expected[0] in w for w in warnings), warnings
    assert any("skipped 1 of 3 lines" in w for w in warnings), warnings


def test_skip_mode_caps_warnings(corpus, caplog):
    m = write_lines(corpus / "m.jsonl", [good()] + [good(duration=0)] * (MAX_WARNINGS + 5))
    with caplog.at_level(logging.WARNING, logger="fastasr.data.manifest"):
        assert len(read_manifest(m)) == 1
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("expected > 0" in w for w in msgs) == MAX_WARNINGS
    assert any(f"skipped {MAX_WARNINGS + 5} of {MAX_WARNINGS + 6} lines" in w and "first" in w for w in msgs)


def test_nothing_valid_always_raises(corpus):
    m = write_lines(corpus / "m.jsonl", [good(text=""), good(duration=0)])
    with pytest.raises(ManifestError, match="no valid utterance"):
        read_manifest(m, on_error="skip")
    with pytest.raises(ManifestError, match="no such file"):
        read_manifest(corpus / "missing.jsonl")
    with pytest.raises(ValueError, match="on_error"):
        read_manifest(m, on_error="ignore")


def test_write_manifest_round_trip(corpus):
    utts = [Utterance("x", str(corpus / "wav" / "a.wav"), 0.1, "a b", "a | b", "spk")]
    out = corpus / "sub" / ".." / "out.jsonl"
    write_manifest(out, utts)
    rec = json.loads(out.read_text())
    assert rec["audio_filepath"] == "wav/a.wav"
    back = read_manifest(out, on_error="raise")
    assert back == [Utterance("x", str((corpus / "wav" / "a.wav").resolve()), 0.1, "a b", "a | b", "spk")]
