"""Connected-digit builder on tiny AudioMNIST and FSDD copies (tones as digits)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
from corpus_fixtures import tone, write_wav

from fastasr.corpora import digits
from fastasr.corpora.marker import MARKER
from fastasr.corpora.paths import CorpusLayoutError
from fastasr.data.manifest import read_manifest

FSDD_SPEAKERS = ("george", "jackson", "lucas", "nicolas", "theo", "yweweler")
DIGIT_S = 0.2  # every fixture digit is a 0.2 s tone between 0.1 s of silence


def recording(digit, rate):
    """0.1 s silence, a 0.2 s tone whose pitch encodes the digit, 0.1 s silence."""
    silence = np.zeros(int(0.1 * rate), np.float32)
    return np.concatenate([silence, tone(DIGIT_S, rate, 200 + 100 * digit), silence])


def make_fsdd(root, speakers=FSDD_SPEAKERS, per_digit=2, rate=8000):
    rec = root / "recordings"
    for s in speakers:
        for d in range(10):
            for i in range(per_digit):
                write_wav(rec / f"{d}_{s}_{i}.wav", recording(d, rate), rate, subtype="PCM_16")
    (root / "metadata.py").write_text("metadata = {\n" + "".join(
        f"    '{s}': {{'gender': 'male', 'accent': 'x', 'language': 'english'}},\n" for s in speakers) + "}\n")
    return root


def make_audiomnist(root, speakers=6, rate=48000):
    data = root / "data"
    for n in range(1, speakers + 1):
        for d in range(10):
            write_wav(data / f"{n:02d}" / f"{d}_{n:02d}_0.wav", recording(d, rate), rate, subtype="PCM_16")
    meta = {f"{n:02d}": {"accent": "German", "age": "30", "gender": "male"} for n in range(1, speakers + 1)}
    (data / "audioMNIST_meta.txt").write_text(json.dumps(meta))
    return root


def check_corpus(out, rate, n_strings, speaker_disjoint=True):
    split_speakers = {}
    for split in digits.SPLITS:
        utts = read_manifest(out / f"{split}.jsonl", on_error="raise")
        assert len(utts) == n_strings[split]
        split_speakers[split] = {u.speaker for u in utts}
        for u in utts:
            words = u.text.split()
            assert 3 <= len(words) <= 9 and set(words) <= set(digits.DIGIT_WORDS)
            info = sf.info(u.audio_filepath)
            assert info.samplerate == rate and info.subtype == "PCM_16"
            assert u.duration == pytest.approx(info.frames / rate, abs=1e-5)
            # trimmed digits + pauses: between the shortest and longest possible strings
            n = len(words)
            lo = n * DIGIT_S + (n - 1) * digits.PAUSE_S[0] + 2 * digits.EDGE_S[0]
            hi = n * (DIGIT_S + 0.04) + (n - 1) * digits.PAUSE_S[1] + 2 * digits.EDGE_S[1]
            assert lo - 0.01 <= u.duration <= hi + 0.01
    if speaker_disjoint:
        assert not split_speakers["train"] & split_speakers["dev"]
        assert not split_speakers["train"] & split_speakers["test"]
        assert not split_speakers["dev"] & split_speakers["test"]
    return split_speakers


def test_trim_silence():
    rate = 8000
    wav = recording(3, rate)
    trimmed = digits.trim_silence(wav, rate)
    assert DIGIT_S <= trimmed.shape[0] / rate <= DIGIT_S + 0.021  # one 10 ms frame of margin each side
    assert digits.trim_silence(np.zeros(800, np.float32), rate).shape == (0,)


def test_fsdd_build_deterministic_idempotent(tmp_path, capsys):
    src = make_fsdd(tmp_path / "fsdd")
    counts = {"train": 8, "dev": 3, "test": 3}
    assert digits.build(src, tmp_path / "a", counts=counts, split="speakers")
    speakers = check_corpus(tmp_path / "a", 8000, counts)
    assert len(speakers["train"]) == 4 and len(speakers["dev"]) == len(speakers["test"]) == 1  # FSDD: 4/1/1
    text = {s: (tmp_path / "a" / f"{s}.jsonl").read_bytes() for s in digits.SPLITS}
    # the digits said are the digits written: each tone's pitch encodes its digit
    rec = json.loads(text["train"].splitlines()[0])
    assert [int(f.split("_")[0]) for f in rec["sources"]] == [int(c) for c in rec["digits"]]
    assert rec["text"] == " ".join(digits.DIGIT_WORDS[int(c)] for c in rec["digits"])
    # deterministic: another directory, same bytes
    assert digits.build(src, tmp_path / "b", counts=counts, split="speakers")
    for s in digits.SPLITS:
        assert (tmp_path / "b" / f"{s}.jsonl").read_bytes() == text[s]
    a_wavs = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.wav"))
    assert all((tmp_path / "a" / p).read_bytes() == (tmp_path / "b" / p).read_bytes() for p in a_wavs)
    # idempotent: a second run does nothing
    capsys.readouterr()
    mtime = (tmp_path / "a" / "train.jsonl").stat().st_mtime_ns
    assert digits.main([str(src), str(tmp_path / "a"), "--train", "8", "--dev", "3", "--test", "3",
                        "--split", "speakers"]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert (tmp_path / "a" / "train.jsonl").stat().st_mtime_ns == mtime
    # another seed: other speakers or strings
    assert digits.build(src, tmp_path / "a", counts=counts, seed=1, split="speakers")
    assert "rebuilding" in capsys.readouterr().out
    assert any((tmp_path / "a" / f"{s}.jsonl").read_bytes() != text[s] for s in digits.SPLITS)


def test_audiomnist_resampled_named_speakers(tmp_path):
    src = make_audiomnist(tmp_path / "AudioMNIST")
    counts = {"train": 4, "dev": 2, "test": 2}
    out = tmp_path / "o"
    assert digits.main([str(src), str(out), "--sample-rate", "16000", "--dev-speakers", "02,03",
                        "--test-speakers", "1", "--train", "4", "--dev", "2", "--test", "2"]) == 0
    speakers = check_corpus(out, 16000, counts)
    assert speakers["dev"] == {"02", "03"} and len(speakers["test"]) == 1 and len(speakers["train"]) == 3
    settings = json.loads((out / MARKER).read_text())
    assert settings["corpus"] == "audiomnist" and settings["speakers"]["dev"] == ["02", "03"]


def test_bad_recordings_are_counted_and_skipped(tmp_path, capsys):
    src = make_fsdd(tmp_path / "fsdd")
    (src / "recordings" / "3_theo_0.wav").write_bytes(b"RIFF garbage")
    write_wav(src / "recordings" / "4_theo_0.wav", np.zeros(800, np.float32), 8000)
    assert digits.build(src, tmp_path / "o", counts={"train": 4, "dev": 2, "test": 2}, split="speakers")
    out = capsys.readouterr().out
    assert "skipped 2 recordings: 1 unreadable audio" in out and "1 empty or silent recording" in out
    for split in digits.SPLITS:
        for line in (tmp_path / "o" / f"{split}.jsonl").read_text().splitlines():
            assert not {"3_theo_0.wav", "4_theo_0.wav"} & set(json.loads(line)["sources"])


def test_layout_errors(tmp_path):
    with pytest.raises(CorpusLayoutError, match="no such directory"):
        digits.build(tmp_path / "nowhere", tmp_path / "o")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusLayoutError, match="neither AudioMNIST nor FSDD"):
        digits.build(tmp_path / "empty", tmp_path / "o")
    (tmp_path / "norec" / "recordings").mkdir(parents=True)
    with pytest.raises(CorpusLayoutError, match="no recordings named"):
        digits.build(tmp_path / "norec", tmp_path / "o")
    # half-downloaded: the metadata names 6 speakers, 2 have no recordings
    src = make_fsdd(tmp_path / "half", speakers=FSDD_SPEAKERS[:4])
    (src / "metadata.py").write_text(make_fsdd(tmp_path / "full", per_digit=1).joinpath("metadata.py").read_text())
    with pytest.raises(CorpusLayoutError, match=r"no recordings of 2 of the 6 speakers .*theo, yweweler.*half-downloaded"):
        digits.build(src, tmp_path / "o")
    # a speaker without some digit
    src = make_audiomnist(tmp_path / "am", speakers=6)
    for p in (src / "data" / "05").glob("7_*.wav"):
        p.unlink()
    with pytest.raises(CorpusLayoutError, match=r"speaker 05 has no recordings of digit\(s\) \[7\]"):
        digits.build(src, tmp_path / "o")
    # too few speakers for the splits
    src = make_fsdd(tmp_path / "three", speakers=FSDD_SPEAKERS[:2], per_digit=1)
    (src / "metadata.py").unlink()
    with pytest.raises(ValueError, match="no train speaker left"):
        digits.build(src, tmp_path / "o", split="speakers")
    with pytest.raises(ValueError, match="--split 'halves'"):
        digits.build(src, tmp_path / "o", split="halves")


def test_fsdd_default_split_is_by_recording(tmp_path, capsys):
    """FSDD's own protocol: recordings 0-4 of every speaker and digit are test; 5-9 dev here."""
    speakers = ("george", "theo")
    src = make_fsdd(tmp_path / "fsdd", speakers=speakers, per_digit=12)
    counts = {"train": 6, "dev": 4, "test": 4}
    assert digits.build(src, tmp_path / "o", counts=counts)
    assert "split by recordings" in capsys.readouterr().out
    split_speakers = check_corpus(tmp_path / "o", 8000, counts, speaker_disjoint=False)
    assert all(split_speakers[s] == set(speakers) for s in digits.SPLITS)
    wanted = {"test": set(range(5)), "dev": set(range(5, 10)), "train": {10, 11}}
    for split in digits.SPLITS:
        used = {int(f.rsplit("_", 1)[1].removesuffix(".wav"))
                for line in (tmp_path / "o" / f"{split}.jsonl").read_text().splitlines()
                for f in json.loads(line)["sources"]}
        assert used and used <= wanted[split]  # no recording in two splits
    assert json.loads((tmp_path / "o" / MARKER).read_text())["split"] == "recordings"
    with pytest.raises(ValueError, match="need --split speakers"):
        digits.build(src, tmp_path / "p", counts=counts, test_speakers=["theo"])
    # too few recordings for a split: the error names the speaker, digits and split
    short = make_fsdd(tmp_path / "short", speakers=speakers, per_digit=7)
    with pytest.raises(CorpusLayoutError, match=r"speaker george has no usable recording of digit\(s\) "
                                                r"\[0, 1, 2, 3, 4, 5, 6, 7, 8, 9\] among its train recordings"):
        digits.build(short, tmp_path / "q", counts=counts)
