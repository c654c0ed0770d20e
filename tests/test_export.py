"""Export → onnxruntime → the same words: a recogniser exported to ONNX (fastasr.deploy.export) gives
PyTorch's log-probabilities, and the PyTorch-free runtime (fastasr.onnx) the transcription command's
greedy words; sherpa-onnx decodes the exported folder to the same units."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

onnxruntime = pytest.importorskip("onnxruntime", reason="the deploy extra (pip install -e .[deploy]; make install has it)")
pytest.importorskip("kaldi_native_fbank", reason="the deploy extra (pip install -e .[deploy]; make install has it)")

from recogniser_fixtures import tiny_recogniser  # noqa: E402

from fastasr.data.features import Fbank, FeatureConfig  # noqa: E402
from fastasr.data.manifest import read_manifest  # noqa: E402
from fastasr.data.tokenizer import Tokenizer  # noqa: E402
from fastasr.decoding.beam import BeamSearchOptions  # noqa: E402
from fastasr.decoding.windows import LongFormConfig  # noqa: E402
from fastasr.deploy.export import (  # noqa: E402
    LOG_FLOOR,
    SAMPLE_SCALE_LOG,
    SHERPA_BLANK,
    SHERPA_WORD_START,
    SWAP_NOTE,
    export_recogniser,
    full_context_note,
    tokens_txt,
)
from fastasr.onnx.filterbank import log_mel  # noqa: E402
from fastasr.onnx.onnx_recogniser import (  # noqa: E402
    OnnxRecogniser,
    fbank,
    filterbank_options,
    sherpa_onnx_options,
)
from fastasr.recognition.recogniser import RECOGNISER_KEY  # noqa: E402


@pytest.fixture(scope="module")
def recordings(tiny_corpus, tmp_path_factory) -> list[Path]:
    """The tiny corpus's test utterances and a 26-second recording of them joined with pauses (the
    transcription command reads it in windows)."""
    paths = [tiny_corpus / u.audio_filepath if not Path(u.audio_filepath).is_absolute() else Path(u.audio_filepath)
             for u in read_manifest(tiny_corpus / "test.jsonl")]
    pieces, rate = [], 16000
    for p in paths + [tiny_corpus / u.audio_filepath for u in read_manifest(tiny_corpus / "dev.jsonl")] * 3:
        audio, rate = sf.read(str(p), dtype="float32")
        pieces += [audio, np.zeros(rate // 2, np.float32)]
    long = tmp_path_factory.mktemp("long") / "joined.wav"
    joined = np.concatenate(pieces)
    while joined.shape[0] < 26 * rate:
        joined = np.concatenate([joined, joined])
    sf.write(str(long), joined[:26 * rate], rate)
    return [*paths, long]


@pytest.mark.parametrize("attention, model", [
    ("full", {"positions": "absolute", "utterance_cmvn": True}),
    ("full", {"positions": "rotary"}),
    ("clustered-4", {"positions": "none"}),
    ("i-clustered-4", {"positions": "absolute"}),
    ("lsh-1", {"positions": "absolute", "shared_qk": True}),
    ("topk-8", {"positions": "absolute"}),
])
def test_the_graph_gives_pytorchs_log_probabilities_at_any_length(tiny_corpus, tmp_path, attention, model):
    """Every attention exports: full as it is, the fast ones swapped to full (the reason printed);
    onnxruntime's log-probabilities equal PyTorch's (with full attention) on another batch size and
    a length six times the traced one (dynamic axes, positions computed in the graph)."""
    recogniser = tiny_recogniser(tiny_corpus, attention=attention, **model)
    result = export_recogniser(recogniser, tmp_path / "out", int8=False)
    assert result.attention == "full" and result.max_abs_diff < 1e-4
    assert (result.swapped is None) == (attention == "full")
    if result.swapped:
        assert result.swapped.startswith(f"attention {attention}: ") and SWAP_NOTE in result.swapped
    state = json.loads((tmp_path / "out" / "recogniser.json").read_text())
    assert state["export"]["trained_attention"] == attention and state["export"]["attention"] == "full"
    assert state["export"]["subsampling"] == 4 and state["lexicon"]["entries"]
    assert (tmp_path / "out" / "lm.arpa").read_text().startswith("\\data\\") and state["lm"]["path"] == "lm.arpa"


def test_the_runtime_gives_the_transcription_commands_greedy_words(tiny_corpus, tmp_path, recordings):
    """Short utterances and a 26-second recording (read in windows by both): the same units,
    words and reading mode as Recogniser.transcribe with greedy decoding, word times within two
    output frames of its forced alignment; the int8 model runs and keeps the length."""
    recogniser = tiny_recogniser(tiny_corpus, kind="phoneme")
    export_recogniser(recogniser, tmp_path / "out")
    expected = recogniser.transcribe([str(p) for p in recordings], decoding="greedy")
    runtime = OnnxRecogniser.load(tmp_path / "out")
    got = list(runtime.transcribe(recordings))
    assert [t.mode for t in expected] == ["windowed"] * len(recordings) == [t.mode for t in got]
    assert recordings[-1].stat().st_size > 26 * 16000 * 2  # the long one: several windows of 10 s
    for e, g in zip(expected, got):
        assert g.units == e.units and g.text == e.text and g.real_words == e.real_words, e.id
        assert len(g.words) == len(e.words) and g.duration == e.duration
        step = runtime.frame_seconds
        assert all(abs(a.start - b.start) <= 2 * step + 1e-6 and abs(a.end - b.end) <= 2 * step + 1e-6
                   for a, b in zip(g.words, e.words)), (g.words, e.words)
    assert sum(len(t.units) for t in got) > 20  # an arbitrary model still says something
    int8 = list(OnnxRecogniser.load(tmp_path / "out", int8=True).transcribe(recordings[-1:]))[0]
    assert int8.ok and int8.duration == got[-1].duration
    one_pass = runtime.transcribe_waveform(sf.read(str(recordings[0]), dtype="float32")[0],
                                           long_form=LongFormConfig(mode="one_pass"))
    assert one_pass.mode == "one_pass" and one_pass.units == got[0].units  # a short one fits one window


@pytest.mark.parametrize("kind", ["phoneme", "char"])
def test_the_runtimes_beam_search_gives_the_transcription_commands_words(tiny_corpus, tmp_path, recordings, kind):
    """decoding=beam_lm and beam in the PyTorch-free runtime: the words of Recogniser.transcribe's
    beam search with the recogniser's lexicon and LM (the same decoder on the same log-probabilities,
    within onnxruntime's rounding), real words; word times inside the recording and in order."""
    recogniser = tiny_recogniser(tiny_corpus, kind=kind)
    export_recogniser(recogniser, tmp_path / "out", int8=False, check=False)
    runtime = OnnxRecogniser.load(tmp_path / "out")
    options = BeamSearchOptions(beam_size=20)
    for decoding, lm in (("beam_lm", True), ("beam", False)):
        spec = {**recogniser.decoding_spec(decoding), "beam_size": 20}
        expected = recogniser.transcribe([str(p) for p in recordings[:-1]], decoding=spec)
        got = list(runtime.transcribe(recordings[:-1], decoder=runtime.beam_decoder(lm=lm, options=options)))
        assert [g.text for g in got] == [e.text for e in expected], decoding
        assert [g.units for g in got] == [e.units for e in expected] and all(g.real_words for g in got)
        assert sum(len(g.words) for g in got) > 3  # the LM and lexicon still find words in an untrained model
        for g in got:
            assert all(0 <= w.start <= w.end <= g.duration for w in g.words)
            assert all(a.start <= b.start for a, b in zip(g.words, g.words[1:]))
    with pytest.raises(ValueError, match="no word LM"):
        OnnxRecogniser(tmp_path, None, recogniser.tokenizer, {}, 4, 0.04, recogniser.lexicon).beam_decoder(lm=True)
    with pytest.raises(ValueError, match="no lexicon"):
        OnnxRecogniser(tmp_path, None, recogniser.tokenizer, {}, 4, 0.04, None).beam_decoder(lm=False)


