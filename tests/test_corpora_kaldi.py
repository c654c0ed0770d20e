"""Kaldi data-directory converter: plain paths, opt-in pipes, segments, bad lines."""

from __future__ import annotations

import shlex
import sys

import numpy as np
import pytest
import soundfile as sf
from corpus_fixtures import tone, write_wav

from fastasr.corpora import kaldi
from fastasr.corpora.paths import CorpusLayoutError
from fastasr.data.manifest import read_manifest


def make_plain(tmp_path):
    d = tmp_path / "data" / "train_si284"
    d.mkdir(parents=True)
    write_wav(tmp_path / "audio" / "a.wav", tone(0.8, 8000), 8000, subtype="PCM_16")
    write_wav(tmp_path / "audio" / "b.wav", tone(0.4), 16000, subtype="PCM_16")
    (d / "wav.scp").write_text(f"spk1-a {tmp_path / 'audio' / 'a.wav'}\nspk2-b {tmp_path / 'audio' / 'b.wav'}\n"
                               f"spk2-c {tmp_path / 'audio' / 'gone.wav'}\n")
    (d / "text").write_text("spk1-a THE CAT SAT.\nspk2-b Hello <NOISE>\nspk2-c MISSING AUDIO\nspk3-d NO WAV ENTRY\n")
    (d / "utt2spk").write_text("spk1-a spk1\nspk2-b spk2\nspk2-c spk2\nspk3-d spk3\n")
    return d


def test_kaldi_plain_paths(tmp_path, caplog):
    d = make_plain(tmp_path)
    assert kaldi.main([str(d), str(tmp_path / "m")]) == 0
    utts = read_manifest(tmp_path / "m" / "train_si284.jsonl", on_error="raise")
    assert [(u.id, u.text, u.speaker) for u in utts] == [("spk1-a", "the cat sat", "spk1"), ("spk2-b", "hello", "spk2")]
    assert utts[0].duration == pytest.approx(0.8) and utts[0].audio_filepath == str(tmp_path / "audio" / "a.wav")
    assert "gone.wav: audio missing (skipped)" in caplog.text
    assert "text line 4: no wav.scp entry (spk3-d) (skipped)" in caplog.text


def test_kaldi_pipes_need_opt_in_and_segments_are_cut(tmp_path):
    d = tmp_path / "data" / "swbd"
    d.mkdir(parents=True)
    rate = 8000
    rec = np.concatenate([tone(1.0, rate, 300), tone(1.0, rate, 600), tone(0.5, rate, 900)])
    write_wav(tmp_path / "sw02001.wav", rec, rate, subtype="PCM_16")
    # a command that prints a WAV on stdout, as sph2pipe does
    cmd = f"{shlex.quote(sys.executable)} -c \"import sys; sys.stdout.buffer.write(open('{tmp_path / 'sw02001.wav'}', 'rb').read())\" |"
    (d / "wav.scp").write_text(f"sw02001-A {cmd}\nsw02002-A false |\n")
    (d / "segments").write_text("sw02001-A_000000-000100 sw02001-A 0.00 1.00\n"
                                "sw02001-A_000100-000200 sw02001-A 1.00 2.00\n"
                                "sw02001-A_000200-end sw02001-A 2.00 -1\n"
                                "sw02001-A_empty sw02001-A 5.00 6.00\n"
                                "sw02002-A_000000-000100 sw02002-A 0.00 1.00\n"
                                "bad line\n")
    (d / "text").write_text("sw02001-A_000000-000100 [laughter] UH-HUH\nsw02001-A_000100-000200 yeah, right\n"
                            "sw02001-A_000200-end OK\nsw02001-A_empty NOTHING THERE\n"
                            "sw02002-A_000000-000100 THE COMMAND FAILS\n")
    with pytest.raises(CorpusLayoutError, match=r"wav.scp line 1: sw02001-A .* is a command .* --allow-pipes"):
        kaldi.convert(d, tmp_path / "m")
    recs = kaldi.convert(d, tmp_path / "m", allow_pipes=True)
    assert [(r["id"], r["text"]) for r in recs] == [
        ("sw02001-A_000000-000100", "uh huh"), ("sw02001-A_000100-000200", "yeah right"), ("sw02001-A_000200-end", "ok")]
    utts = read_manifest(tmp_path / "m" / "swbd.jsonl", on_error="raise")
    assert [u.duration for u in utts] == pytest.approx([1.0, 1.0, 0.5])
    second, r = sf.read(utts[1].audio_filepath)
    assert r == rate and np.allclose(second, rec[rate: 2 * rate], atol=1e-4)  # the right samples were cut
    assert utts[1].audio_filepath.endswith("wav/swbd/sw02001-A_000100-000200.wav")


def test_kaldi_layout_errors(tmp_path):
    with pytest.raises(CorpusLayoutError, match="no such directory"):
        kaldi.convert(tmp_path / "nope", tmp_path / "m")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "wav.scp").write_text("a /x.wav\n")
    with pytest.raises(CorpusLayoutError, match="no text; expected a Kaldi data directory"):
        kaldi.convert(tmp_path / "d", tmp_path / "m")
    (tmp_path / "d" / "text").write_text("a HELLO\n")
    with pytest.raises(CorpusLayoutError, match="no usable d utterance .*audio missing"):
        kaldi.convert(tmp_path / "d", tmp_path / "m")
