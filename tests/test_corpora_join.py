"""fastasr.corpora.join: a manifest's utterances joined with pauses into longer ones, with the
speaker changing at every join; the training manifest of both."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from fastasr.corpora.join import build_joined_corpus, draw_joins, main
from fastasr.data.manifest import read_manifest, write_manifest

RATE = 16000


def manifest(d: Path, speakers=("a", "a", "b", "b", "c", "c"), phonemes: bool = True) -> Path:
    """Six 1-2.5 s noise utterances of three speakers."""
    rows = []
    for i, spk in enumerate(speakers):
        seconds = 1.0 + 0.3 * i
        path = d / f"u{i}.wav"
        sf.write(path, (0.1 * np.random.default_rng(i).standard_normal(int(seconds * RATE))).astype(np.float32),
                 RATE, subtype="PCM_16")
        row = {"id": f"u{i}", "audio_filepath": str(path), "duration": seconds, "text": f"word{i}"}
        row.update({"phonemes": f"w {i}"} if phonemes else {})
        row.update({"speaker": spk} if spk else {})
        rows.append(row)
    write_manifest(d / "train.jsonl", rows)
    return d / "train.jsonl"


def test_joined_utterances_mix_speakers_within_the_durations(tmp_path):
    src = manifest(tmp_path)
    train = build_joined_corpus(src, tmp_path / "out", count=12, min_seconds=4.0, max_seconds=6.0, pause_s=(0.2, 0.5))
    originals, everything = read_manifest(src), read_manifest(train)
    joined = read_manifest(tmp_path / "out" / "joined.jsonl")
    assert len(joined) == 12 and [u.id for u in everything] == [u.id for u in originals] + [u.id for u in joined]
    by_id = {u.id: u for u in originals}
    lines = [json.loads(x) for x in (tmp_path / "out" / "joined.jsonl").read_text().splitlines()]
    for utt, line in zip(joined, lines, strict=True):
        parts = [by_id[p] for p in line["parts"]]
        assert len(parts) >= 2 and utt.duration <= 6.0 + 1e-3
        assert utt.duration == pytest.approx(sf.info(utt.audio_filepath).duration, abs=1e-3)
        speech = sum(p.duration for p in parts)
        assert 0.2 * (len(parts) - 1) - 1e-3 <= utt.duration - speech <= 0.5 * (len(parts) - 1) + 1e-3  # the pauses
        assert all(a.speaker != b.speaker for a, b in zip(parts, parts[1:]))  # the voice changes at every join
        assert utt.speaker == "+".join(p.speaker for p in parts)
        assert utt.text == " ".join(p.text for p in parts) and utt.phonemes == " | ".join(p.phonemes for p in parts)
        first, _ = sf.read(parts[0].audio_filepath, dtype="float32")
        audio, _ = sf.read(utt.audio_filepath, dtype="float32")
        np.testing.assert_array_equal(audio[:first.shape[0]], first)  # the samples, in order
    # deterministic and idempotent: the same settings rebuild nothing; another seed draws other joins
    stamp = Path(joined[0].audio_filepath).stat().st_mtime_ns
    assert build_joined_corpus(src, tmp_path / "out", count=12, min_seconds=4.0, max_seconds=6.0,
                               pause_s=(0.2, 0.5)) == train
    assert Path(joined[0].audio_filepath).stat().st_mtime_ns == stamp
    utts = read_manifest(src)
    assert draw_joins(utts, 5, 4.0, 6.0, (0.2, 0.5), seed=0) == draw_joins(utts, 5, 4.0, 6.0, (0.2, 0.5), seed=0)
    assert draw_joins(utts, 5, 4.0, 6.0, (0.2, 0.5), seed=0) != draw_joins(utts, 5, 4.0, 6.0, (0.2, 0.5), seed=1)


def test_without_speakers_or_phonemes_the_joins_say_less(tmp_path):
    src = manifest(tmp_path, speakers=(None,) * 6, phonemes=False)
    build_joined_corpus(src, tmp_path / "out", count=3, min_seconds=3.0, max_seconds=5.0)
    for line in (tmp_path / "out" / "joined.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert "speaker" not in row and "phonemes" not in row and row["text"]


@pytest.mark.parametrize("args, message", [
    (["--min-seconds", "8", "--max-seconds", "4"], "expected 0 < min <= max"),
    (["--pause-s", "0.5", "0.1"], "expected 0 <= low <= high"),
    (["--count", "0"], "expected >= 1"),
])
def test_bad_settings_exit_2_naming_the_option(tmp_path, capsys, args, message):
    src = manifest(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main([str(src), str(tmp_path / "out"), *args])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out" / ".complete").exists()
