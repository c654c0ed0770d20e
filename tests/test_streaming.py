"""Streaming recognition (fastasr.recognition.streaming): audio in pieces → the simulated chunked
decoding's words, greedy and beam + LM, for full and clustered attention."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from recogniser_fixtures import tiny_recogniser

from fastasr.data.features import Fbank, FeatureConfig
from fastasr.data.manifest import read_manifest
from fastasr.recognition.streaming import chunk_context


@pytest.fixture(scope="module")
def waveform(tiny_corpus) -> np.ndarray:
    """Three test utterances joined (about 6-9 s)."""
    pieces = []
    for u in read_manifest(tiny_corpus / "test.jsonl")[:3]:
        path = Path(u.audio_filepath)
        audio, rate = sf.read(str(path if path.is_absolute() else tiny_corpus / path), dtype="float32")
        assert rate == 16000
        pieces += [audio, np.zeros(4000, np.float32)]
    return np.concatenate(pieces)


@pytest.mark.parametrize("snip_edges, rate", [(True, 16000), (False, 16000), (False, 8000)])
@pytest.mark.parametrize("piece", [997, 37, 160])
def test_fbank_stream_gives_the_whole_recordings_frames(snip_edges, rate, piece):
    """In pieces of any size, edges snipped or mirrored (sherpa-onnx's frames: the first samples
    mirrored before them, the last ones at ``finish``), the stream gives the whole recording's
    frames; a recording shorter than a window gives its padded window's frames at ``finish``."""
    wave = torch.randn(rate * 2 + 123) * 0.1
    fbank = Fbank(FeatureConfig(num_mel_bins=40, sample_rate=rate, snip_edges=snip_edges,
                                high_freq=0.0 if snip_edges else -400.0))
    stream = fbank.stream()
    pieces = [stream.accept(wave[i:i + piece]) for i in range(0, wave.shape[0], piece)] + [stream.finish()]
    whole = fbank(wave)
    assert whole.shape[0] == fbank.num_frames(wave.shape[0]) == (
        1 + (wave.shape[0] - fbank.config.window_samples) // fbank.config.shift_samples if snip_edges
        else round(wave.shape[0] / fbank.config.shift_samples))
    torch.testing.assert_close(torch.cat(pieces), whole, atol=1e-4, rtol=1e-5)
    short = fbank.stream()
    assert short.accept(wave[:100]).shape == (0, 40)
    torch.testing.assert_close(short.finish(), fbank(wave[:100]))
    assert short.finish().shape == (0, 40)


def simulated(rec, wave, decoding, chunk, left):
    """The simulated chunked decoding: the whole recording through forward(chunk), then decoded."""
    rec.set_chunked_decoding(chunk, left)
    try:
        return rec.transcribe(torch.from_numpy(wave), sample_rate=16000, decoding=decoding,
                              long_form={"mode": "one_pass"}, seed=0)[0]
    finally:
        rec.set_chunked_decoding(None)


@pytest.mark.parametrize("attention", ["full", {"name": "clustered", "clusters": 4, "seed": 2},
                                       {"name": "i-clustered", "clusters": 4, "topk": 3, "seed": 2}],
                         ids=["full", "clustered", "i-clustered"])
@pytest.mark.parametrize("decoding", ["greedy", "beam_lm"])
@pytest.mark.parametrize("features", [
    None, FeatureConfig(num_mel_bins=40, snip_edges=False, high_freq=-400.0, sample_scale=1.0)],
    ids=["kaldi", "sherpa-onnx"])
