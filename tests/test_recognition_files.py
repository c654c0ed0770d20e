"""Per-utterance results: alignments, the S/D/I breakdown and the recogs/errs files."""

from fastasr.decoding.emissions import score
from fastasr.decoding.metrics import Transcript, align
from fastasr.decoding.recognition_files import aligned_text, write_recognition_files
from fastasr.rundir import RunDir


def test_breakdown_and_files(tmp_path):
    def transcript(uid, ref_words, hyp_words, ref_units, hyp_units):
        return Transcript(uid, ref_words, hyp_words, list(ref_units), list(hyp_units),
                          list(ref_units.replace("|", "")), list(hyp_units.replace("|", "")))

    transcripts = [
        transcript("u1", ["the", "cat", "sat"], ["the", "cap", "sat", "down"], "ðə|kæt|sæt", "ðə|kæp|sæt"),
        transcript("u2", ["a", "dog"], ["dog"], "ə|dɒɡ", "dɒɡ"),
    ]
    result, words, units = score(transcripts, "per", keep_chunks=True)
    assert result["wer_breakdown"] == {"substitutions": 1, "deletions": 1, "insertions": 1, "reference": 5,
                                       "rate": 60.0}
    assert result["wer"] == 60.0
    # units without boundaries: ðəkætsæt / ðəkæpsæt (1 sub of 8), ədɒɡ / dɒɡ (1 del of 4)
    assert (units.substitutions, units.deletions, units.insertions, units.reference_length) == (1, 1, 0, 12)

    paths = write_recognition_files(RunDir(tmp_path).recognition_files("test-beam"), transcripts, words, units, "PER")
    assert paths["errs"] == tmp_path / "errs-test-beam.txt" and paths["recogs"].name == "recogs-test-beam.txt"
    recogs = paths["recogs"].read_text()
    assert "u1:\tref=the cat sat" in recogs and "u1:\thyp=the cap sat down" in recogs
    errs = paths["errs"].read_text()
    assert errs.startswith("%WER 60.00 [ 3 / 5, 1 ins, 1 del, 1 sub ]")
    assert "u1:\tthe (cat->cap) sat [+down]" in errs and "u2:\t[-a] dog" in errs
    assert "1\tcat -> cap" in errs
    assert paths["errs_units"].read_text().startswith("%PER 16.67 [ 2 / 12")


def test_empty_reference_counts_insertions():
    a = align([[], ["x"]], [["y", "z"], ["x"]], keep_chunks=True)
    assert (a.insertions, a.reference_length) == (2, 1)
    assert aligned_text([], ["y", "z"], a.chunks[0]) == "[+y] [+z]"