def test_word_times_span_each_words_argmax_runs(tiny_corpus):
    """Greedy decoding of crafted log-probabilities: units from the argmax path (repeats merged,
    blanks dropped, leading and doubled boundaries tidied), a word from its first unit's run to its
    last unit's run end."""
    tok = Tokenizer("char", ["<blank>", "a", "b", "|"])
    runtime = OnnxRecogniser(Path("."), None, tok, {"sample_rate": 16000}, 4, 0.04)
    path = [3, 1, 1, 0, 2, 3, 3, 0, 0, 2, 2, 2, 0]  # | a a _ b | | _ _ b b b _
    log_probs = np.log(np.full((len(path), 4), 0.01))
    log_probs[np.arange(len(path)), path] = 0.0
    units, words, timed, real = runtime.decode(log_probs, seconds=len(path) * 0.04)
    assert units == ["a", "b", "|", "b"] and words == ["ab", "b"] and real
    assert [(w.word, w.start, w.end) for w in timed] == [("ab", 0.04, 0.2), ("b", 0.36, 0.48)]


@pytest.mark.parametrize("rate, seconds", [(16000, 1.7), (8000, 0.9), (16000, 0.01), (16000, 0.0251)])
def test_the_runtimes_filterbank_is_trainings(rate, seconds):
    """The runtime's numpy filterbank against training's torchaudio filterbank
    (fastasr.data.features.Fbank) on random audio: the same frames within 1e-4 in log-mel (a clip
    shorter than one window padded to one, as training pads it)."""
    waveform = (np.random.default_rng(rate).standard_normal(int(rate * seconds)) * 0.1).astype(np.float32)
    config = FeatureConfig(sample_rate=rate, num_mel_bins=40)
    expected = Fbank(config)(torch.from_numpy(waveform)).numpy()
    got = fbank(waveform, {"sample_rate": rate, "num_mel_bins": 40, "frame_length_ms": 25.0, "frame_shift_ms": 10.0})
    assert got.shape == expected.shape and np.abs(got - expected).max() < 1e-4