def test_streamed_words_equal_the_simulated_chunked_decoding(tiny_corpus, waveform, attention, decoding, features):
    rec = tiny_recogniser(tiny_corpus, attention=attention, positions="absolute", utterance_cmvn=True, seed=1,
                          features=features)
    expected = simulated(rec, waveform, decoding, 0.32, 0.64)
    stream = rec.stream(chunk=0.32, left=0.64, decoding=decoding)
    partials = [p for i in range(0, waveform.shape[0], 1234) if (p := stream.accept(waveform[i:i + 1234]))]
    final = stream.finish()
    assert final.text == expected.text and final.units == expected.units
    assert [w.start for w in final.words] == [w.start for w in expected.words]
    assert final.text.strip(), "the untrained model should still say something for the comparison to mean anything"
    # a partial after (nearly) every chunk: the audio heard and the chunks encoded growing
    chunks = waveform.shape[0] / 16000 / 0.32
    assert chunks - 2 <= len(partials) <= chunks
    assert all(a.seconds < b.seconds and a.chunks < b.chunks for a, b in zip(partials, partials[1:]))
    assert partials[0].compute_seconds > 0


def test_full_context_decoding_differs_from_chunked(tiny_corpus, waveform):
    """The chunked decoding is not full context in disguise (this untrained model's path changes)."""
    rec = tiny_recogniser(tiny_corpus, positions="absolute", utterance_cmvn=True, seed=1)
    chunked = simulated(rec, waveform, "greedy", 0.32, 0.64)
    full = rec.transcribe(torch.from_numpy(waveform), sample_rate=16000, long_form={"mode": "one_pass"})[0]
    assert chunked.units != full.units


def test_chunk_context_in_seconds(tiny_corpus):
    rec = tiny_recogniser(tiny_corpus)  # 4 x 10 ms a frame
    assert chunk_context(rec, 0.64, None).size == 16 and chunk_context(rec, 0.64, None).left_chunks is None
    assert chunk_context(rec, 0.3, 1.0).size == 8 and chunk_context(rec, 0.3, 1.0).left_chunks == 4  # 25 frames
    assert chunk_context(rec, 0.01, 0).size == 1
    # trained without chunks (or with every earlier frame): 10 s, 250 frames, rounded up to 16 chunks
    assert chunk_context(rec, 0.64, "auto").left_chunks == 16
    assert chunk_context(rec, 0.64, "all").left_chunks is None  # every earlier frame, asked for
    trained = tiny_recogniser(tiny_corpus, streaming={"chunk_sizes": [8], "full_context": 0.5, "left_frames": 32})
    assert chunk_context(trained, 0.64, "auto").left_chunks == 2
    unbounded = tiny_recogniser(tiny_corpus, streaming={"chunk_sizes": [8], "left_frames": None})
    assert chunk_context(unbounded, 0.64, "auto").left_frames == 256
    for bad, key in ((0, "chunk="), ("x", "chunk="), (float("nan"), "chunk=")):
        with pytest.raises(ValueError, match=key):
            chunk_context(rec, bad, None)
    with pytest.raises(ValueError, match="left="):
        chunk_context(rec, 0.64, -1)


def test_the_command_streams_and_prints_partials(tiny_corpus, tmp_path, capsys):
    """``fastasr-transcribe ... stream=true chunk=0.32``: partial lines on stderr, the final
    words on stdout equal to the chunked decoding's, a missing file reported, the context in the report."""
    import io

    from hydra import compose, initialize_config_dir
    from recogniser_fixtures import save_checkpoint

    from fastasr.config import CONFIG_DIR
    from fastasr.recognition.transcription_job import run_transcription

    rec = tiny_recogniser(tiny_corpus, positions="absolute", seed=1)
    save_checkpoint(rec, tmp_path / "m.ckpt", seed=1)
    path = Path(read_manifest(tiny_corpus / "test.jsonl")[0].audio_filepath)
    path = path if path.is_absolute() else tiny_corpus / path
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("transcribe", overrides=["device=cpu", f"ckpt_path={tmp_path / 'm.ckpt'}", "stream=true",
                                               "chunk=0.32", "left=null", "decoding=greedy",
                                               f"audio=[{path},{tmp_path / 'missing.wav'}]"])
    stdout = io.StringIO()
    report = run_transcription(cfg, stdout=stdout, run_dir=tmp_path / "run")
    partial_lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"{path.stem} [")]
    assert len(partial_lines) >= 3
    from fastasr.recognition.loading import load_recogniser

    again = load_recogniser(tmp_path / "m.ckpt")
    expected = simulated(again, sf.read(str(path), dtype="float32")[0], "greedy", 0.32, None)
    assert stdout.getvalue() == f"{path}\t{expected.text}\n"
    assert report["transcribed"] == 1 and report["failed"][0]["path"].endswith("missing.wav")
    assert report["stream"] == {"chunk": "chunks of 0.32 s (8 frames), left context every earlier frame"}


