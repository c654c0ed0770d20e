"""The streaming export (fastasr.deploy.streaming_export): onnxruntime stepping
``model.streaming.onnx`` gives the PyTorch stream's log-probabilities, and sherpa-onnx's public
``OnlineRecognizer.from_wenet_ctc`` streams it to the PyTorch stream's units."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import soundfile as sf
import torch

onnxruntime = pytest.importorskip("onnxruntime", reason="the deploy extra (pip install -e .[deploy]; make install has it)")

from recogniser_fixtures import tiny_recogniser  # noqa: E402

from fastasr.data.features import Fbank, FeatureConfig  # noqa: E402
from fastasr.data.manifest import read_manifest  # noqa: E402
from fastasr.deploy.export import tokens_txt  # noqa: E402
from fastasr.deploy.streaming_export import (  # noqa: E402
    STREAMING_FILE,
    export_streaming,
    run_stream,
    streaming_chunk,
)
from fastasr.onnx.filterbank import log_mel  # noqa: E402
from fastasr.onnx.onnx_recogniser import INT16_SCALE, sherpa_onnx_options  # noqa: E402
from fastasr.onnx.streaming import OnnxStream  # noqa: E402

#: sherpa-onnx's default filterbank as a training setting.
SHERPA_FEATURES = FeatureConfig(num_mel_bins=40, snip_edges=False, high_freq=-400.0, sample_scale=1.0)
#: sherpa-onnx's from_wenet_ctc defaults: 16 frames a chunk, 4 chunks of left context (0.64 s and
#: 2.56 s at the tiny model's 40 ms a frame).
CHUNK, LEFT = 0.64, 2.56


def _paths(corpus):
    return [corpus / u.audio_filepath for name in ("test.jsonl", "dev.jsonl") for u in read_manifest(corpus / name)]


def _sherpa_frames(recogniser, audio: np.ndarray) -> np.ndarray:
    """sherpa-onnx's filterbank of a WeNet model's input: its default one of int16-scaled samples."""
    from dataclasses import replace

    options = replace(sherpa_onnx_options(recogniser.to_dict()["features"]), scale=INT16_SCALE)
    return log_mel(audio, options).astype(np.float32)


@pytest.mark.parametrize("model", [{}, {"positions": "rotary"}, {"conv_kernel": None, "subsampling": 2},
                                   {"utterance_cmvn": True}, {"utterance_cmvn": True, "subsampling": 1},
                                   {"utterance_cmvn": True, "features": SHERPA_FEATURES}])
def test_onnxruntime_steps_the_graph_to_the_pytorch_streams_log_probs(tiny_corpus, tmp_path, model):
    """Chunk by chunk, caches fed back, the graph's log-probabilities equal ModelStream's (1e-4)
    over whole utterances, past the left context (the cache's mask then full). A model trained on
    sherpa-onnx's filterbank drops no frame and takes ``scale_log`` off the int16-scaled input."""
    recogniser = tiny_recogniser(tiny_corpus, **model)
    result = export_streaming(recogniser, tmp_path, chunk=CHUNK, left=LEFT)
    assert result.files == [STREAMING_FILE, "tokens.txt"] and result.swapped is None
    assert result.max_abs_diff is not None and result.max_abs_diff < 1e-4
    session = onnxruntime.InferenceSession(str(tmp_path / STREAMING_FILE), providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    assert int(meta["chunk_size"]) == result.chunk_size and int(meta["left_chunks"]) == result.left_chunks
    context = streaming_chunk(recogniser, CHUNK, LEFT)
    audio = np.concatenate([sf.read(str(path), dtype="float32")[0] for path in _paths(tiny_corpus)])
    if "features" in model:  # training's frames, at [-1, 1]'s scale
        frames = Fbank(recogniser.features)(torch.from_numpy(audio)).numpy()
    else:
        frames = _sherpa_frames(recogniser, audio)
    frames = frames[:frames.shape[0] - 7]  # a last chunk shorter than the others
    with torch.no_grad():
        model_stream = recogniser.model.start_stream(context)
        expected = model_stream.accept(torch.from_numpy(frames)).numpy()
        last = model_stream.finish().numpy()
    got = run_stream(session, frames, context.size, context.left_frames, layers=int(meta["num_blocks"]),
                     heads=int(meta["head"]), d_model=int(meta["output_size"]),
                     cache_columns=int(meta["cnn_module_kernel"]) - 1, factor=int(meta["subsampling_factor"]),
                     dropped=int(meta["dropped_frames"]), scale_log=float(meta["scale_log"]))
    if "features" in model:
        assert int(meta["dropped_frames"]) == 0 and abs(float(meta["scale_log"]) - 2 * np.log(32768.0)) < 1e-5
        assert (frames < -15.0).any()  # bins at the floor: the graph keeps them there
    else:
        assert int(meta["dropped_frames"]) == 1 and float(meta["scale_log"]) == 0.0  # 25 ms windows, 10 ms hops
    assert expected.shape[0] > 3 * context.left_frames  # the cache rolls over
    assert got.shape == expected.shape and np.abs(got - expected).max() < 1e-4
    # fastasr's PyTorch-free runtime streams the same file, in pieces of any size
    stream = OnnxStream(tmp_path / STREAMING_FILE)
    pieces = [stream.accept(frames[i:i + 37]) for i in range(0, frames.shape[0], 37)]
    assert np.abs(np.concatenate(pieces) - expected).max() < 1e-4
    assert 0 < last.shape[0] < context.size  # and the frames left as the PyTorch stream's finish
    end = stream.finish()
    assert end.shape == last.shape and np.abs(end - last).max() < 1e-4


def _greedy(log_probs: np.ndarray, blank: int) -> list[int]:
    best = log_probs.argmax(-1).tolist()
    return [u for i, u in enumerate(best) if u != blank and (i == 0 or best[i - 1] != u)]


@pytest.mark.slow
@pytest.mark.parametrize("kind, attention, model", [
    ("phoneme", "full", {}), ("char", "clustered-4", {}), ("phoneme", "clustered-4", {}),
    ("char", "full", {"utterance_cmvn": True}),
    ("char", "full", {"utterance_cmvn": True, "features": SHERPA_FEATURES}),
    ("char", "clustered-4", {"utterance_cmvn": True, "features": SHERPA_FEATURES}),
])
def test_sherpa_onnxs_online_recognizer_streams_the_pytorch_streams_units(tiny_corpus, tmp_path, kind, attention,
                                                                        model, caplog):
    """``sherpa_onnx.OnlineRecognizer.from_wenet_ctc`` with only the rate and the feature dimension
    (its default 16-frame chunks and 4 left chunks) gives, on every utterance, the units of the
    PyTorch stream with the same chunks fed sherpa-onnx's filterbank less its first frame, which the
    graph drops (the complete chunks sherpa-onnx decodes), per-utterance CMVN's statistics carried
    in the caches. A model trained on sherpa-onnx's filterbank (``SHERPA_FEATURES``) drops no frame:
    the PyTorch stream is then fed training's own filterbank (``Fbank``). A clustered model exports
    with full attention and says so in one warning; the units are then PyTorch's stream with full
    attention."""
    sherpa_onnx = pytest.importorskip("sherpa_onnx", reason="sherpa-onnx has no wheel for this platform")
    recogniser = tiny_recogniser(tiny_corpus, kind=kind, attention=attention, **model)
    dropped = 0 if "features" in model else 1
    with caplog.at_level(logging.WARNING, logger="fastasr.deploy.streaming_export"):
        result = export_streaming(recogniser, tmp_path, chunk=CHUNK, left=LEFT, check=False)
    warned = [r.getMessage() for r in caplog.records if r.name == "fastasr.deploy.streaming_export"]
    if attention == "full":
        assert result.swapped is None and not warned
    else:
        assert result.attention == "full" and len(warned) == 1 and "clustered" in warned[0]
        assert "exported with full attention instead" in warned[0]
    assert (result.chunk_size, result.left_chunks) == (16, 4)
    session = onnxruntime.InferenceSession(str(tmp_path / STREAMING_FILE), providers=["CPUExecutionProvider"])
    assert int(session.get_modelmeta().custom_metadata_map["dropped_frames"]) == dropped
    decoder = sherpa_onnx.OnlineRecognizer.from_wenet_ctc(
        model=str(tmp_path / STREAMING_FILE), tokens=str(tmp_path / "tokens.txt"), sample_rate=16000,
        feature_dim=recogniser.feat_in)
    symbols = [line.rsplit(" ", 1)[0] for line in tokens_txt(recogniser).splitlines()]
    original = recogniser.model.attention_spec
    recogniser.model.set_attention(result.attention)
    context = streaming_chunk(recogniser, CHUNK, LEFT)
    shift = context.size * recogniser.subsampling
    try:
        for path in _paths(tiny_corpus):
            audio = sf.read(str(path), dtype="float32")[0]
            stream = decoder.create_stream()
            stream.accept_waveform(16000, audio)
            stream.input_finished()
            while decoder.is_ready(stream):
                decoder.decode_stream(stream)
            if dropped:
                frames = _sherpa_frames(recogniser, audio)[dropped:]  # the graph drops sherpa-onnx's first frame
            else:  # training's frames are sherpa-onnx's
                frames = Fbank(recogniser.features)(torch.from_numpy(audio)).numpy()
            chunks = sum(1 for k in range(frames.shape[0]) if (k + 1) * shift < frames.shape[0])
            with torch.no_grad():
                log_probs = recogniser.model.start_stream(context).accept(
                    torch.from_numpy(frames[:chunks * shift])).numpy()
            units = [symbols[u].replace("\u2581", " ") for u in _greedy(log_probs, recogniser.tokenizer.blank_id)]
            assert units and json.loads(decoder.get_result_as_json_string(stream))["tokens"] == units, path.name
    finally:
        recogniser.model.set_attention(original)


@pytest.mark.slow
def test_the_export_command_writes_the_streaming_graph(tiny_corpus, tmp_path):
    """``fastasr-export ... streaming=true``: the folder gains ``model.streaming.onnx`` (and
    ``recogniser.json`` its ``streaming`` entry); the command prints sherpa-onnx's chunk arguments,
    the swap of a clustered model's attention and the stream check."""
    import subprocess
    import sys

    from fastasr.recognition.recogniser import RECOGNISER_KEY

    recogniser = tiny_recogniser(tiny_corpus, attention="clustered-4")
    ckpt = tmp_path / "best.ckpt"
    torch.save({RECOGNISER_KEY: recogniser.to_dict(),
                "state_dict": {f"model.{k}": v for k, v in recogniser.model.state_dict().items()}}, ckpt)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "fastasr.cli.export", f"ckpt_path={ckpt}", f"out={out}", "int8=false",
                           "streaming=true", "left=2.56"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{out / STREAMING_FILE}\t" in done.stdout
    assert "chunk_size 16, num_left_chunks 4" in done.stderr and "streaming: attention clustered-4: " in done.stderr
    assert "onnxruntime against the PyTorch stream" in done.stderr
    entry = json.loads((out / "recogniser.json").read_text())["streaming"]
    assert entry["model"] == STREAMING_FILE and entry["attention"] == "full" and entry["left_chunks"] == 4