def test_the_runtimes_filterbank_is_trainings_on_speech(tiny_corpus):
    """On the tiny corpus's recordings (speech and silences, 40 and 80 bins): within 1e-4 of
    training's filterbank computed in float64 (torchaudio's on double samples), and as close to
    training's float32 one as that is (within 1e-4 more: float32 rounding puts training's up to
    1.4e-4 from its float64 value in low-energy bins of 40, 9e-4 of 80)."""
    import torchaudio.compliance.kaldi as kaldi

    for u in read_manifest(tiny_corpus / "test.jsonl"):
        waveform = sf.read(str(u.audio_filepath), dtype="float32")[0]
        for bins in (40, 80):
            training = Fbank(FeatureConfig(num_mel_bins=bins))(torch.from_numpy(waveform)).numpy()
            exact = kaldi.fbank(torch.from_numpy(waveform).double()[None] * 32768, num_mel_bins=bins, dither=0.0,
                                energy_floor=0.0).numpy()
            got = fbank(waveform, {"sample_rate": 16000, "num_mel_bins": bins, "frame_length_ms": 25.0,
                                   "frame_shift_ms": 10.0})
            assert got.shape == training.shape == exact.shape
            assert np.abs(got - exact).max() < 1e-4, u.id
            assert np.abs(got - training).max() < np.abs(training - exact).max() + 1e-4, u.id


@pytest.mark.parametrize("snip_edges, high_freq", [(False, -400.0), (True, 0.0), (False, 7000.0)])
def test_the_numpy_filterbank_is_kaldis_in_every_setting(snip_edges, high_freq):
    """fastasr.onnx.filterbank against torchaudio's Kaldi filterbank and kaldi-native-fbank
    (sherpa-onnx's) with sherpa-onnx's settings and others: the same frames (a clip shorter than a
    window, edges mirrored) within 1e-4."""
    import kaldi_native_fbank as knf
    import torchaudio.compliance.kaldi as kaldi

    from fastasr.onnx.filterbank import FilterbankOptions, log_mel

    rng = np.random.default_rng(3)
    for samples in (27211, 410, 150):
        waveform = (rng.standard_normal(samples) * 0.05).astype(np.float32)
        options = FilterbankOptions(num_mel_bins=40, snip_edges=snip_edges, high_freq=high_freq)
        got = log_mel(waveform, options)
        opts = knf.FbankOptions()
        opts.frame_opts.dither, opts.frame_opts.snip_edges = 0.0, snip_edges
        opts.mel_opts.num_bins, opts.mel_opts.high_freq = 40, high_freq
        computer = knf.OnlineFbank(opts)
        computer.accept_waveform(16000.0, waveform)
        computer.input_finished()
        ours = np.array([computer.get_frame(i) for i in range(computer.num_frames_ready)]).reshape(-1, 40)
        assert got.shape == ours.shape and (got.shape[0] > 0) == (samples >= 400 or not snip_edges)
        assert not got.size or np.abs(got - ours).max() < 1e-4
        if samples >= 400:
            torch_frames = kaldi.fbank(torch.from_numpy(waveform)[None], num_mel_bins=40, dither=0.0, energy_floor=0.0,
                                       snip_edges=snip_edges, high_freq=high_freq).numpy()
            assert got.shape == torch_frames.shape and np.abs(got - torch_frames).max() < 1e-4