def _chunks(total: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    bounds = [0]
    while bounds[-1] < total:
        bounds.append(min(total, bounds[-1] + int(rng.integers(1, 12))))
    return list(zip(bounds, bounds[1:]))


@pytest.mark.parametrize("kind", ["phoneme", "char"])
def test_greedy_partials_are_appended_chunk_by_chunk(tiny_corpus, monkeypatch, kind):
    """After every chunk the greedy stream's hypothesis is the decoder's over everything so far
    (units, frames, words through the lexicon), built by appending: the whole path is never
    decoded again, and each partial's units extend the previous one's."""
    from fastasr.decoding.greedy import GreedyDecoder

    rec = tiny_recogniser(tiny_corpus, kind=kind)
    decoder = rec.decoder("greedy")
    rng = np.random.default_rng(0)
    V = rec.vocab_size
    best = torch.from_numpy(rng.choice(V, 600, p=[0.5] + [0.5 / (V - 1)] * (V - 1)))
    best[100:140] = rec.tokenizer.vocab.index("|")  # a run of boundaries
    log_probs = torch.nn.functional.one_hot(best, V).float().log_softmax(-1)
    expected = [decoder(log_probs[:end]) for _, end in _chunks(600, np.random.default_rng(1))]
    monkeypatch.setattr(GreedyDecoder, "decode_path", lambda *a: pytest.fail("the whole path decoded again"))
    stream, previous = decoder.stream(), []
    for (start, end), want in zip(_chunks(600, np.random.default_rng(1)), expected):
        stream.accept(log_probs[start:end])
        got = stream.partial()
        assert (got.units, got.frames, got.words) == (want.units, want.frames, want.words)
        assert got.units[:len(previous)] == previous or previous[-1:] == ["|"]
        previous = got.units
    assert len(stream.finish().words) > 3


def _spoken(rec, words: int, rng: np.random.Generator) -> torch.Tensor:
    """Peaked ``(T, V)`` log-probabilities of random lexicon words, each unit two frames and a blank."""
    vocab = rec.tokenizer.vocab
    lexicon = sorted(rec.lexicon.entries)
    path = []
    for word in rng.choice(lexicon, words):
        units = list(rec.lexicon.entries[word].most_common(1)[0][0]) + ["|"]
        for unit in units:
            path += [vocab.index(unit)] * 2 + [0]
    log_probs = torch.full((len(path), len(vocab)), -8.0) + torch.from_numpy(rng.random((len(path), len(vocab)))).float()
    log_probs[torch.arange(len(path)), torch.tensor(path)] = -0.05
    return log_probs.log_softmax(-1)


def test_the_beam_search_stream_settles_its_prefix_and_stays_bounded(tiny_corpus):
    """A long beam + LM stream commits the prefix every live hypothesis shares: the search's
    buffer stays short however long the stream, and the words equal one search over the whole."""
    rec = tiny_recogniser(tiny_corpus)
    decoder = rec.decoder({"name": "beam", "beam_size": 20, "lm": {"source": "auto"}})
    log_probs = _spoken(rec, 150, np.random.default_rng(0))
    whole = decoder(log_probs)
    stream, held = decoder.stream(), []
    for start, end in _chunks(log_probs.shape[0], np.random.default_rng(2)):
        stream.accept(log_probs[start:end])
        held.append(stream.buffered)
    final = stream.finish()
    assert log_probs.shape[0] > 2000 and max(held) < 150 and stream.settled > log_probs.shape[0] - 150
    assert final.words == whole.words and final.units == whole.units and final.frames == whole.frames
    assert final.score == pytest.approx(whole.score, rel=1e-6, abs=1e-3)
    assert len(final.words) == 150
