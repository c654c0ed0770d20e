"""TIMIT converter on a tiny copy in the native layout (SPHERE headers, upper/lower case)."""

from __future__ import annotations

import pytest
import soundfile as sf
from corpus_fixtures import tone, write_sphere

from fastasr.corpora import timit
from fastasr.corpora.paths import CorpusLayoutError
from fastasr.data.manifest import read_manifest
from fastasr.data.phone_sets import TIMIT_48_TO_39, TIMIT_61, TIMIT_61_TO_48, fold


def write_utt(root, split, region, speaker, sent, words, upper=True, between=()):
    """One sentence: ``words`` = [(word, [phones])]; ``between``: word indices followed by a pause."""
    case = str.upper if upper else str.lower
    d = root / case(split) / case(region) / case(speaker)
    base = d / case(sent)
    n = 16000
    write_sphere(base.with_suffix(case(".wav")), tone(1.0), 16000, f"{speaker.lower()}_{sent.lower()}")
    phn, wrd, t = [(0, 1000, "h#")], [], 1000
    for i, (word, phones) in enumerate(words):
        start = t
        for p in phones:
            phn.append((t, t + 500, p))
            t += 500
        wrd.append((start, t, word))
        if i in between:
            phn.append((t, t + 300, "pau"))
            t += 300
    phn.append((t, n, "h#"))
    base.with_suffix(case(".phn")).write_text("".join(f"{a} {b} {p}\n" for a, b, p in phn))
    base.with_suffix(case(".wrd")).write_text("".join(f"{a} {b} {w}\n" for a, b, w in wrd))
    base.with_suffix(case(".txt")).write_text(f"0 {n} {' '.join(w for w, _ in words).capitalize()}.\n")


def make_timit(root, upper=True):
    write_utt(root, "train", "dr1", "fcjf0", "si1027", [("she", ["sh", "ix"]), ("had", ["hv", "ae", "dcl", "d"])],
              upper, between=(0,))
    write_utt(root, "train", "dr1", "fcjf0", "sa1", [("she", ["sh", "iy"])], upper)  # excluded
    write_utt(root, "train", "dr2", "mabc0", "sx100", [("a", ["q", "ax"])], upper)
    write_utt(root, "test", "dr1", "faks0", "si943", [("cat", ["kcl", "k", "ae", "tcl", "t"])], upper)  # dev
    write_utt(root, "test", "dr1", "mdab0", "sx19", [("ox", ["aa", "kcl", "k", "s"])], upper)  # core test
    write_utt(root, "test", "dr2", "mxyz0", "sx1", [("no", ["n", "ow"])], upper)  # in neither list
    return root


def test_speaker_lists():
    dev, core = timit.speaker_list("dev"), timit.speaker_list("core_test")
    assert len(dev) == len(set(dev)) == 50 and len(core) == len(set(core)) == 24
    assert not set(dev) & set(core)
    assert len(TIMIT_61) == 61 and len({v for v in TIMIT_61_TO_48.values() if v}) == 48
    assert len(set(TIMIT_48_TO_39.values())) == 39
    assert fold(fold(["ao", "|", "ax-h", "q", "zh", "pau"], TIMIT_61_TO_48), TIMIT_48_TO_39) == \
        ["aa", "|", "ah", "sh", "sil"]


@pytest.mark.parametrize("upper", [True, False])
def test_timit_partial_copy(tmp_path, upper):
    src = make_timit(tmp_path / "TIMIT", upper)
    out = tmp_path / "m"
    # the standard splits need all their speakers: a clear error for a partial copy
    with pytest.raises(CorpusLayoutError, match=r"2 speakers of the standard train split; expected 462"):
        timit.convert(src, out)
    for n in range(460):  # fill TRAIN to 462 speakers: now dev is the incomplete split
        (src / ("TRAIN" if upper else "train") / "DR8" / f"MFAKE{n}").mkdir(parents=True)
    with pytest.raises(CorpusLayoutError, match=r"1 speakers of the standard dev split; expected 50 \(missing: fadg0"):
        timit.convert(src, out)
    assert timit.main([str(src), str(out), "--partial"]) == 0
    train = {u.id: u for u in read_manifest(out / "train.jsonl", on_error="raise")}
    assert set(train) == {"fcjf0_si1027", "mabc0_sx100"}  # SA sentences excluded, lower-case paths read
    u = train["fcjf0_si1027"]
    assert u.phonemes == "h# | sh ix | pau | hv ae dcl d | h#"  # all 61-set labels, | between words
    assert u.text == "she had" and u.speaker == "fcjf0" and u.duration == pytest.approx(1.0)
    assert sf.info(u.audio_filepath).format == "NIST"  # the SPHERE file is read in place
    assert train["mabc0_sx100"].phonemes == "h# | q ax | h#"
    assert train["mabc0_sx100"].audio_filepath.endswith("SX100.WAV" if upper else "sx100.wav")
    assert [u.id for u in read_manifest(out / "dev.jsonl")] == ["faks0_si943"]
    assert [u.id for u in read_manifest(out / "test.jsonl")] == ["mdab0_sx19"]


def test_timit_bad_input(tmp_path, caplog):
    src = make_timit(tmp_path / "corpus" / "data")  # found below data/
    (src / "TRAIN" / "DR1" / "FCJF0" / "SI1027.WRD").unlink()  # half-extracted sentence
    phn = src / "TEST" / "DR1" / "MDAB0" / "SX19.PHN"
    phn.write_text(phn.read_text().replace(" k\n", " kk\n"))  # not a TIMIT phone
    with pytest.raises(CorpusLayoutError, match="no usable test utterance"):
        timit.convert(tmp_path / "corpus", tmp_path / "m", partial=True)
    assert "SI1027.PHN: no .wrd beside it (skipped)" in caplog.text
    assert "SX19.PHN: not a TIMIT phone (['kk']; expected the 61 of TIMIT) (skipped)" in caplog.text
    with pytest.raises(CorpusLayoutError, match="no TRAIN/ and TEST/"):
        timit.convert(tmp_path, tmp_path / "m")
    with pytest.raises(CorpusLayoutError, match="no such directory"):
        timit.convert(tmp_path / "missing", tmp_path / "m")