@pytest.mark.parametrize("rate", [8000, 44100])
def test_the_runtime_resamples_as_training_does(tmp_path, rate):
    """A file at another rate: the runtime's resampling is training's (torchaudio's) within float
    rounding, and so are the filterbanks of the resampled audio."""
    from fastasr.data.audio import load_audio
    from fastasr.onnx.onnx_recogniser import read_audio

    t = np.arange(int(rate * 1.5)) / rate
    audio = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * np.random.default_rng(0).standard_normal(t.shape))
    path = tmp_path / f"a{rate}.wav"
    sf.write(str(path), audio.astype(np.float32), rate)
    config = {"sample_rate": 16000, "num_mel_bins": 40, "frame_length_ms": 25.0, "frame_shift_ms": 10.0}
    resampled, expected = read_audio(path, 16000), load_audio(path, 16000).numpy()
    assert resampled.shape == expected.shape and np.abs(resampled - expected).max() < 1e-5
    ours = fbank(resampled, config)
    training = Fbank(FeatureConfig(num_mel_bins=40))(torch.from_numpy(expected)).numpy()
    assert ours.shape == training.shape and np.abs(ours - training).max() < 1e-2


def test_the_swap_prints_what_the_matrix_measured(tmp_path):
    """The lines come from the costs the package ships (``swap_costs.json``, no docs read) or
    those passed in, :func:`matrix_swap_costs` of a results folder."""
    from fastasr.deploy.export import matrix_swap_costs, swap_costs

    (tmp_path / "matrix-a").mkdir()
    (tmp_path / "matrix-a" / "matrix.csv").write_text(
        "train,eval,status,per,cer,wer\ni-clustered-100,i-clustered-100,ok,25.0,,80\ni-clustered-100,full,ok,26.5,,81\n"
        "clustered-100,full,failed,,,\n")
    (tmp_path / "matrix-b").mkdir()
    (tmp_path / "matrix-b" / "matrix.csv").write_text("train,eval,status,per,cer,wer\nfull,full,ok,20,,70\n")
    costs = matrix_swap_costs(tmp_path)
    assert swap_costs("i-clustered-100", costs) == [
        "matrix-a: PER 25.00 with i-clustered-100, 26.50 with full (+1.50 points)"]
    assert swap_costs("clustered-100", costs) == []  # no usable cell: nothing claimed
    assert any(line.startswith("matrix-long: PER") for line in swap_costs("i-clustered-100"))  # the shipped ones


def test_the_shipped_swap_costs_are_the_committed_matrices():
    """``fastasr/deploy/swap_costs.json`` is what ``docs/results/*/matrix.csv`` hold: a matrix
    result committed without regenerating it fails here."""
    from fastasr.config import PROJECT_ROOT
    from fastasr.deploy.export import SWAP_COSTS_FILE, matrix_swap_costs

    assert json.loads(SWAP_COSTS_FILE.read_text()) == matrix_swap_costs(PROJECT_ROOT / "docs" / "results"), (
        "regenerate: python -c \"from fastasr.deploy.export import write_swap_costs; write_swap_costs('docs/results')\"")


