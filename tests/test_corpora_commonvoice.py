"""Common Voice converter on a tiny release in the native layout (TSVs + MP3 clips)."""

from __future__ import annotations

import pytest
import soundfile as sf
from corpus_fixtures import tone, write_wav

from fastasr.corpora import commonvoice
from fastasr.corpora.paths import CorpusLayoutError
from fastasr.data.manifest import read_manifest

HEADER = "client_id\tpath\tsentence_id\tsentence\tsentence_domain\tup_votes\tdown_votes\tage\tgender\taccents\tvariant\tlocale\tsegment\n"


def row(client, clip, sentence):
    return f"{client}\t{clip}\tsid\t{sentence}\t\t2\t0\t\t\t\t\ten\t\n"


def make_cv(root):
    lang = root / "cv-corpus-17.0-2024-03-15" / "en"
    clips = lang / "clips"
    for i, seconds in enumerate([1.0, 0.6, 0.8]):
        write_wav(clips / f"common_voice_en_{i}.mp3", tone(seconds, 48000), 48000, format="MP3")
    (clips / "common_voice_en_9.mp3").write_bytes(b"")  # a truncated download
    (lang / "train.tsv").write_text(HEADER + row("c1", "common_voice_en_0.mp3", '"Hello," she said — it’s well-known!')
                                    + row("c2", "common_voice_en_1.mp3", "Ça va? Très bien.")
                                    + row("c2", "common_voice_en_7.mp3", "Missing clip.")
                                    + row("c2", "common_voice_en_9.mp3", "Empty clip.")
                                    + row("c3", "common_voice_en_1.mp3", "?!"))
    (lang / "dev.tsv").write_text(HEADER + row("c4", "common_voice_en_2.mp3", "Dev sentence."))
    (lang / "test.tsv").write_text(HEADER + row("c5", "common_voice_en_2.mp3", "Test sentence."))
    return lang


def test_commonvoice_mp3_and_normalised_text(tmp_path, caplog):
    lang = make_cv(tmp_path)
    assert commonvoice.main([str(lang.parent), str(tmp_path / "m")]) == 0  # the release dir, one language
    train = read_manifest(tmp_path / "m" / "train.jsonl", on_error="raise")
    assert [(u.text, u.speaker) for u in train] == [("hello she said it's well known", "c1"), ("ça va très bien", "c2")]
    assert train[0].audio_filepath.endswith(".mp3") and train[0].duration == pytest.approx(1.0, abs=0.06)
    assert "train.tsv line 4: clip missing" in caplog.text
    assert "train.tsv line 6: empty transcript ('?!')" in caplog.text
    assert "common_voice_en_9.mp3: unreadable audio" in caplog.text
    assert [u.text for u in read_manifest(tmp_path / "m" / "dev.jsonl")] == ["dev sentence"]


def test_commonvoice_to_wav(tmp_path):
    lang = make_cv(tmp_path)
    recs = commonvoice.convert(lang, tmp_path / "m", sample_rate=16000)
    info = sf.info(recs["train"][0]["audio_filepath"])
    assert info.samplerate == 16000 and info.format == "WAV"
    assert recs["train"][0]["duration"] == pytest.approx(1.0, abs=0.06)


def test_commonvoice_layout_errors(tmp_path):
    lang = make_cv(tmp_path)
    (lang / "dev.tsv").unlink()
    with pytest.raises(CorpusLayoutError, match=r"no dev.tsv \(a half-extracted release\?\)"):
        commonvoice.convert(lang, tmp_path / "m")
    with pytest.raises(CorpusLayoutError, match="no train.tsv here"):
        commonvoice.convert(tmp_path, tmp_path / "m")
    with pytest.raises(CorpusLayoutError, match="no such directory"):
        commonvoice.convert(tmp_path / "nope", tmp_path / "m")
    (lang / "dev.tsv").write_text("path\tfoo\nx.mp3\ty\n")
    with pytest.raises(CorpusLayoutError, match=r"dev.tsv: header \['path', 'foo'\]; expected columns"):
        commonvoice.convert(lang, tmp_path / "m")
