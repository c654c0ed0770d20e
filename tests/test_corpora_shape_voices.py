"""The ``voices`` corpus shape: train is the source's, dev and test voices child-like (F0 and
formants raised, each speaker by its own draw), durations kept, deterministic, bad input named.
The corpora are written here (harmonic sounds with a formant), as tests/test_corpora_shapes.py
writes its own."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from corpus_fixtures import write_wav
from test_data_voice import f0_hz

from fastasr.corpora.shapes import build_shape, main
from fastasr.corpora.shapes.voices import speaker_voice
from fastasr.data.audio import load_audio
from fastasr.data.manifest import write_manifest

RATE = 16000
F0 = {"a": 110.0, "b": 130.0, "d": 120.0, "e": 180.0, "f": 100.0, "g": 210.0}


def voice(f0: float, seconds: float, rate: int = RATE) -> np.ndarray:
    """Harmonics of ``f0`` under one formant at 700 Hz, with a little noise."""
    t = np.arange(int(round(seconds * rate))) / rate
    x = sum(np.exp(-(((k * f0) - 700) / 300) ** 2) * np.sin(2 * np.pi * k * f0 * t + 0.3 * k * k)
            for k in range(1, int(rate / 2 / f0)))
    x = x + 0.001 * np.random.default_rng(int(f0)).standard_normal(t.size)
    return (0.3 * x / np.abs(x).max()).astype(np.float32)


def make_voices_corpus(root: Path, rate: int = RATE) -> Path:
    counts = {"train": {"a": 2, "b": 1}, "dev": {"d": 1, "e": 1}, "test": {"f": 2, "g": 1}}
    for split, speakers in counts.items():
        rows = []
        for spk, n in speakers.items():
            for k in range(n):
                dur = 0.6 + 0.25 * k
                path = root / "audio" / f"{spk}-{k}.wav"
                write_wav(path, voice(F0[spk], dur, rate), rate, subtype="PCM_16")
                rows.append({"id": f"{spk}-{k}", "audio_filepath": f"audio/{path.name}", "duration": dur,
                             "text": f"words of {spk}", "speaker": spk})
        write_manifest(root / f"{split}.jsonl", rows)
    return root


def lines(path: Path) -> list[dict]:
    """A manifest's lines, ``audio_filepath`` resolved (manifests may hold paths relative to themselves)."""
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return [{**r, "audio_filepath": str((path.parent / r["audio_filepath"]).resolve())} for r in rows]


@pytest.fixture
def corpus(tmp_path) -> Path:
    return make_voices_corpus(tmp_path / "src")


def test_train_is_the_source_and_dev_test_voices_rise_per_speaker(corpus, tmp_path, capsys):
    out = tmp_path / "voices"
    build_shape("voices", corpus, out, seed=3)
    assert "voices shape of" in capsys.readouterr().out
    src_train = lines(corpus / "train.jsonl")
    train = lines(out / "train.jsonl")
    assert [r["id"] for r in train] == [r["id"] for r in src_train]
    assert all(r["audio_filepath"] == s["audio_filepath"] and "voice" not in r for r, s in zip(train, src_train))
    for split in ("dev", "test"):
        source = {r["id"]: r for r in lines(corpus / f"{split}.jsonl")}
        rows = lines(out / f"{split}.jsonl")
        assert sorted(r["id"] for r in rows) == sorted(source)
        by_speaker: dict[str, set] = {}
        for r in rows:
            v = r["voice"]
            assert 4.0 <= v["semitones"] <= 7.0 and 1.15 <= v["formant_scale"] <= 1.25
            by_speaker.setdefault(r["speaker"], set()).add((v["semitones"], v["formant_scale"]))
            assert Path(r["audio_filepath"]).parent == (out / "wav" / split).resolve()
            assert r["duration"] == source[r["id"]]["duration"] and r["text"] == source[r["id"]]["text"]
            new = load_audio(r["audio_filepath"])
            old = load_audio(source[r["id"]]["audio_filepath"])
            assert new.shape == old.shape  # the duration, to the sample
            assert sf.info(r["audio_filepath"]).subtype == "PCM_16"
            assert f0_hz(new) / f0_hz(old) == pytest.approx(2 ** (v["semitones"] / 12), rel=0.03)
        assert all(len(v) == 1 for v in by_speaker.values())  # one voice per speaker
    voices = {r["voice"]["semitones"] for s in ("dev", "test") for r in lines(out / f"{s}.jsonl")}
    assert len(voices) == 4  # four speakers, four draws


def test_voices_are_deterministic_by_seed_and_keyed_by_speaker(corpus, tmp_path):
    a, b, c = (build_shape("voices", corpus, tmp_path / n, seed=s) for n, s in (("a", 1), ("b", 1), ("c", 2)))
    assert [r["voice"] for r in a["test"]] == [r["voice"] for r in b["test"]]
    assert [r["voice"] for r in a["test"]] != [r["voice"] for r in c["test"]]
    for x, y in zip(lines(tmp_path / "a" / "test.jsonl"), lines(tmp_path / "b" / "test.jsonl")):
        assert Path(x["audio_filepath"]).read_bytes() == Path(y["audio_filepath"]).read_bytes()
    assert speaker_voice(1, "test", "f", (4, 7), (1.15, 1.25)) == speaker_voice(1, "test", "f", (4, 7), (1.15, 1.25))
    assert speaker_voice(1, "test", "f", (4, 7), (1.15, 1.25)) != speaker_voice(1, "test", "g", (4, 7), (1.15, 1.25))


def test_options_and_the_8_khz_rate(tmp_path):
    src = make_voices_corpus(tmp_path / "src8k", rate=8000)
    out = tmp_path / "low"
    main(["voices", str(src), str(out), "--semitones", "-3", "-3", "--formant-scale", "0.9", "0.9"])
    for r in lines(out / "test.jsonl"):
        assert r["voice"] == {"semitones": -3.0, "formant_scale": 0.9}
        assert sf.info(r["audio_filepath"]).samplerate == 8000
        old = load_audio(src / "audio" / Path(r["audio_filepath"]).name)
        assert f0_hz(load_audio(r["audio_filepath"]), 8000) / f0_hz(old, 8000) == pytest.approx(2 ** (-3 / 12), rel=0.03)


def test_bad_options_exit_2_naming_the_option(corpus, tmp_path, capsys):
    for option, values in (("--semitones", ["7", "4"]), ("--formant-scale", ["0", "1.2"])):
        with pytest.raises(SystemExit) as exit_info:
            main(["voices", str(corpus), str(tmp_path / "o"), option, *values])
        assert exit_info.value.code == 2
        assert f"{option} {float(values[0]):g} {float(values[1]):g}; expected" in capsys.readouterr().err


def test_unusable_test_audio_is_skipped_naming_the_file(corpus, tmp_path, caplog):
    bad = corpus / "audio" / "g-0.wav"
    samples = voice(F0["g"], 0.6)
    samples[100] = math.nan
    sf.write(bad, samples, RATE, subtype="FLOAT")  # a readable header, NaN samples
    out = tmp_path / "voices"
    records = build_shape("voices", corpus, out)
    assert [r["id"] for r in records["test"]] == ["f-0", "f-1"]
    assert any(str(bad) in r.getMessage() and "NaN" in r.getMessage() for r in caplog.records)
    assert [r["id"] for r in lines(out / "test.jsonl")] == ["f-0", "f-1"]
