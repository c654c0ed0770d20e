"""Transcription: ``Recogniser.transcribe`` and ``fastasr-transcribe`` — inputs (files,
directories, manifests without text, stdin, waveforms), word times, long recordings in one pass
or in windows, and bad input named and survived."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from hydra import compose, initialize_config_dir
from run_probe import imported_modules
from test_train_eval import compose_train
from torch import nn

from fastasr.config import CONFIG_DIR
from fastasr.data.audio import BadAudioError, resample
from fastasr.data.features import FeatureConfig
from fastasr.data.manifest import ManifestError, read_manifest, write_manifest
from fastasr.data.recordings import Recording, recording_audio, wav_truncation
from fastasr.decoding.alignment import align_units, word_frames, word_unit_groups
from fastasr.decoding.greedy import GreedyDecoder
from fastasr.decoding.long_form import (
    LongFormConfig,
    long_form_log_probs,
    output_frames,
    plan_windows,
    resolve_mode,
)
from fastasr.model import CTCModel
from fastasr.model.frontend import ConvSubsampling
from fastasr.recognition.audio_decoding import Transcription
from fastasr.recognition.loading import load_recogniser
from fastasr.recognition.scoring import decode_manifest
from fastasr.recognition.transcription_job import (
    resolve_inputs,
    run_transcription,
    srt_text,
    summary,
)

ROOT = Path(__file__).resolve().parents[1]
from benchmarks.pipeline.long_recordings import build_long_recording  # noqa: E402

RATE = 16000
FEATURES = FeatureConfig(sample_rate=RATE, num_mel_bins=40, channels=1)


# ---------------------------------------------------------------------- windows: frame-exact bookkeeping
@pytest.mark.parametrize("subsampling", [1, 2, 4, 8])
@pytest.mark.parametrize("frames", [1, 7, 100, 1001, 4003])
def test_windows_tile_the_recording_exactly(subsampling, frames):
    total = output_frames(frames, subsampling)
    for window, overlap in [(200, 40), (64, 0), (33, 17), (10_000, 100)]:
        windows = plan_windows(frames, subsampling, window, overlap)
        kept = []
        for w in windows:
            assert w.start % subsampling == 0 and 0 <= w.start < w.end <= frames
            out = output_frames(w.end - w.start, subsampling)
            assert 0 <= w.keep_start < w.keep_end <= out
            assert w.to == w.start // subsampling + w.keep_start  # the window's frames sit where they belong
            kept += range(w.to, w.to + w.keep_end - w.keep_start)
        assert kept == list(range(total))  # no gap, no frame twice
        if window >= frames:
            assert len(windows) == 1 and (windows[0].start, windows[0].end) == (0, frames)


class LocalModel(nn.Module):
    """Convolutional subsampling and a linear head: every output frame sees a few input frames
    only, so windows with enough overlap must reproduce one pass exactly."""

    def __init__(self, subsampling: int = 4, vocab: int = 7) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.frontend = ConvSubsampling(40, 16, subsampling)
        self.head = nn.Linear(16, vocab)

    @property
    def subsampling_factor(self) -> int:
        return self.frontend.factor

    def attention_layers(self) -> list:
        return []

    def forward(self, x, lengths):
        valid = torch.arange(x.shape[1])[None, :] < lengths[:, None]
        y, lengths = self.frontend(x.masked_fill(~valid[..., None], 0.0), lengths)
        return self.head(y).log_softmax(-1), lengths


@pytest.mark.parametrize("subsampling", [1, 4])
def test_windowed_log_probs_equal_one_pass_where_the_context_is_local(subsampling):
    model = LocalModel(subsampling).eval()
    g = torch.Generator().manual_seed(1)
    features = [torch.randn(n, 40, generator=g) for n in (1234, 37, 999)]
    one = long_form_log_probs(model, features, LongFormConfig(mode="one_pass"), batch_size=1)
    windows = LongFormConfig(mode="windowed", window_s=2.0, overlap_s=0.5)
    for f, a, b in zip(features, one, long_form_log_probs(model, features, windows, batch_size=1)):
        assert a.shape == b.shape == (output_frames(f.shape[0], subsampling), 7)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # batched, a shorter input is padded: the convolutions' ReLU(bias) on the padding reaches its
    # last output frame (as in any padded batch of this model), and nothing else
    for a, b in zip(one, long_form_log_probs(model, features, windows, batch_size=3)):
        torch.testing.assert_close(a[:-1], b[:-1], atol=1e-5, rtol=1e-5)


def test_auto_mode_follows_the_attention_cost_and_auto_attentions_crossover():
    def model(attention):
        return CTCModel(vocab_size=5, feat_in=40, d_model=16, heads=2, ff_dim=16, layers=1, attention=attention)

    auto = LongFormConfig()
    assert resolve_mode(auto, model("full"), 10_000) == "windowed"
    assert resolve_mode(auto, model("topk-8"), 10_000) == "windowed"
    assert resolve_mode(auto, model("i-clustered-8"), 10) == "one_pass"
    assert resolve_mode(auto, model("clustered-8"), 10) == "one_pass"
    switching = model({"name": "auto", "crossover": 10, "crossover_no_grad": 50})
    assert resolve_mode(auto, switching, 49) == "windowed"  # full attention below the crossover
    assert resolve_mode(auto, switching, 50) == "one_pass"  # i-clustered from it on (decoding's crossover)
    assert resolve_mode(LongFormConfig(mode="windowed"), model("i-clustered-8"), 10) == "windowed"
    with pytest.raises(ValueError, match="long_form.overlap_s"):
        LongFormConfig(window_s=2, overlap_s=2)
    with pytest.raises(ValueError, match="long_form: unknown key"):
        LongFormConfig.from_dict({"window": 3})


# ---------------------------------------------------------------------- word times
def path_log_probs(path: list[int], vocab: int) -> torch.Tensor:
    """(T, V) log-probabilities with ``path[t]`` almost certain at frame t."""
    lp = torch.full((len(path), vocab), -12.0)
    lp[torch.arange(len(path)), torch.tensor(path)] = 0.0
    return lp.log_softmax(-1)


def test_forced_alignment_gives_each_unit_its_frames_in_one_piece_or_many():
    # units a=1 b=2 |=3 ; hypothesis "a b | a a | b" with blanks (0) around
    path = [0, 1, 1, 0, 2, 3, 3, 0, 1, 0, 1, 1, 0, 3, 2, 2, 2, 0, 0]
    ids = [1, 2, 3, 1, 1, 3, 2]
    want = [(1, 3), (4, 5), (5, 7), (8, 9), (10, 12), (13, 14), (14, 17)]
    lp = path_log_probs(path, 4)
    assert align_units(lp, ids) == want
    frames = [s for s, _ in want]
    cut = [i in (2, 5) for i in range(len(ids))]
    assert align_units(lp, ids, frames=frames, cut_before=cut, max_cells=1, piece_frames=3) == want
    assert align_units(lp, ids[:3] * 10) is None  # more units than frames: no CTC path
    assert align_units(lp, []) == []
    units = ["a", "b", "|", "a", "a", "|", "b"]
    assert word_unit_groups(units) == [[0, 1], [3, 4], [6]]
    assert word_frames(units, want) == [(1, 5), (8, 12), (14, 17)]
    assert word_unit_groups(["▁he", "llo", "▁w", "or", "ld"], boundary=None, word_start="▁") == [[0, 1], [2, 3, 4]]


def test_greedy_hypothesis_says_where_each_unit_was_emitted(tiny_corpus):
    from fastasr.data.tokenizer import Tokenizer

    tok = Tokenizer.build(read_manifest(tiny_corpus / "train.jsonl"), "phoneme")
    b = tok.vocab.index("|")
    path = [b, 0, 3, 3, 0, b, b, 4, 0, 4, 0, b]
    hyp = GreedyDecoder(tok)(path_log_probs(path, len(tok.vocab)))
    assert hyp.units == [tok.vocab[3], "|", tok.vocab[4], tok.vocab[4]]
    assert hyp.frames == [2, 5, 7, 9]  # boundaries at either end dropped with their frames


# ---------------------------------------------------------------------- inputs
def test_a_manifest_without_text_is_for_transcription_only(tmp_path):
    wav = tmp_path / "a.wav"
    sf.write(wav, np.zeros(1600, np.float32), RATE)
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"audio_filepath": "a.wav", "duration": 0.1}) + "\n")
    (utt,) = read_manifest(m, require_text=False)
    assert utt.text is None and utt.audio_filepath == str(wav.resolve())
    with pytest.raises(ManifestError, match="line 1: missing field 'text'; expected fields audio_filepath, "
                                            "duration, text"):
        read_manifest(m, on_error="raise")  # training and evaluation still need text
    with pytest.raises(ManifestError, match="missing field 'text'.*can be transcribed"):
        read_manifest(m)
    m.write_text(json.dumps({"audio_filepath": "a.wav"}) + "\n")
    with pytest.raises(ManifestError, match="missing field 'duration'; expected fields audio_filepath, duration$"):
        read_manifest(m, on_error="raise", require_text=False)


def test_inputs_files_directories_manifests_and_stdin(tmp_path):
    d = tmp_path / "audio"
    for rel in ("x/one.wav", "x/y/two.FLAC", "three.wav", "notes.txt"):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(b"")
    (tmp_path / "silent").mkdir()
    (tmp_path / "silent" / "readme.md").write_text("no audio here")
    write_manifest(tmp_path / "m.jsonl", [{"audio_filepath": str(d / "three.wav"), "duration": 1.0, "id": "m1"}])
    stdin = io.StringIO(f"# a comment\n\n{d / 'x' / 'one.wav'}\n{tmp_path / 'gone.wav'}\n")
    recs, problems = resolve_inputs([str(d), str(tmp_path / "m.jsonl"), "-", str(tmp_path / "silent")], stdin)
    assert [Path(r.audio_filepath).name for r in recs] == ["three.wav", "one.wav", "two.FLAC", "three.wav", "one.wav"]
    assert [r.id for r in recs] == ["three", "one", "two", "m1", "one-2"]  # unique ids
    assert recs[3].duration == 1.0
    assert [(Path(p.path).name, p.reason.split(" (")[0]) for p in problems] == [
        ("gone.wav", "no such file or directory"), ("silent", "a directory with no audio files in it")]


def make_inputs(d: Path, source: np.ndarray) -> tuple[dict[str, Path], dict[str, tuple[Path, str]]]:
    """Audio that must be transcribed (name → path), and bad input (name → (path, reason))."""
    d.mkdir(parents=True, exist_ok=True)
    good = {"mono16k": d / "mono16k.wav", "stereo": d / "stereo.wav"}
    sf.write(good["mono16k"], source, RATE, subtype="PCM_16")
    sf.write(good["stereo"], np.stack([source, 0.5 * source], 1), RATE, subtype="PCM_16")
    for rate in (8000, 22050, 48000):
        good[f"rate{rate}"] = d / f"rate{rate}.flac"
        sf.write(good[f"rate{rate}"], resample(torch.from_numpy(source), RATE, rate).numpy(), rate)
    bad = {}
    (d / "empty.wav").write_bytes(b"")
    bad["empty"] = (d / "empty.wav", "empty file (0 bytes)")
    sf.write(d / "zero.wav", np.zeros(0, np.float32), RATE)
    bad["zero-length"] = (d / "zero.wav", "0 samples")
    (d / "notes.wav").write_text("these are words, not audio\n")
    bad["not audio"] = (d / "notes.wav", "unreadable")
    (d / "corrupt.wav").write_bytes(b"RIFF" + bytes(range(256)) * 8)
    bad["unreadable"] = (d / "corrupt.wav", "unreadable")
    whole = good["mono16k"].read_bytes()
    (d / "truncated.wav").write_bytes(whole[: len(whole) // 3])
    bad["truncated"] = (d / "truncated.wav", "truncated: the WAV header declares")
    sf.write(d / "whole.flac", source, RATE)
    flac = (d / "whole.flac").read_bytes()
    (d / "whole.flac").unlink()
    (d / "truncated.flac").write_bytes(flac[: len(flac) // 3])
    bad["truncated flac"] = (d / "truncated.flac", "unreadable")
    if os.geteuid() != 0:  # root reads any file: no permission error to provoke
        (d / "locked.wav").write_bytes(whole)
        (d / "locked.wav").chmod(0)
        bad["no permission"] = (d / "locked.wav", "permission denied")
    return good, bad


def test_bad_recordings_are_named_and_odd_ones_are_read(tmp_path):
    source = (0.1 * np.random.default_rng(0).standard_normal(RATE)).astype(np.float32)
    good, bad = make_inputs(tmp_path, source)
    for name, path in good.items():
        wav = recording_audio(Recording.of(path), FEATURES)  # mixed down, resampled to 16 kHz
        assert wav.ndim == 1 and abs(wav.shape[0] - RATE) <= 2, name
    for path, reason in bad.values():
        with pytest.raises(BadAudioError, match=re.escape(reason)):
            recording_audio(Recording.of(path), FEATURES)
    assert wav_truncation(good["mono16k"]) is None
    with pytest.raises(BadAudioError, match="no such file"):
        recording_audio(Recording.of(tmp_path / "missing.wav"), FEATURES)
    with pytest.raises(BadAudioError, match="truncated"):  # shorter than its manifest says
        recording_audio(Recording("t", str(good["mono16k"]), duration=3.0), FEATURES)
    stereo = recording_audio(Recording.of(torch.from_numpy(np.stack([source, source])), sample_rate=RATE), FEATURES)
    torch.testing.assert_close(stereo, torch.from_numpy(source))
    assert recording_audio(Recording.of(source, sample_rate=8000), FEATURES).shape == (2 * RATE,)
    with pytest.raises(BadAudioError, match="NaN"):
        recording_audio(Recording.of(np.full(100, np.nan, np.float32), sample_rate=RATE), FEATURES)
    with pytest.raises(ValueError, match="sample_rate"):
        Recording.of(source)


def test_subtitles_group_words_by_count_and_pause():
    from fastasr.recognition.audio_decoding import Word

    words = [Word(f"w{i}", i * 0.5, i * 0.5 + 0.4) for i in range(14)] + [Word("late", 20.0, 20.5)]
    text = srt_text(words)
    assert text.startswith("1\n00:00:00,000 --> 00:00:05,900\nw0 w1") and "\n3\n00:00:20,000 --> 00:00:20,500\nlate\n" in text


# ---------------------------------------------------------------------- with a trained model
@pytest.fixture(scope="module")
def trained(tiny_corpus, tmp_path_factory) -> Path:
    """A tiny phoneme model (full attention, subsampling 4, the paper's plain encoder: in 3 epochs
    it leaves CTC's blank plateau on every test utterance, which the convolution module's does
    not yet) trained on the tiny corpus: its checkpoint carries the training lexicon and word LM."""
    from fastasr.training.fit import train

    out = tmp_path_factory.mktemp("transcribe_model")
    result = train(compose_train(tiny_corpus, out, "name=t", "trainer.max_epochs=3", "test=false",
                                 "final_decoding=null", "model.positions=absolute", "model.conv_kernel=null"))
    return Path(result.last_ckpt)


def compose_transcribe(*overrides: str):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("transcribe", overrides=["device=cpu", "num_workers=0", *overrides])


@pytest.mark.slow
def test_words_are_timed_within_the_recording(trained, tiny_corpus):
    rec = load_recogniser(trained)
    paths = [u.audio_filepath for u in read_manifest(tiny_corpus / "test.jsonl")]
    for decoding in ("greedy", "beam", "beam_lm"):
        out = rec.transcribe(paths, batch_size=2, decoding=decoding)
        assert [t.audio_filepath for t in out] == paths and all(t.ok for t in out)
        for t in out:
            assert t.text == " ".join(w.word for w in t.words) and t.units
            assert t.duration == pytest.approx(sf.info(t.audio_filepath).duration, abs=1e-3)
            assert all(0 <= w.start <= w.end <= t.duration for w in t.words), decoding
            assert all(a.end <= b.start for a, b in zip(t.words, t.words[1:])), decoding  # in order, apart
        if decoding != "greedy":
            assert all(t.real_words and t.words for t in out)  # lexicon words


@pytest.mark.slow
def test_api_on_paths_and_waveforms(trained, tiny_corpus, tmp_path):
    rec = load_recogniser(trained)
    path = read_manifest(tiny_corpus / "test.jsonl")[1].audio_filepath
    (from_path,) = rec.transcribe(path)
    x, rate = sf.read(path, dtype="float32")
    from_tensor, from_array = rec.transcribe([torch.from_numpy(x), x], sample_rate=rate)
    assert from_tensor.audio_filepath is None and from_tensor.id == "waveform-0"
    assert from_tensor.text == from_array.text == from_path.text and from_tensor.words == from_path.words
    # another rate and two channels: resampled and mixed down, not refused
    x48 = resample(torch.from_numpy(x), rate, 48000)
    (at48,) = rec.transcribe(torch.stack([x48, x48]), sample_rate=48000)
    assert at48.ok and at48.duration == pytest.approx(from_path.duration, abs=1e-3)
    # a bad input among good ones: named, the others transcribed; or raised when asked
    out = rec.transcribe([path, tmp_path / "missing.wav", path])
    assert [t.ok for t in out] == [True, False, True] and "no such file" in out[1].error
    with pytest.raises(BadAudioError, match="missing.wav: no such file"):
        rec.transcribe([tmp_path / "missing.wav"], on_bad_audio="raise")
    line = out[0].to_dict()
    assert set(line) >= {"id", "audio_filepath", "duration", "text", "words", "units", "mode"}
    assert json.loads(json.dumps(line)) == line


@pytest.mark.slow
def test_command_on_a_file_a_directory_and_a_manifest_without_text(trained, tiny_corpus, tmp_path):
    utts = read_manifest(tiny_corpus / "test.jsonl")
    no_text = tmp_path / "no_text.jsonl"
    write_manifest(no_text, [{"audio_filepath": u.audio_filepath, "duration": u.duration} for u in utts])
    with pytest.raises(ManifestError, match="missing field 'text'"):  # scoring it still needs the text
        decode_manifest(load_recogniser(trained), no_text, accelerator="cpu", num_workers=0)
    for name, audio, expected in [
        ("file", utts[0].audio_filepath, [utts[0].audio_filepath]),
        ("dir", str(tiny_corpus / "wav" / "test"), sorted(str(p) for p in (tiny_corpus / "wav" / "test").rglob("*.wav"))),
        ("manifest", str(no_text), [u.audio_filepath for u in utts]),
    ]:
        stdout = io.StringIO()
        cfg = compose_transcribe(f"ckpt_path={trained}", f"audio={audio}", "decoding=beam", "output.srt=true",
                                 "output.ctm=true")
        report = run_transcription(cfg, stdout=stdout, run_dir=tmp_path / name)
        printed = [line.split("\t") for line in stdout.getvalue().splitlines()]
        assert [p for p, _ in printed] == expected, name
        lines = [json.loads(x) for x in (tmp_path / name / "transcripts.jsonl").read_text().splitlines()]
        assert [x["audio_filepath"] for x in lines] == expected and [x["text"] for x in lines] == [t for _, t in printed]
        for x in lines:
            assert x["words"] and all(0 <= w["start"] <= w["end"] <= x["duration"] for w in x["words"])
        assert report["transcribed"] == len(expected) and report["failed"] == [] and report["rtf"] > 0
        saved = json.loads((tmp_path / name / "transcribe.json").read_text())
        assert saved["decoding"]["name"] == "beam" and saved["attention"] == "full"
        assert len((tmp_path / name / "transcripts.ctm").read_text().splitlines()) == sum(len(x["words"]) for x in lines)
        assert len(list((tmp_path / name / "srt").glob("*.srt"))) == len(expected)


@pytest.mark.slow
def test_bad_input_is_named_in_the_report_and_the_rest_transcribed(trained, tiny_corpus, tmp_path):
    source, _ = sf.read(read_manifest(tiny_corpus / "test.jsonl")[1].audio_filepath, dtype="float32")
    good, bad = make_inputs(tmp_path / "in", source)
    (tmp_path / "nothing").mkdir()
    (tmp_path / "nothing" / "notes.txt").write_text("no audio")
    cfg = compose_transcribe(f"ckpt_path={trained}", f"audio=[{tmp_path / 'in'},{tmp_path / 'missing.wav'},"
                                                     f"{tmp_path / 'nothing'}]")
    stdout = io.StringIO()
    report = run_transcription(cfg, stdout=stdout, run_dir=tmp_path / "run")
    printed = sorted(Path(line.split("\t")[0]).name for line in stdout.getvalue().splitlines())
    assert printed == sorted(p.name for p in good.values())  # stereo and 8/22.05/48 kHz transcribed
    reasons = {Path(f["path"]).name: f["reason"] for f in report["failed"]}
    expected = {path.name: reason for path, reason in bad.values()}
    expected["missing.wav"] = "no such file or directory"
    expected["nothing"] = "a directory with no audio files in it"
    assert set(reasons) == set(expected)
    for name, reason in expected.items():
        assert reason in reasons[name], name
    assert report["inputs"] == len(good) + len(expected) and report["transcribed"] == len(good)
    text = summary({**report, "run_dir": str(tmp_path / "run")})
    assert f"{len(good)} of {report['inputs']} input(s) transcribed" in text and "truncated.wav" in text


def test_the_command_refuses_a_missing_checkpoint_or_no_audio_before_its_run_directory(tmp_path):
    """One line naming the key and what is expected, exit status 2, no traceback, no run
    directory, and no wait for torch (``fastasr.cli.preflight.TranscribePreflight``)."""
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(b"")  # the check wants a file; reading it is the transcription's
    cases = [
        ((f"ckpt_path={tmp_path / 'nope.ckpt'}", "audio=a.wav"),
         f"ckpt_path={tmp_path / 'nope.ckpt'}: no such file; expected a checkpoint (.ckpt)"),
        (("audio=a.wav",), "ckpt_path is not set; expected a checkpoint (.ckpt)"),
        ((f"ckpt_path={ckpt}",), "audio is not set; expected an audio file, a directory, a manifest"),
        ((f"ckpt_path={ckpt}", "audio=[]"), "audio is not set"),
    ]
    for args, message in cases:
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "fastasr.cli.transcribe", *args,
                               f"paths.output_dir={tmp_path / 'out'}"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and f"transcribe: {message}" in done.stderr, done.stderr[-2000:]
        assert "Traceback" not in done.stderr and done.stdout == ""
        assert "omegaconf" in imported_modules(done.stderr) and "torch" not in imported_modules(done.stderr)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_command_line_reads_stdin_and_fails_only_when_nothing_is_transcribed(trained, tiny_corpus, tmp_path):
    utts = read_manifest(tiny_corpus / "test.jsonl")
    (tmp_path / "bad.wav").write_text("not audio")

    def run(audio: str, stdin: str, name: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fastasr.cli.transcribe", f"ckpt_path={trained}", f"audio={audio}",
                               "device=cpu", f"hydra.run.dir={tmp_path / name}"],
                              input=stdin, capture_output=True, text=True, timeout=300, cwd=tmp_path)

    ok = run("-", f"{utts[0].audio_filepath}\n{tmp_path / 'bad.wav'}\n{tmp_path / 'gone.wav'}\n", "ok")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert [line.split("\t")[0] for line in ok.stdout.splitlines()] == [utts[0].audio_filepath]  # stdout: results only
    assert "1 of 3 input(s) transcribed" in ok.stderr and "bad.wav" in ok.stderr and "gone.wav" in ok.stderr
    assert (tmp_path / "ok" / "transcripts.jsonl").is_file() and (tmp_path / "ok" / "transcribe.json").is_file()
    none = run(str(tmp_path / "bad.wav"), "", "none")
    assert none.returncode == 1 and none.stdout == "" and "nothing could be transcribed" in none.stderr


@pytest.mark.slow
def test_windowed_and_one_pass_on_a_joined_recording(trained, tiny_corpus, tmp_path):
    """A ~20 s recording joined from the test and dev utterances: a window longer than the
    recording is one pass exactly; 6 s windows give the same frames, and (this model being
    weak) text of about the same length."""
    utts = read_manifest(tiny_corpus / "test.jsonl") + read_manifest(tiny_corpus / "dev.jsonl")
    manifest = build_long_recording(utts, 20.0, tmp_path, "long-20s", 0.3)
    (ref,) = read_manifest(manifest)
    assert ref.duration >= 20.0 and ref.text.startswith(utts[0].text)
    rec = load_recogniser(trained)
    wav = ref.audio_filepath

    def go(**long_form) -> Transcription:
        (t,) = rec.transcribe(wav, long_form=long_form, seed=0)
        assert t.ok and all(0 <= w.start <= w.end <= t.duration for w in t.words)
        return t

    one = go(mode="one_pass")
    whole_window = go(mode="windowed", window_s=60.0, overlap_s=2.0)
    assert (whole_window.mode, one.mode) == ("windowed", "one_pass")
    assert whole_window.units == one.units and whole_window.words == one.words
    windows = go(mode="windowed", window_s=6.0, overlap_s=2.0)
    assert windows.duration == one.duration
    assert 0.5 < len(windows.units) / len(one.units) < 2.0
    assert go().mode == "windowed"  # auto: the model's full attention is quadratic