def test_the_runtime_loads_no_torch():
    """Importing the runtime loads none of the training stack, nor the beam search's flashlight-text
    (imported for decoding=beam alone); ``make test-runtime`` runs it where none is installed."""
    code = ("import sys, fastasr.onnx.transcribe, fastasr.onnx.onnx_recogniser, fastasr.onnx.sherpa; "
            "sys.exit(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch', 'torchaudio', 'lightning', 'omegaconf', 'hydra', 'flashlight'}) or None)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


@pytest.mark.parametrize("kind, model", [
    ("phoneme", {"utterance_cmvn": False}),
    ("phoneme", {"utterance_cmvn": True}),
    ("char", {"utterance_cmvn": True, "positions": "rotary"}),
])
def test_sherpa_onnxs_public_api_gives_the_runtimes_words(tiny_corpus, tmp_path, recordings, kind, model):
    """sherpa-onnx as its users run icefall's CTC models: ``OfflineRecognizer.from_zipformer_ctc``
    with only the rate and the feature dimension, its default filterbank (samples in [-1, 1],
    edges not snipped, the top 400 Hz below the Nyquist frequency), no fastasr code. It says the
    runtime's greedy units (a phoneme model's phonemes, a char model's words) with the runtime
    computing that filterbank (``filterbank="sherpa-onnx"``), none of them empty, on every
    utterance, with global and per-utterance CMVN. (The int8 model is left out: sherpa-onnx runs
    its own onnxruntime, whose integer kernels round an untrained model's near ties otherwise.)"""
    sherpa_onnx = pytest.importorskip("sherpa_onnx", reason="sherpa-onnx has no wheel for this platform")

    recogniser = tiny_recogniser(tiny_corpus, kind=kind, **model)
    export_recogniser(recogniser, tmp_path / "out", int8=False, check=False)
    tokens = (tmp_path / "out" / "tokens.txt").read_text().splitlines()
    assert tokens[0] == f"{SHERPA_BLANK} 0" and len(tokens) == len(recogniser.tokenizer.vocab)
    assert tokens_txt(recogniser).count(SHERPA_WORD_START) == (1 if kind == "char" else len(tokens) - 1)
    decoder = sherpa_onnx.OfflineRecognizer.from_zipformer_ctc(
        model=str(tmp_path / "out" / "model.onnx"), tokens=str(tmp_path / "out" / "tokens.txt"), sample_rate=16000,
        feature_dim=recogniser.feat_in)
    runtime = OnnxRecogniser.load(tmp_path / "out", filterbank="sherpa-onnx")
    paths = recordings[:-1] + [tiny_corpus / u.audio_filepath for u in read_manifest(tiny_corpus / "dev.jsonl")]
    for path in paths:  # sherpa-onnx reads a recording in one pass
        audio, rate = sf.read(str(path), dtype="float32")
        stream = decoder.create_stream()
        stream.accept_waveform(rate, audio)
        decoder.decode_stream(stream)
        ours = runtime.transcribe_waveform(audio, long_form=LongFormConfig(mode="one_pass"))
        shown = ours.units if kind == "phoneme" else ours.text.split()
        assert shown and stream.result.text.split() == shown, path.name


@pytest.mark.parametrize("kind, model", [("char", {"utterance_cmvn": True}), ("phoneme", {"utterance_cmvn": False})])
def test_trained_on_sherpa_onnxs_filterbank_sherpa_onnx_gives_the_runtimes_words(tiny_corpus, tmp_path, recordings,
                                                                                kind, model):
    """A model whose features are sherpa-onnx's default filterbank (``snip_edges`` false,
    ``high_freq`` -400, ``sample_scale`` 1) exports without dropping a frame, says no difference, and sherpa-onnx's public
    ``from_zipformer_ctc`` with only the rate and feature dimension gives the words of fastasr's
    runtime as it runs by default (training's filterbank, computed by fastasr), none empty. A model
    on Kaldi's defaults records both differences."""
    sherpa_onnx = pytest.importorskip("sherpa_onnx", reason="sherpa-onnx has no wheel for this platform")
    features = FeatureConfig(num_mel_bins=40, snip_edges=False, high_freq=-400.0, sample_scale=1.0)
    recogniser = tiny_recogniser(tiny_corpus, kind=kind, features=features, **model)
    export_recogniser(recogniser, tmp_path / "out", int8=False, check=False)
    info = json.loads((tmp_path / "out" / "recogniser.json").read_text())
    assert info["export"]["dropped_frames"] == 0 and info["export"]["sherpa_onnx_differences"] == []
    assert info["features"]["snip_edges"] is False and info["features"]["high_freq"] == -400.0
    assert info["features"]["sample_scale"] == 1.0
    runtime = OnnxRecogniser.load(tmp_path / "out")  # training's filterbank, as fastasr-transcribe-onnx runs
    assert runtime.dropped == 0
    decoder = sherpa_onnx.OfflineRecognizer.from_zipformer_ctc(
        model=str(tmp_path / "out" / "model.onnx"), tokens=str(tmp_path / "out" / "tokens.txt"), sample_rate=16000,
        feature_dim=recogniser.feat_in)
    paths = recordings[:-1] + [tiny_corpus / u.audio_filepath for u in read_manifest(tiny_corpus / "dev.jsonl")]
    for path in paths:
        audio = sf.read(str(path), dtype="float32")[0]
        stream = decoder.create_stream()
        stream.accept_waveform(16000, audio)
        decoder.decode_stream(stream)
        ours = runtime.transcribe_waveform(audio, long_form=LongFormConfig(mode="one_pass"))
        shown = ours.units if kind == "phoneme" else ours.text.split()
        assert shown and stream.result.text.split() == shown, path.name
    kaldi = tiny_recogniser(tiny_corpus, kind=kind, **model)
    export_recogniser(kaldi, tmp_path / "kaldi", int8=False, check=False)
    info = json.loads((tmp_path / "kaldi" / "recogniser.json").read_text())
    assert info["export"]["sherpa_onnx_differences"] == ["snip_edges=True (sherpa-onnx: False)",
                                                         "high_freq=0.0 (sherpa-onnx: -400.0)",
                                                         "sample_scale=32768.0 (sherpa-onnx: 1.0)"]


def test_the_runtimes_filterbanks_differ_only_in_sherpa_onnxs_settings(tiny_corpus, tmp_path, recordings):
    """The graph adds the sample scale to any filterbank: fed training's (the runtime's default) it
    gives PyTorch's log-probabilities; the two filterbanks differ by sherpa-onnx's frame positions
    (one frame more at each end, the first of which the graph drops) and mel range alone."""
    recogniser = tiny_recogniser(tiny_corpus, kind="char", utterance_cmvn=True)
    export_recogniser(recogniser, tmp_path / "out", int8=False, check=False)
    training, sherpa = (OnnxRecogniser.load(tmp_path / "out", filterbank=f) for f in ("training", "sherpa-onnx"))
    audio = sf.read(str(recordings[0]), dtype="float32")[0]
    x = Fbank(recogniser.features)(torch.from_numpy(audio))
    with torch.no_grad():
        expected = recogniser.model(x[None], torch.tensor([x.shape[0]]))[0][0].numpy()
    got = training.run([training.graph_features(audio)])[0]
    assert got.shape == expected.shape and np.abs(got - expected).max() < 1e-4
    ours = sherpa.graph_features(audio)  # less the first frame, which the graph drops
    assert ours.shape[0] == round(audio.shape[0] / 160) - 1 and x.shape[0] == 1 + (audio.shape[0] - 400) // 160
    # digital silence: every bin at the floor in either filterbank, kept there; a single bin of
    # training's at the floor plus the constant (the runtime's feed at the floor) is not silence
    silence = np.full((1, 60, recogniser.feat_in), LOG_FLOOR, np.float32)
    near = x[:60].clone()[None]
    near[0, 7, 3] = LOG_FLOOR + SAMPLE_SCALE_LOG
    for graph_input, model_input in ((silence, torch.from_numpy(silence)), (near.numpy() - SAMPLE_SCALE_LOG, near)):
        with torch.no_grad():
            expected = recogniser.model(model_input, torch.tensor([60]))[0][0].numpy()
        assert np.abs(training.run([graph_input[0]])[0] - expected).max() < 1e-3
    with pytest.raises(ValueError, match="filterbank='kaldi'"):
        OnnxRecogniser.load(tmp_path / "out", filterbank="kaldi")


def test_the_graph_drops_sherpa_onnxs_first_frame_to_keep_trainings_grid(tiny_corpus, tmp_path, recordings):
    """sherpa-onnx centres its frames on the hops: its frame t + 1 lies 2.5 ms after training's
    frame t, its frame 0 before any. Fed sherpa-onnx's frames as sherpa-onnx feeds them (the whole
    utterance), the graph gives the model's log-probabilities of those after the first, so the
    subsampling keeps training's phase; the runtime, which puts a frame before training's for the
    graph to drop, still gives the model's log-probabilities of training's frames."""
    recogniser = tiny_recogniser(tiny_corpus, kind="char", utterance_cmvn=True)
    export_recogniser(recogniser, tmp_path / "out", int8=False, check=False)
    runtime = OnnxRecogniser.load(tmp_path / "out")
    meta = runtime.session.get_modelmeta().custom_metadata_map
    assert runtime.export["dropped_frames"] == 1 == int(meta["dropped_frames"]) == runtime.dropped
    audio = sf.read(str(recordings[0]), dtype="float32")[0]
    sherpa = log_mel(audio, sherpa_onnx_options(runtime.features))  # what sherpa-onnx hands the graph
    log_probs, lengths = runtime.session.run(None, {"x": sherpa[None], "x_lens": np.array([sherpa.shape[0]])})
    with torch.no_grad():
        expected = recogniser.model(torch.from_numpy(sherpa[1:] + SAMPLE_SCALE_LOG)[None],
                                    torch.tensor([sherpa.shape[0] - 1]))[0][0].numpy()
    got = log_probs[0, :lengths[0]]
    assert got.shape == expected.shape and np.abs(got - expected).max() < 1e-4
    x = fbank(audio, runtime.features)
    with torch.no_grad():
        expected = recogniser.model(torch.from_numpy(x)[None], torch.tensor([x.shape[0]]))[0][0].numpy()
    got = runtime.run([runtime.graph_features(audio)])[0]
    assert got.shape == expected.shape and np.abs(got - expected).max() < 1e-4
    # the grid: frames centred on the hops (sherpa-onnx's, at training's scale and mel range) less
    # the first are training's frames 2.5 ms later, one more at most at the end
    centred = log_mel(audio, replace(filterbank_options(runtime.features), snip_edges=False))
    n = x.shape[0]
    assert centred.shape[0] - 1 - n in (0, 1)
    assert np.abs(centred[1:n + 1] - x).mean() < 0.5 * np.abs(centred[:n] - x).mean()


def test_the_sherpa_onnx_shortcut_is_its_public_factory(tiny_corpus, tmp_path):
    """fastasr.onnx.sherpa.sherpa_recognizer: sherpa-onnx's public ``from_zipformer_ctc`` with the
    folder's rate and feature dimension (a char model's text: its words)."""
    sherpa_onnx = pytest.importorskip("sherpa_onnx", reason="sherpa-onnx has no wheel for this platform")
    from fastasr.onnx.sherpa import sherpa_recognizer

    recogniser = tiny_recogniser(tiny_corpus, kind="char")
    export_recogniser(recogniser, tmp_path / "out", int8=False, check=False)
    assert tokens_txt(recogniser).count(SHERPA_WORD_START) == 1
    decoder = sherpa_recognizer(tmp_path / "out")
    assert isinstance(decoder, sherpa_onnx.OfflineRecognizer)
    assert decoder.config.feat_config.feature_dim == 40 and decoder.config.feat_config.sampling_rate == 16000


def test_the_commands_export_and_transcribe(tiny_corpus, tmp_path, recordings):
    """fastasr-export writes the folder beside the checkpoint's run and says what it
    exported; fastasr-onnx-transcribe prints path<TAB>text and writes the JSON lines, CTM
    and SRT; a missing checkpoint or an unknown key is one line and exit status 2."""
    recogniser = tiny_recogniser(tiny_corpus, attention="i-clustered-4")
    ckpt = tmp_path / "run" / "checkpoints" / "best.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save({RECOGNISER_KEY: recogniser.to_dict(),
                "state_dict": {f"model.{k}": v for k, v in recogniser.model.state_dict().items()}}, ckpt)
    done = subprocess.run([sys.executable, "-m", "fastasr.cli.export", f"ckpt_path={ckpt}", "int8=false"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "run" / "export"
    assert f"{out / 'model.onnx'}\t" in done.stdout and "attention i-clustered-4: " in done.stderr
    assert "largest log-probability difference" in done.stderr and not (out / "model.int8.onnx").exists()
    done = subprocess.run([sys.executable, "-m", "fastasr.onnx.transcribe", f"model_dir={out}", f"audio={recordings[0]}",
                           f"out={tmp_path / 't'}", "ctm=true", "srt=true"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = json.loads((tmp_path / "t" / "transcripts.jsonl").read_text())
    assert done.stdout == f"{recordings[0]}\t{line['text']}\n" and "1 of 1 input(s) transcribed" in done.stderr
    assert (tmp_path / "t" / "transcripts.ctm").read_text().count("\n") == len(line["words"])
    assert (tmp_path / "t" / "srt" / f"{recordings[0].stem}.srt").is_file()
    beam = subprocess.run([sys.executable, "-m", "fastasr.onnx.transcribe", f"model_dir={out}", f"audio={recordings[0]}",
                           "decoding=beam_lm", "beam_size=20"], capture_output=True, text=True, timeout=120)
    assert beam.returncode == 0 and "beam_lm" in beam.stderr, beam.stderr
    recogniser.model.set_attention("full")  # what the folder holds (the swap)
    expected = recogniser.transcribe(str(recordings[0]), decoding={**recogniser.decoding_spec("beam_lm"),
                                                                    "beam_size": 20})[0]
    assert beam.stdout == f"{recordings[0]}\t{expected.text}\n"
    refused = subprocess.run([sys.executable, "-m", "fastasr.cli.export", f"ckpt_path={tmp_path / 'none.ckpt'}"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "no such checkpoint file" in refused.stderr
    refused = subprocess.run([sys.executable, "-m", "fastasr.onnx.transcribe", f"model_dir={out}", "audio=x.wav", "beam=5"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "'beam=5'" in refused.stderr


def test_the_export_leaves_the_callers_recogniser_as_it_was(tiny_corpus, tmp_path, caplog):
    """The caller's model keeps its attention (the same modules), its train mode and its chunked
    decoding context; a model trained with chunks says in one warning that the graph is
    full-context, one trained without says nothing."""
    from fastasr.model.chunking import ChunkContext

    recogniser = tiny_recogniser(tiny_corpus, attention="i-clustered-4",
                                 streaming={"chunk_sizes": [4], "left_frames": 8})
    model = recogniser.model.train()
    context = ChunkContext(4, 2)
    model.set_decoding_context(context)
    inners = [layer.inner for layer in model.attention_layers()]
    with caplog.at_level(logging.WARNING, logger="fastasr.deploy.export"):
        result = export_recogniser(recogniser, tmp_path / "chunked", int8=False)
    assert result.attention == "full" and result.max_abs_diff < 1e-4  # the graph: full attention, full context
    assert model.training and model.attention_spec == "i-clustered-4" and model.decoding_context is context
    assert all(a is b for a, b in zip((layer.inner for layer in model.attention_layers()), inners))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "\n" not in warned[0] and "trained with chunks" in warned[0]
    assert "full-context graph" in warned[0] and full_context_note(model) == warned[0]
    caplog.clear()
    plain = tiny_recogniser(tiny_corpus, attention="full")
    with caplog.at_level(logging.WARNING, logger="fastasr.deploy.export"):
        export_recogniser(plain, tmp_path / "plain", int8=False, check=False)
    assert not plain.model.training and not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_int8_keeps_a_trained_models_greedy_wer(tiny_corpus, tmp_path):
    """A phoneme model on sherpa-onnx's filterbank, trained until it transcribes the tiny corpus's
    four shortest training utterances (fp32 greedy PER under 5 %, WER under 20 %; 120 full-batch
    steps, where 100 reach a PER of 0): the int8 model's greedy WER over them is within 0.5 points
    of fp32's, and so is its PER (docs/results/export/RESULTS.md measures both on the built-in and
    Mini LibriSpeech test sets); sherpa-onnx's public offline recogniser says the fp32 runtime's
    phonemes, none empty."""
    from fastasr.decoding.metrics import align

    torch.manual_seed(0)
    utterances = sorted(read_manifest(tiny_corpus / "train.jsonl"), key=lambda u: u.duration)[:4]
    sherpa_features = FeatureConfig(num_mel_bins=40, snip_edges=False, high_freq=-400.0, sample_scale=1.0)
    recogniser = tiny_recogniser(tiny_corpus, kind="phoneme", features=sherpa_features)
    tok, model = recogniser.tokenizer, recogniser.model
    features = Fbank(recogniser.features)
    feats = [features(torch.from_numpy(sf.read(u.audio_filepath, dtype="float32")[0])) for u in utterances]
    frames = torch.cat(feats)
    model.set_cmvn(frames.mean(0), frames.std(0))
    x = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
    lengths = torch.tensor([f.shape[0] for f in feats])
    targets = [torch.tensor(tok.encode(u)) for u in utterances]
    flat, target_lengths = torch.cat(targets), torch.tensor([len(t) for t in targets])
    optimiser = torch.optim.Adam(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(120):
        log_probs, out_lengths = model(x, lengths)
        loss = torch.nn.functional.ctc_loss(log_probs.transpose(0, 1), flat, out_lengths, target_lengths,
                                            zero_infinity=True)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()
    export_recogniser(recogniser, tmp_path / "out", check=False)
    words = [u.text.lower().split() for u in utterances]
    units = [tok.scored_units(tok.units(u)) for u in utterances]
    rates = {}
    for int8 in (False, True):
        runtime = OnnxRecogniser.load(tmp_path / "out", int8=int8)
        got = list(runtime.transcribe([u.audio_filepath for u in utterances],
                                      long_form=LongFormConfig(mode="one_pass")))
        rates["int8" if int8 else "fp32"] = (align(words, [t.text.split() for t in got]).rate,
                                             align(units, [tok.scored_units(t.units) for t in got]).rate)
        if not int8:
            fp32 = got
    (wer, per), (wer8, per8) = rates["fp32"], rates["int8"]
    assert per < 5 and wer < 20, (rates, loss.item())  # the model transcribes: the comparison means something
    assert abs(wer8 - wer) <= 0.5 and abs(per8 - per) <= 0.5, rates
    sherpa_onnx = pytest.importorskip("sherpa_onnx", reason="sherpa-onnx has no wheel for this platform")
    decoder = sherpa_onnx.OfflineRecognizer.from_zipformer_ctc(
        model=str(tmp_path / "out" / "model.onnx"), tokens=str(tmp_path / "out" / "tokens.txt"), sample_rate=16000,
        feature_dim=40)
    for u, ours in zip(utterances, fp32):
        stream = decoder.create_stream()
        stream.accept_waveform(16000, sf.read(u.audio_filepath, dtype="float32")[0])
        decoder.decode_stream(stream)
        assert ours.units and stream.result.text.split() == ours.units, u.id
