"""LibriSpeech converter on a tiny copy in the native layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from corpus_fixtures import tone, write_wav

from fastasr.corpora import librispeech
from fastasr.corpora.paths import CorpusLayoutError
from fastasr.data.manifest import read_manifest


def make_librispeech(root):
    d = root / "LibriSpeech" / "dev-clean" / "19" / "198"
    (d.parent.parent.parent / "test-clean" / "20" / "7").mkdir(parents=True)
    write_wav(d / "19-198-0000.flac", tone(1.0), 16000)
    write_wav(d / "19-198-0001.flac", tone(0.5), 16000)
    write_wav(d / "19-198-0002.flac", tone(0.5), 16000)
    (d / "19-198.trans.txt").write_text("19-198-0000 HELLO WORLD\n19-198-0001 IT'S A XYZZYQ TEST\n"
                                        "19-198-0002 GONE\n19-198-0003 NO AUDIO FOR THIS ONE\n")
    t = root / "LibriSpeech" / "test-clean" / "20" / "7"
    write_wav(t / "20-7-0000.flac", tone(0.7), 16000)
    (t / "20-7.trans.txt").write_text("20-7-0000 THE CAT\n")
    (d / "19-198-0002.flac").write_bytes(b"not audio")  # a corrupt download
    return root / "LibriSpeech"


def test_librispeech_char_and_phonemes(tmp_path, capsys):
    src = make_librispeech(tmp_path)
    out = tmp_path / "manifests"
    assert librispeech.main([str(src), str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["dev-clean.jsonl", "test-clean.jsonl"]
    utts = read_manifest(out / "dev-clean.jsonl", on_error="raise")
    assert [(u.id, u.text, u.speaker) for u in utts] == [
        ("19-198-0000", "hello world", "19"), ("19-198-0001", "it's a xyzzyq test", "19")]
    assert utts[0].duration == pytest.approx(1.0) and utts[1].duration == pytest.approx(0.5)
    printed = capsys.readouterr().out
    assert "skipped 2 utterances" in printed and "audio missing" in printed and "unreadable audio" in printed

    librispeech.convert(src, out, parts=["dev-clean"], phonemes=True)
    utts = read_manifest(out / "dev-clean.jsonl", on_error="raise")
    assert [(u.id, u.phonemes) for u in utts] == [("19-198-0000", "hh ah l ow | w er l d")]  # no stress marks
    printed = capsys.readouterr().out
    assert "word not in CMUdict" in printed and "xyzzyq (1)" in printed


def test_librispeech_one_part_and_errors(tmp_path):
    src = make_librispeech(tmp_path)
    recs = librispeech.convert(src / "test-clean", tmp_path / "o")  # SRC may be one part
    assert list(recs) == ["test-clean"] and json.loads((tmp_path / "o" / "test-clean.jsonl").read_text())["text"] == "the cat"
    with pytest.raises(CorpusLayoutError, match="no such directory"):
        librispeech.convert(tmp_path / "nowhere", tmp_path / "o")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusLayoutError, match=r"no <speaker>/<chapter>/\*.trans.txt"):
        librispeech.convert(tmp_path / "empty", tmp_path / "o")
    with pytest.raises(CorpusLayoutError, match="no part"):
        librispeech.convert(src, tmp_path / "o", parts=["train-clean-100"])
    with pytest.raises(SystemExit):
        librispeech.main([str(tmp_path / "nowhere"), str(tmp_path / "o")])


def make_mini_librispeech(root, speakers):
    """A copy of a repository holding LibriSpeech/train-clean-5 with one utterance per speaker."""
    part = root / "repo" / "LibriSpeech" / "train-clean-5"
    for spk in speakers:
        d = part / spk / "100"
        d.mkdir(parents=True)
        write_wav(d / f"{spk}-100-0000.flac", tone(0.5), 16000)
        (d / f"{spk}-100.trans.txt").write_text(f"{spk}-100-0000 WORDS OF SPEAKER {spk}\n")
    return root / "repo"


def test_mini_librispeech_fixed_speaker_split(tmp_path, capsys):
    from fastasr.corpora import mini_librispeech

    held_out = [s for split in mini_librispeech.SPLIT.values() for s in split]
    repo = make_mini_librispeech(tmp_path, [*held_out, "1088", "3526"])
    for src in (repo, repo / "LibriSpeech", repo / "LibriSpeech" / "train-clean-5"):  # any of the three levels
        assert mini_librispeech.find_part(src).name == "train-clean-5"
    assert mini_librispeech.main([str(repo), str(tmp_path / "out")]) == 0
    speakers = {s: sorted({u.speaker for u in read_manifest(tmp_path / "out" / f"{s}.jsonl")})
                for s in ("train", "dev", "test")}
    assert speakers == {"train": ["1088", "3526"], "dev": ["1737", "1867"], "test": ["19", "2136", "5789", "6848"]}
    assert read_manifest(tmp_path / "out" / "test.jsonl")[0].text.startswith("words of speaker")
    capsys.readouterr()
    mini_librispeech.main([str(repo), str(tmp_path / "out")])  # idempotent
    assert "complete" in capsys.readouterr().out


def test_mini_librispeech_names_a_missing_held_out_speaker(tmp_path):
    from fastasr.corpora import mini_librispeech

    repo = make_mini_librispeech(tmp_path, ["19", "2136", "5789", "1737", "1867", "1088"])  # 6848 missing
    with pytest.raises(CorpusLayoutError, match=r"\['6848'\].*missing"):
        mini_librispeech.build(repo, tmp_path / "out")
    with pytest.raises(CorpusLayoutError, match="no train-clean-5"):
        mini_librispeech.build(tmp_path, tmp_path / "out2")


def test_mini_librispeech_train_minutes_keeps_every_voice(tmp_path):
    from fastasr.corpora import mini_librispeech

    held_out = [s for split in mini_librispeech.SPLIT.values() for s in split]
    repo = make_mini_librispeech(tmp_path, [*held_out, "1088", "3526", "4000"])
    for spk in ("1088", "3526", "4000"):  # 4 utterances of 0.5 s each per training speaker
        d = repo / "LibriSpeech" / "train-clean-5" / spk / "100"
        for i in range(1, 4):
            write_wav(d / f"{spk}-100-000{i}.flac", tone(0.5), 16000)
        (d / f"{spk}-100.trans.txt").write_text("".join(f"{spk}-100-000{i} WORD {i}\n" for i in range(4)))
    # 2.6 s: five utterances in turn (1088, 3526, 4000, 1088, 3526) reach 2.5 s, the sixth crosses it
    mini_librispeech.main([str(repo), str(tmp_path / "sub"), "--train-minutes", str(2.6 / 60)])
    train = read_manifest(tmp_path / "sub" / "train.jsonl")
    assert [Path(u.audio_filepath).stem for u in train] == [
        "1088-100-0000", "3526-100-0000", "4000-100-0000", "1088-100-0001", "3526-100-0001", "4000-100-0001"]
    assert len(read_manifest(tmp_path / "sub" / "test.jsonl")) == 4  # dev and test untouched
    with pytest.raises(ValueError, match="--train-minutes -1"):  # before any audio is read
        mini_librispeech.build(tmp_path / "nowhere", tmp_path / "bad", train_minutes=-1)
