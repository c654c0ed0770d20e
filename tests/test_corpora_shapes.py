"""fastasr.corpora.shapes: the corpus shapes (tiny, long, resample, speakers, noisy, short) on
tiny corpora written here (tones and noise), the cut-point logic on hand-made alignments and
the forced-alignment path on a tiny character checkpoint."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from corpus_fixtures import tone, write_wav

from fastasr.corpora.shapes import build_shape, main
from fastasr.corpora.shapes.audio import plan_long
from fastasr.corpora.shapes.short import plan_segments
from fastasr.corpora.shapes.subsets import proportional_order, top_speakers
from fastasr.data.manifest import read_manifest, write_manifest

RATE = 16000


def utterance_audio(i: int, seconds: float) -> np.ndarray:
    """A tone plus faint noise, different for every ``i`` (peak below 0.2: no noisy mix clips)."""
    noise = 0.01 * np.random.default_rng(i).standard_normal(int(round(seconds * RATE)))
    return (tone(seconds, RATE, 200 + 20 * i, amp=0.1) + noise).astype(np.float32)


def make_corpus(root: Path, speakers: dict[str, dict[str, int]] | None = None, seconds=(1.0, 3.0)) -> Path:
    """``root/{train,dev,test}.jsonl`` over ``root/audio/*.wav``: for each split, each speaker's
    count of utterances, durations cycling through ``seconds`` in steps of 0.25 s."""
    speakers = speakers or {"train": {"a": 12, "b": 6, "c": 6}, "dev": {"d": 3, "e": 3}, "test": {"f": 4, "g": 2}}
    i = 0
    for split, counts in speakers.items():
        rows = []
        for spk, n in counts.items():
            for k in range(n):
                lo, hi = seconds
                dur = lo + (0.25 * i) % (hi - lo + 0.25)
                path = root / "audio" / f"{spk}-{k:02d}.wav"
                write_wav(path, utterance_audio(i, dur), RATE, subtype="PCM_16")
                rows.append({"id": f"{spk}-{k:02d}", "audio_filepath": f"audio/{path.name}", "duration": dur,
                             "text": f"word{i} and {spk}", "speaker": spk})
                i += 1
        write_manifest(root / f"{split}.jsonl", rows)
    return root


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture
def corpus(tmp_path) -> Path:
    return make_corpus(tmp_path / "src")


# ------------------------------------------------------------------ tiny


def test_proportional_order_keeps_speakers_in_proportion_in_every_prefix():
    speakers = ["a"] * 20 + ["b"] * 10 + ["c"] * 10
    order = proportional_order(speakers, seed=3)
    assert sorted(order) == list(range(40)) and order == proportional_order(speakers, seed=3)
    assert order != proportional_order(speakers, seed=4)
    for n in (4, 10, 20, 33):
        counts = Counter(speakers[i] for i in order[:n])
        for s, share in (("a", 0.5), ("b", 0.25), ("c", 0.25)):
            assert abs(counts[s] - share * n) <= 1, (n, counts)


def test_tiny_caps_utterances_and_minutes_and_keeps_speakers(corpus, tmp_path, capsys):
    out = tmp_path / "tiny"
    build_shape("tiny", corpus, out, utterances=12, minutes=60, dev_utterances=4, test_utterances=100)
    train = read_manifest(out / "train.jsonl")
    assert len(train) == 12
    assert Counter(u.speaker for u in train) == {"a": 6, "b": 3, "c": 3}
    assert len(read_manifest(out / "dev.jsonl")) == 4 and len(read_manifest(out / "test.jsonl")) == 6
    source = {u.id: u for u in read_manifest(corpus / "train.jsonl")}
    assert all(u.audio_filepath == source[u.id].audio_filepath for u in train)  # audio not copied
    assert "train 12 utterances" in capsys.readouterr().out.splitlines()[-1]
    # the minutes cap binds first
    build_shape("tiny", corpus, tmp_path / "tiny-short", utterances=1000, minutes=0.3)
    train = read_manifest(tmp_path / "tiny-short" / "train.jsonl")
    assert sum(u.duration for u in train) <= 18.0 and len(train) < 24


# ------------------------------------------------------------------ long


def test_plan_long_joins_consecutive_utterances_of_one_speaker():
    durations = [5.0] * 8 + [40.0, 6.0, 6.0]
    speakers = ["a"] * 8 + ["b"] * 3
    joins, dropped = plan_long(durations, speakers, 15.0, 35.0, (0.2, 0.6), random.Random(0))
    for picked, pauses in joins:
        assert len({speakers[i] for i in picked}) == 1 and picked == list(range(picked[0], picked[-1] + 1))
        total = sum(durations[i] for i in picked) + sum(pauses)
        assert 15.0 <= total <= 35.0 and all(0.2 <= p <= 0.6 for p in pauses)
    reasons = dict(dropped)
    assert "longer than --max-seconds 35 alone" == reasons[8]
    assert reasons[9].startswith("left over") and reasons[10].startswith("left over")  # b's 12 s cannot reach 15
    assert sorted([i for p, _ in joins for i in p] + list(reasons)) == list(range(11))


def test_long_shape_every_split_one_speaker_in_range(corpus, tmp_path):
    out = tmp_path / "long"
    build_shape("long", corpus, out, min_seconds=4.0, max_seconds=8.0, pause_s=(0.1, 0.3))
    source = {u.id: u for s in ("train", "dev", "test") for u in read_manifest(corpus / f"{s}.jsonl")}
    for split in ("train", "dev", "test"):
        rows = lines(out / f"{split}.jsonl")
        assert rows, split
        for row in rows:
            parts = [source[p] for p in row["parts"]]
            assert 4.0 <= row["duration"] <= 8.0
            assert {p.speaker for p in parts} == {row["speaker"]}
            assert row["text"] == " ".join(p.text for p in parts)
            info = sf.info(str(out / row["audio_filepath"]))
            assert info.samplerate == RATE and info.frames / RATE == pytest.approx(row["duration"], abs=1e-3)


# ------------------------------------------------------------------ resample


def test_resample_writes_16_bit_wavs_at_the_new_rate(corpus, tmp_path):
    out = tmp_path / "8k"
    assert main(["resample", str(corpus), str(out), "--sample-rate", "8000"]) == 0
    source = {u.id: u for u in read_manifest(corpus / "train.jsonl")}
    for utt in read_manifest(out / "train.jsonl"):
        info = sf.info(utt.audio_filepath)
        assert info.samplerate == 8000 and info.subtype == "PCM_16"
        assert utt.duration == pytest.approx(source[utt.id].duration, abs=1e-3)
        assert utt.text == source[utt.id].text and utt.speaker == source[utt.id].speaker
    wav, _ = sf.read(read_manifest(out / "train.jsonl")[0].audio_filepath)
    spectrum = np.abs(np.fft.rfft(wav))
    assert np.argmax(spectrum) * 8000 / wav.shape[0] == pytest.approx(200, abs=2)  # utterance 0's 200 Hz tone


# ------------------------------------------------------------------ speakers


def test_speakers_keeps_the_k_with_most_audio_and_leaves_dev_test(corpus, tmp_path):
    build_shape("speakers", corpus, tmp_path / "few", count=2)
    train = read_manifest(tmp_path / "few" / "train.jsonl")
    expected = top_speakers(read_manifest(corpus / "train.jsonl"), 2)
    assert expected[0] == "a" and {u.speaker for u in train} == set(expected)
    assert len(train) == sum(1 for u in read_manifest(corpus / "train.jsonl") if u.speaker in expected)
    for split in ("dev", "test"):
        assert lines(tmp_path / "few" / f"{split}.jsonl") == [
            {**r, "audio_filepath": str((corpus / r["audio_filepath"]).resolve())} for r in lines(corpus / f"{split}.jsonl")]


def test_more_speakers_than_the_source_has_exits_2_naming_the_option(corpus, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["speakers", str(corpus), str(tmp_path / "many"), "--count", "20"])
    assert exit_info.value.code == 2
    assert "--count 20; expected 1 to 3" in capsys.readouterr().err


# ------------------------------------------------------------------ noisy


def test_noisy_snr_within_range_babble_of_other_speakers_deterministic(corpus, tmp_path):
    out = tmp_path / "noisy"
    build_shape("noisy", corpus, out, snr_db=(5.0, 15.0), babble_talkers=2, seed=7)
    source = {u.id: u for s in ("train", "dev", "test") for u in read_manifest(corpus / f"{s}.jsonl")}
    snrs = []
    for split in ("train", "dev", "test"):
        split_ids = {u.id for u in read_manifest(corpus / f"{split}.jsonl")}
        for row in lines(out / f"{split}.jsonl"):
            clean, _ = sf.read(source[row["id"]].audio_filepath, dtype="float32")
            noisy, rate = sf.read(str(out / row["audio_filepath"]), dtype="float32")
            assert rate == RATE and noisy.shape == clean.shape
            measured = 10 * np.log10(np.mean(clean.astype(np.float64) ** 2) / np.mean((noisy - clean) ** 2.0))
            assert measured == pytest.approx(row["snr_db"], abs=0.1)
            assert 5.0 <= row["snr_db"] <= 15.0 and row["noise"]["colour"] in ("pink", "brown")
            babble = row["noise"]["babble"]
            assert len(babble) == 2 and set(babble) <= split_ids - {row["id"]}  # same split, other utterances
            assert all(source[b].speaker != row["speaker"] for b in babble)
            snrs.append(row["snr_db"])
    assert max(snrs) - min(snrs) > 3  # drawn per utterance
    again = tmp_path / "noisy-again"
    build_shape("noisy", corpus, again, snr_db=(5.0, 15.0), babble_talkers=2, seed=7)
    first = lines(out / "train.jsonl")[0]["audio_filepath"]
    assert (out / first).read_bytes() == (again / first).read_bytes()
    build_shape("noisy", corpus, tmp_path / "other-seed", snr_db=(5.0, 15.0), babble_talkers=2, seed=8)
    assert (out / first).read_bytes() != (tmp_path / "other-seed" / first).read_bytes()


# ------------------------------------------------------------------ every shape


def test_second_run_does_nothing_and_a_bad_line_is_skipped_and_reported(corpus, tmp_path, capsys):
    with open(corpus / "train.jsonl", "a") as f:
        f.write('{"audio_filepath": "audio/a-00.wav", "duration": 0, "text": "x"}\n')
        f.write('{"audio_filepath": "audio/missing.wav", "duration": 1.0, "text": "x"}\n')
        f.write("not json\n")
    out = tmp_path / "rs"
    build_shape("resample", corpus, out, sample_rate=8000)
    printed = capsys.readouterr().out
    assert "train: 24 utterances" in printed and "skipped 3 utterances: 3 bad manifest line" in printed
    stamp = (out / "train.jsonl").stat().st_mtime_ns
    wav = next((out / "wav" / "train").iterdir())
    wav_stamp = wav.stat().st_mtime_ns
    assert build_shape("resample", corpus, out, sample_rate=8000) == {}
    assert "complete (same settings); nothing to do" in capsys.readouterr().out
    assert (out / "train.jsonl").stat().st_mtime_ns == stamp and wav.stat().st_mtime_ns == wav_stamp
    build_shape("resample", corpus, out, sample_rate=11025)  # other settings: rebuilt
    assert "other settings; rebuilding" in capsys.readouterr().out
    assert sf.info(read_manifest(out / "train.jsonl")[0].audio_filepath).samplerate == 11025


def test_shapes_compose_tiny_of_long(corpus, tmp_path, capsys):
    build_shape("long", corpus, tmp_path / "long", min_seconds=4.0, max_seconds=8.0)
    build_shape("tiny", tmp_path / "long", tmp_path / "tiny-long", utterances=3)
    rows = read_manifest(tmp_path / "tiny-long" / "train.jsonl")
    assert len(rows) == 3 and all(4.0 <= u.duration <= 8.0 for u in rows)
    assert capsys.readouterr().out.splitlines()[-1].startswith("tiny shape of ")


def test_a_source_without_manifests_exits_2_naming_the_file(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        main(["tiny", str(tmp_path / "src"), str(tmp_path / "out")])
    assert exit_info.value.code == 2 and "train.jsonl: no such manifest" in capsys.readouterr().err


# ------------------------------------------------------------------ short


def test_cuts_lie_in_the_middle_of_the_gaps_between_words():
    # 6 words at 40 ms frames: gaps between words 1|2 (frames 20-30) and 3|4 (frames 60-80)
    spans = [(0, 10), (10, 20), (30, 40), (40, 60), (80, 90), (90, 100)]
    segments, counts = plan_segments(spans, 0.04, 4.2, min_seconds=1.0, max_seconds=2.0, rng=random.Random(0))
    cuts = [0.0, 0.4, 1.0, 1.6, 2.8, 3.6, 4.2]  # (end + next start) / 2 × 40 ms, then the utterance's end
    for seg in segments:
        assert seg.start == pytest.approx(cuts[seg.first]) and seg.stop == pytest.approx(cuts[seg.end])
        assert 1.0 <= seg.duration <= 2.0
    assert counts["kept"] == len(segments) and segments
    assert all(a.end <= b.first for a, b in zip(segments, segments[1:]))


def test_short_pieces_are_regrouped_or_dropped_and_long_words_dropped():
    class Shortest:  # every segment's target is the minimum
        def uniform(self, lo, hi):
            return lo

    # a 1.2 s segment, then a 0.4 s tail that cannot stand alone: it is merged into the segment before
    segments, counts = plan_segments([(0, 30), (30, 40)], 0.04, 1.6, 1.0, 4.0, Shortest())
    assert [(s.first, s.end, s.stop) for s in segments] == [(0, 2, 1.6)] and counts["regrouped"] == 1
    segments, counts = plan_segments([(0, 25), (25, 35), (35, 45)], 0.04, 1.8, 1.0, 1.2, random.Random(1))
    assert [(s.first, s.end, s.stop) for s in segments] == [(0, 1, pytest.approx(1.0))]
    assert counts["dropped short"] == 1  # words 1-2 (0.8 s): no segment to merge into within 1.2 s
    segments, counts = plan_segments([(0, 10), (10, 150), (150, 180)], 0.04, 7.2, 1.0, 4.0, random.Random(0))
    assert counts["dropped long"] == 1 and all(s.first != 1 for s in segments)
    # one short piece alone: dropped
    assert plan_segments([(0, 5)], 0.04, 0.3, 1.0, 4.0)[1]["dropped short"] == 1


WORDS = "one two three four five six".split()
STARTS = [10 + 48 * k for k in range(len(WORDS))]  # each word's first output frame in the stub emissions


def stub_emissions(tok, frames: int):
    """``(frames, V)`` log-probabilities that spell ``WORDS``: word k's letters on every other frame
    from ``STARTS[k]`` (so word k spans ``[STARTS[k], STARTS[k] + 2 len - 1)``), a ``|`` in the
    middle of each gap, blank elsewhere."""
    import torch

    scores = torch.full((frames, len(tok.vocab)), -10.0)
    scores[:, tok.blank_id] = 0.0
    spelt = [(start + 2 * k, ch) for word, start in zip(WORDS, STARTS) for k, ch in enumerate(word)]
    spelt += [((s0 + 2 * len(w0) + s1) // 2, "|") for w0, s0, s1 in zip(WORDS, STARTS, STARTS[1:])]  # mid-gap
    for frame, unit in spelt:
        if frame < frames:
            scores[frame, tok.blank_id] = -10.0
            scores[frame, tok.vocab.index(unit)] = 0.0
    return scores.log_softmax(-1)


def expected_spans():
    return [(s, s + 2 * len(w) - 1) for w, s in zip(WORDS, STARTS)]


def char_corpus(root: Path, text: str = " ".join(WORDS)) -> Path:
    """Three 6 s utterances saying ``text`` per split, plus a 0.2 s one with a long transcript
    (too few frames) and one with a letter no checkpoint unit spells."""
    for split in ("train", "dev", "test"):
        rows = []
        for i in range(3):
            path = root / "audio" / f"{split}{i}.wav"
            write_wav(path, utterance_audio(i, 6.0), RATE, subtype="PCM_16")
            rows.append({"id": f"{split}{i}", "audio_filepath": str(path), "duration": 6.0, "text": text,
                         "speaker": "s", "phonemes": " | ".join(f"p{w}" for w in text.split())})
        write_wav(root / "audio" / f"{split}-short.wav", utterance_audio(9, 0.2), RATE, subtype="PCM_16")
        rows.append({"id": f"{split}-short", "audio_filepath": str(root / "audio" / f"{split}-short.wav"),
                     "duration": 0.2, "text": "far too many words for so little audio", "speaker": "s"})
        rows.append({**rows[0], "id": f"{split}-accent", "text": "café au lait"})
        rows[-1].pop("phonemes")
        write_manifest(root / f"{split}.jsonl", rows)
    return root


@pytest.fixture
def char_checkpoint(tmp_path) -> Path:
    """A tiny untrained character-unit checkpoint (``recogniser_fixtures``: subsampling 2)."""
    from recogniser_fixtures import recogniser, save_checkpoint

    from fastasr.data.tokenizer import Tokenizer

    tok = Tokenizer.build([" ".join(WORDS), "far too many words for so little audio"], "char")
    save_checkpoint(recogniser(tok), tmp_path / "char.ckpt")
    return tmp_path / "char.ckpt"


def test_align_words_finds_the_words_of_stub_emissions():
    from fastasr.corpora.shapes.short import align_words
    from fastasr.data.manifest import Utterance
    from fastasr.data.tokenizer import Tokenizer

    tok = Tokenizer.build([" ".join(WORDS)], "char")
    utt = Utterance("u", "u.wav", 6.0, " ".join(WORDS))
    assert align_words(stub_emissions(tok, 300), tok, utt) == expected_spans()
    with pytest.raises(ValueError, match="too few frames: 20 output frames for 28 CTC units"):
        align_words(stub_emissions(tok, 20), tok, utt)
    with pytest.raises(ValueError, match="transcript not encodable"):
        align_words(stub_emissions(tok, 300), tok, Utterance("v", "v.wav", 6.0, "où"))


def test_short_shape_cuts_mid_gap_with_the_checkpoint_frame_period(tmp_path, char_checkpoint, capsys, monkeypatch):
    from fastasr.decoding import long_form
    from fastasr.recognition.loading import load_recogniser

    tok = load_recogniser(char_checkpoint).tokenizer
    frames_seen = []

    def emissions(model, features, config=None, *, frame_shift_ms=10.0, **kw):
        assert frame_shift_ms == 10.0 and len(features) == 1
        frames_seen.append(features[0].shape[0])
        return [stub_emissions(tok, -(-features[0].shape[0] // 2))]  # the checkpoint subsamples 2x

    monkeypatch.setattr(long_form, "long_form_log_probs", emissions)
    src, out = char_corpus(tmp_path / "src"), tmp_path / "short"
    assert main(["short", str(src), str(out), "--align-ckpt", str(char_checkpoint)]) == 0
    printed = capsys.readouterr().out
    assert "skipped 2 utterances" in printed and "transcript not encodable" in printed and "too few frames" in printed
    assert frames_seen[0] == 598  # 6 s of 25 ms / 10 ms frames
    spans = expected_spans()
    step = 0.02  # output frame: subsampling 2 x 10 ms
    cuts = [0.0] + [(a[1] + b[0]) / 2 * step for a, b in zip(spans, spans[1:])] + [6.0]
    for split in ("train", "dev", "test"):
        rows = lines(out / f"{split}.jsonl")
        assert {r["source"]["id"] for r in rows} == {f"{split}{i}" for i in range(3)}
        for row in rows:
            first = min(range(len(cuts)), key=lambda k: abs(cuts[k] - row["source"]["start"]))
            end = min(range(len(cuts)), key=lambda k: abs(cuts[k] - row["source"]["end"]))
            assert row["source"]["start"] == pytest.approx(cuts[first], abs=1e-3)
            assert row["source"]["end"] == pytest.approx(cuts[end], abs=1e-3)
            assert row["text"] == " ".join(WORDS[first:end]) and row["speaker"] == "s"
            assert row["phonemes"] == " | ".join(f"p{w}" for w in WORDS[first:end])
            assert 1.0 <= row["duration"] <= 4.0 + 1e-3
            assert sf.info(str(out / row["audio_filepath"])).duration == pytest.approx(row["duration"], abs=1e-3)
    assert main(["short", str(src), str(out), "--align-ckpt", str(char_checkpoint)]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_word_spans_on_a_tiny_checkpoint_s_own_emissions(tmp_path, char_checkpoint):
    from fastasr.corpora.shapes.short import word_spans
    from fastasr.recognition.loading import load_recogniser

    rec = load_recogniser(char_checkpoint)
    utts = read_manifest(char_corpus(tmp_path / "src") / "train.jsonl")
    spans = word_spans(rec, utts[0], seed=0)
    assert len(spans) == len(WORDS) and spans == word_spans(rec, utts[0], seed=0)
    assert all(a < b <= c for (a, b), (c, _) in zip(spans, spans[1:])) and spans[-1][1] <= 300
    with pytest.raises(ValueError, match="too few frames"):
        word_spans(rec, utts[3])
    with pytest.raises(ValueError, match="transcript not encodable"):
        word_spans(rec, utts[4])


def test_an_option_of_another_shape_is_an_error_naming_it(corpus, tmp_path):
    with pytest.raises(ValueError, match=r"option\(s\) \['count'\] for the tiny shape"):
        build_shape("tiny", corpus, tmp_path / "out", count=3)
    with pytest.raises(ValueError, match=r"the short shape needs option\(s\) \['align_ckpt'\]"):
        build_shape("short", corpus, tmp_path / "out")
