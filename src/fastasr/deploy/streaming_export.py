"""A recogniser's chunk-by-chunk encoder as an ONNX graph that sherpa-onnx streams: ``model.streaming.onnx``.

The graph is one step of :class:`fastasr.model.streaming.ModelStream` (``Recogniser.stream``): a
chunk of filterbank frames and the caches of the chunks before it in, the chunk's log-probabilities
and the next caches out. Its interface is WeNet's streaming CTC export's, the one sherpa-onnx's
``OnlineRecognizer.from_wenet_ctc`` loads (``sherpa-onnx/csrc/online-wenet-ctc-model.cc``):

* inputs, in this order: ``x`` ``(1, T, F)`` float32 (``T = chunk_size × subsampling_factor +
  dropped`` frames: ``right_context = subsampling_factor - 1 + dropped``, so sherpa-onnx's window
  of ``(chunk_size - 1) × subsampling + right_context + 1`` frames is the chunk's and the
  ``dropped`` frames before it, shifted by a chunk's frames; below),
  ``offset`` ``(1,)`` int64 (``required_cache_size`` + encoder frames given so far),
  ``required_cache_size`` ``(1,)`` int64 (the left context ``L = chunk_size × num_left_chunks``),
  ``att_cache`` ``(num_blocks, head, L, 2 × output_size / head)`` float32 (each layer's keys and
  values of the left context, keys first; rotated when the model has rotary positions),
  ``cnn_cache`` ``(num_blocks, 1, output_size, cnn_module_kernel - 1)`` float32 and
  ``att_mask`` ``(1, 1, L + chunk_size)`` bool (which cache frames hold a frame: the stream's first
  chunks have fewer than ``L`` before them);
* outputs: ``log_probs`` ``(1, chunk_size, V)``, ``r_att_cache``, ``r_cnn_cache`` (the inputs'
  shapes);
* metadata: ``head``, ``num_blocks``, ``output_size``, ``cnn_module_kernel``, ``right_context``,
  ``subsampling_factor``, ``vocab_size`` (what sherpa-onnx reads), ``dropped_frames``, and ``chunk_size`` and
  ``left_chunks`` (what the model streams with here; sherpa-onnx takes them as ``chunk_size`` and
  ``num_left_chunks``, whose defaults 16 and 4 are 0.64 s and 2.56 s at 40 ms a frame).

WeNet's interface and not NeMo's cache-aware one: WeNet's caches are a Conformer's per-layer keys
and values of a fixed left context with a mask of the filled frames, and its convolution module's
last frames, which is :class:`fastasr.model.encoder.LayerStream`; sherpa-onnx feeds WeNet's model
each chunk's frames and the few its ``right_context`` asks for (no pre-encode cache to emulate). What fastasr
keeps besides does not fit WeNet's tensors as they are, so it rides in ``cnn_cache``'s extra
columns: ``cnn_module_kernel - 1`` is the convolution module's ``kernel // 2`` left frames plus
enough columns of layer 0 for the front end's last ``subsampling_factor`` normalised frames (the
subsampling's left context, :class:`ModelStream`'s ``before``) and per-utterance CMVN's running
statistics. sherpa-onnx treats the caches as opaque: it starts them at zeros and feeds each
step's back.

Frames: sherpa-onnx's filterbank centres its frames on the hops with the edges mirrored
(``snip_edges = false``), training's starts its first window at the first sample: at 25 ms windows
and 10 ms hops sherpa-onnx's frame ``t + 1`` lies 2.5 ms after training's frame ``t``, and its
frame 0 has no counterpart. The graph drops the first ``dropped`` frames of each window
(:func:`fastasr.deploy.export.dropped_frames`, 1 at 25/10 ms, as the offline graph drops its
input's first): the stream's first frame, and after it
the frame before each chunk, which sherpa-onnx's window holds because ``right_context`` says so.
The chunks then cover the frames of the PyTorch stream's chunks and the subsampling keeps its
phase (one frame off, every output frame would stand 10 ms from where the model learnt it).
Fed training's frames, a runtime puts ``dropped`` frames before the stream's first
(:class:`fastasr.onnx.streaming.OnnxStream`, :func:`run_stream`). A model trained on sherpa-onnx's
filterbank (``features.snip_edges=false features.high_freq=-400 features.sample_scale=1``) drops none, and
sherpa-onnx's frames are then training's exactly.

Samples: sherpa-onnx computes a WeNet model's filterbank from int16-scaled samples
(``normalize_samples = false``), Kaldi's scale, so for a model trained on it this graph adds no
constant (the offline ``model.onnx`` reads [-1, 1] samples' and adds it:
:class:`fastasr.deploy.export.OnnxCTC`). For a model trained on samples in [-1, 1]
(``features.sample_scale=1``) it takes off ``scale_log`` (:func:`stream_scale_log`, in the metadata),
flooring at Kaldi's floor: exactly that model's frames, since a bin below the floor at one scale
is floored at the other too.

Attention: full attention exports as it is (the chunk's queries over the cache's and its own keys,
masked). The fast attentions cluster or hash the window's queries with host-side control flow
(K-means, sorting, C++ and Triton kernels) that a traced graph cannot hold; they export with full
attention instead, in one warning that names the swap (:func:`fastasr.deploy.export.exported_attention`).
Per-utterance CMVN (``model.utterance_cmvn``) normalises a chunk by the statistics of every frame
up to its end, as the PyTorch stream does: their float64 sums and squares ride in layer 0's extra
columns too, each as two float32 numbers whose sum is the float64 value (the caches are float32 in
sherpa-onnx), and the frame count is the offset's. Batch size 1 (sherpa-onnx runs WeNet's model
one stream at a time).
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fastasr.attention import build_attention
from fastasr.data.features import INT16_SCALE
from fastasr.deploy.export import LOG_FLOOR, OPSET, dropped_frames, exported_attention, tokens_txt
from fastasr.model.chunking import ChunkContext
from fastasr.model.positional import SinusoidalPositionalEncoding, _frequencies
from fastasr.recognition.recogniser import Recogniser
from fastasr.recognition.streaming import chunk_context

log = logging.getLogger(__name__)

__all__ = ["STREAMING_FILE", "STREAMING_INPUTS", "STREAMING_OUTPUTS", "OnnxStreamStep", "StreamingExportResult",
           "dropped_frames", "export_streaming", "streaming_chunk"]

STREAMING_FILE = "model.streaming.onnx"
#: WeNet's streaming CTC export's names, in sherpa-onnx's order.
STREAMING_INPUTS = ("x", "offset", "required_cache_size", "att_cache", "cnn_cache", "att_mask")
STREAMING_OUTPUTS = ("log_probs", "r_att_cache", "r_cnn_cache")
#: The scale of the samples whose filterbank ``x`` is: training's (and sherpa-onnx's for WeNet models).
STREAMING_INPUT_SAMPLES = "[-32768, 32767]"


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def stream_scale_log(sample_scale: float) -> float:
    """``ln((32768 / sample_scale)²)``: how far the filterbank of int16-scaled samples, which the
    streaming graph reads, lies above that of training's ``sample_scale`` (0 for int16's)."""
    return 2.0 * math.log(INT16_SCALE / float(sample_scale))


class OnnxStreamStep(nn.Module):
    """One stream step in WeNet's interface (module docstring); the numbers of
    :class:`fastasr.model.streaming.ModelStream`'s ``_encode`` for a chunk, up to rounding.
    The model must hold an exportable (full) attention and be in eval mode."""

    def __init__(self, model: nn.Module, dropped: int = 0, scale_log: float = 0.0) -> None:
        super().__init__()
        self.model = model
        self.dropped = dropped
        # ln((32768 / training's sample scale)²): what sherpa-onnx's int16-scaled frames hold above
        # training's (0 for Kaldi's int16 scale); the graph takes it off, floored as training floors
        self.scale_log = float(scale_log)
        first = model.encoder.layers[0]
        self.d_model = first.norm1.normalized_shape[0]
        self.heads = first.attn.heads
        self.layers = len(model.encoder.layers)
        self.factor = model.subsampling_factor
        self.feat = model.cmvn.mean.shape[0]
        self.half_kernel = 0 if first.conv is None else first.conv.half_kernel
        # layer 0's extra columns: the front end's last normalised frames, then the per-utterance
        # statistics (sums and squares, each as a float32 pair whose sum is the float64 value)
        self.front_size = self.factor * self.feat if self.factor > 1 else 0
        self.stats_size = 4 * self.feat if model.utterance_cmvn is not None else 0
        self.extra = math.ceil((self.front_size + self.stats_size) / self.d_model)
        self.cache_columns = max(1, self.half_kernel + self.extra)

    @property
    def cnn_module_kernel(self) -> int:
        """The metadata's ``cnn_module_kernel``: one more than ``cnn_cache``'s columns."""
        return self.cache_columns + 1

    def initial_caches(self, left_frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero ``att_cache`` and ``cnn_cache`` for a left context of ``left_frames`` encoder frames."""
        e = self.d_model // self.heads
        return (torch.zeros(self.layers, self.heads, left_frames, 2 * e),
                torch.zeros(self.layers, 1, self.d_model, self.cache_columns))

    def forward(self, x: torch.Tensor, offset: torch.Tensor, required_cache_size: torch.Tensor,
                att_cache: torch.Tensor, cnn_cache: torch.Tensor,
                att_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        model, s, hk, f = self.model, self.factor, self.half_kernel, self.feat
        position = offset[0] - required_cache_size[0]  # encoder frames before the chunk
        packed = cnn_cache[0, 0, :, hk:hk + self.extra].transpose(0, 1).reshape(-1)  # layer 0's extra columns
        kept = []  # what the next step finds there
        x = x[:, self.dropped:]
        if self.scale_log:
            x = (x - self.scale_log).clamp_min(LOG_FLOOR)
        x = model.cmvn(x)
        if self.stats_size:
            x, statistics = self._utterance_cmvn(x, packed[self.front_size:self.front_size + self.stats_size],
                                                 position)
        if s > 1:
            # the front end's left context: the last s normalised frames
            before = packed[:s * f].reshape(1, s, f)
            window = torch.cat([before, x], 1)
            with_before = model.frontend(window, torch.ones_like(window[:, :, 0]).sum(1).to(torch.int64))[0][:, 1:]
            alone = model.frontend(x, torch.ones_like(x[:, :, 0]).sum(1).to(torch.int64))[0]
            sub = torch.where(position == 0, alone, with_before)  # the stream's first chunk has none
            kept.append(window[:, window.shape[1] - s:].reshape(-1))
        else:
            sub = model.frontend(x, torch.ones_like(x[:, :, 0]).sum(1).to(torch.int64))[0]
        if self.stats_size:
            kept.append(statistics)
        front = None
        if kept:
            kept = nn.functional.pad(torch.cat(kept), (0, self.extra * self.d_model - self.front_size - self.stats_size))
            front = kept.reshape(self.extra, self.d_model).transpose(0, 1)
        if model.input_scale != 1.0:
            sub = sub * model.input_scale
        positions = (position + torch.arange(sub.shape[1], device=sub.device)).to(torch.float32)
        if isinstance(model.positions, SinusoidalPositionalEncoding):
            angles = positions[:, None] * _frequencies(self.d_model, sub.device)
            sub = sub + torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2).to(sub.dtype)
        e = self.d_model // self.heads
        rotary = model.encoder.layers[0].attn.rotary
        cos_sin = None
        if rotary is not None:
            angles = positions[:, None] * _frequencies(e, sub.device)
            cos_sin = (angles.cos(), angles.sin())
        mask = att_mask.to(torch.bool)[:, None]  # (1, 1, 1, L + C)
        left = att_cache.shape[2]
        h = sub
        att_out, cnn_out = [], []
        for i, layer in enumerate(model.encoder.layers):
            cache = att_cache[i][None]  # (1, H, L, 2E)
            state = {"k": cache[..., :e], "v": cache[..., e:]}
            if layer.norm_first:
                h = h + self._attend(layer.attn, layer.norm1(h), state, mask, cos_sin, left)
                if layer.conv is not None:
                    conv_left = cnn_cache[i, 0, :, :hk].transpose(0, 1)[None]
                    out, conv_left = layer.conv.stream(layer.norm_conv(h), conv_left)
                    h = h + out
                    conv_cols = conv_left[0].transpose(0, 1)
                else:
                    conv_cols = cnn_cache[i, 0, :, :hk]
                h = h + layer.ff(layer.norm2(h))
            else:
                h = layer.norm1(h + self._attend(layer.attn, h, state, mask, cos_sin, left))
                h = layer.norm2(h + layer.ff(h))
                conv_cols = cnn_cache[i, 0, :, :hk]
            att_out.append(torch.cat([state["k"], state["v"]], -1)[0])
            rest = cnn_cache[i, 0, :, hk:]
            if i == 0 and front is not None:
                rest = torch.cat([front, cnn_cache[i, 0, :, hk + self.extra:]], 1)
            cnn_out.append(torch.cat([conv_cols, rest], 1)[None])
        log_probs = model._log_probs(model.encoder.final_norm(h))
        return log_probs, torch.stack(att_out), torch.stack(cnn_out)

    def _utterance_cmvn(self, x: torch.Tensor, packed: torch.Tensor,
                        position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x (1, T, F)`` normalised by the statistics of every frame up to the chunk's end
        (:class:`fastasr.model.utterance_cmvn.PrefixStatistics`, in float64), and those statistics
        packed for the cache: ``packed`` holds the sums and squares before the chunk as float32
        pairs (high parts, then low parts) that add up to the float64 values. The frames before
        the chunk are ``position × subsampling`` (every earlier chunk was whole)."""
        f = self.feat
        before = packed[:2 * f].to(torch.float64) + packed[2 * f:].to(torch.float64)
        wide = x.to(torch.float64)
        total = before + torch.cat([wide.sum(1)[0], wide.pow(2).sum(1)[0]])
        count = (position * self.factor + x.shape[1]).to(torch.float64)
        mean = total[:f] / count
        std = (total[f:] / count - mean.pow(2)).clamp_min(0).sqrt().clamp_min(self.model.utterance_cmvn.min_std)
        high = total.to(torch.float32)
        low = (total - high.to(torch.float64)).to(torch.float32)
        return ((wide - mean) / std).to(x.dtype), torch.cat([high, low])

    def _attend(self, attn: nn.Module, x: torch.Tensor, state: dict[str, torch.Tensor], mask: torch.Tensor,
                cos_sin: tuple[torch.Tensor, torch.Tensor] | None, left: int) -> torch.Tensor:
        """Full attention of the chunk's queries over the cached and the chunk's keys (cached
        frames not yet filled masked out); ``state`` takes the last ``left`` keys and values."""
        q = attn._split(attn.q_proj(x))
        k = q if attn.k_proj is None else attn._split(attn.k_proj(x))
        v = attn._split(attn.v_proj(x))
        if cos_sin is not None:
            q, k = _rotate(q, *cos_sin), _rotate(k, *cos_sin)
        keys = torch.cat([state["k"], k], 2)
        values = torch.cat([state["v"], v], 2)
        scores = torch.matmul(q, keys.transpose(-1, -2)) * q.shape[-1] ** -0.5
        scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.matmul(scores.softmax(-1), values)
        state["k"], state["v"] = keys[:, :, keys.shape[2] - left:], values[:, :, values.shape[2] - left:]
        b, h, n, e = out.shape
        return attn.dropout(attn.out_proj(out.transpose(1, 2).reshape(b, n, h * e)))


def streaming_chunk(recogniser: Recogniser, chunk: float = 0.64, left: float | str = "auto") -> ChunkContext:
    """The chunk context the export writes (:func:`fastasr.recognition.streaming.chunk_context`);
    the left context must be bounded (sherpa-onnx's cache has a fixed length)."""
    context = chunk_context(recogniser, chunk, left)
    if context.left_frames is None:
        raise ValueError("streaming export: left=all; the streaming graph's cache holds a bounded left context "
                         "(left=SECONDS or auto)")
    return context


def step_mask(position: int, left_frames: int, size: int) -> torch.Tensor:
    """``att_mask`` for a chunk of ``size`` frames after ``position`` encoder frames: the cache's
    last ``min(position, left_frames)`` frames and the chunk's (sherpa-onnx's rule)."""
    mask = torch.ones(1, 1, left_frames + size, dtype=torch.bool)
    mask[..., :max(0, left_frames - position)] = False
    return mask


@dataclass
class StreamingExportResult:
    """What :func:`export_streaming` wrote, the attention the graph holds (``swapped``: why it is
    not the trained one, or None) and its chunk context."""

    out: Path
    files: list[str]
    attention: str
    swapped: str | None
    chunk_size: int
    left_chunks: int
    max_abs_diff: float | None = None


def export_streaming(recogniser: Recogniser, out: str | os.PathLike, *, chunk: float = 0.64,
                     left: float | str = "auto", source: str = "", check: bool = True) -> StreamingExportResult:
    """Write ``model.streaming.onnx`` (module docstring) and ``tokens.txt`` into ``out``, and a
    ``streaming`` entry into its ``recogniser.json`` when there is one. ``chunk`` / ``left``:
    seconds (:func:`streaming_chunk`), written as the metadata's ``chunk_size`` / ``left_chunks``.
    ``check``: step the graph in onnxruntime over a random utterance against the PyTorch stream
    and record the largest log-probability difference. The recogniser's model is left as it was."""
    model = recogniser.model
    if model is None:
        raise ValueError("export_streaming: the recogniser has no model loaded (load_recogniser(ckpt_path))")
    context = streaming_chunk(recogniser, chunk, left)
    inners, training = [layer.inner for layer in model.attention_layers()], model.training
    try:
        return _export(recogniser, Path(out), context, source, check)
    finally:
        for layer, inner in zip(model.attention_layers(), inners):
            layer.inner = inner
        model.train(training)


def _export(recogniser: Recogniser, out: Path, context: ChunkContext, source: str,
            check: bool) -> StreamingExportResult:
    out.mkdir(parents=True, exist_ok=True)
    model = recogniser.model
    trained = build_attention(recogniser.attention).spec
    attention, swapped = exported_attention(recogniser.attention)
    if swapped:
        log.warning("streaming export: %s", swapped)
    model.set_attention(attention)
    model.eval()
    step = OnnxStreamStep(model, dropped_frames(recogniser.features),
                          stream_scale_log(recogniser.features.sample_scale)).eval()
    size, left = context.size, context.left_frames
    example = example_inputs(step, size, left, position=size)
    path = out / STREAMING_FILE
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            step, example, str(path), input_names=list(STREAMING_INPUTS), output_names=list(STREAMING_OUTPUTS),
            dynamic_axes={"x": {1: "T"}, "att_cache": {2: "L"}, "att_mask": {2: "L_plus_C"},
                          "log_probs": {1: "C"}, "r_att_cache": {2: "L"}},
            opset_version=OPSET, dynamo=False)
    meta = {
        "model_type": "fastasr_ctc_streaming", "model_author": "fastasr", "attention": attention,
        "trained_attention": trained, "head": step.heads, "num_blocks": step.layers, "output_size": step.d_model,
        "cnn_module_kernel": step.cnn_module_kernel, "right_context": step.factor - 1 + step.dropped,
        "dropped_frames": step.dropped, "scale_log": step.scale_log,
        "subsampling_factor": step.factor, "subsampling_rate": step.factor, "vocab_size": recogniser.vocab_size,
        "chunk_size": size, "left_chunks": context.left_chunks, "feature_size": step.feat,
        "sample_rate": recogniser.features.sample_rate, "input_samples": STREAMING_INPUT_SAMPLES,
    }
    _write_metadata(path, meta)
    (out / "tokens.txt").write_text(tokens_txt(recogniser), encoding="utf-8")
    files = [STREAMING_FILE, "tokens.txt"]
    info = out / "recogniser.json"
    if info.is_file():
        state = json.loads(info.read_text(encoding="utf-8"))
        state["streaming"] = {"model": STREAMING_FILE, "inputs": list(STREAMING_INPUTS),
                              "outputs": list(STREAMING_OUTPUTS), "input_samples": STREAMING_INPUT_SAMPLES,
                              "attention": attention, "swapped": swapped, "chunk_size": size,
                              "left_chunks": context.left_chunks, "source": source}
        info.write_text(json.dumps(state, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    result = StreamingExportResult(out, files, attention, swapped, size, context.left_chunks)
    if check:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        generator = torch.Generator().manual_seed(0)
        frames = torch.randn(size * step.factor * 7 + 3, step.feat, generator=generator) * 3.0 + 9.0
        with torch.no_grad():
            stream = model.start_stream(context)
            expected = stream.accept(frames)
        got = run_stream(session, frames.numpy(), size, left, step)
        result.max_abs_diff = float((torch.from_numpy(got) - expected).abs().max())
    return result


def example_inputs(step: OnnxStreamStep, size: int, left: int, position: int = 0) -> tuple[torch.Tensor, ...]:
    """Inputs of one step: random frames of a chunk, zero caches, the offset and mask at ``position``."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(1, size * step.factor + step.dropped, step.feat, generator=generator) * 3.0 + 9.0
    att_cache, cnn_cache = step.initial_caches(left)
    return (x, torch.tensor([left + position], dtype=torch.int64), torch.tensor([left], dtype=torch.int64),
            att_cache, cnn_cache, step_mask(position, left, size))


def run_stream(session: Any, frames: Any, size: int, left: int, step: OnnxStreamStep | None = None,
               *, layers: int | None = None, heads: int | None = None, d_model: int | None = None,
               cache_columns: int | None = None, factor: int | None = None, dropped: int | None = None,
               scale_log: float | None = None) -> Any:
    """Step ``session`` (an onnxruntime session of the graph) over training's ``frames (T, F)``
    (numpy) chunk by chunk as sherpa-onnx does, complete chunks only, ``dropped`` zero frames put
    before them and ``scale_log`` added, which the graph takes off (module docstring): their
    log-probabilities ``(T', V)``."""
    import numpy as np

    if step is not None:
        layers, heads, d_model, cache_columns, factor, dropped, scale_log = (
            step.layers, step.heads, step.d_model, step.cache_columns, step.factor, step.dropped, step.scale_log)
    dropped = dropped or 0
    frames = np.concatenate([np.zeros((dropped, frames.shape[1]), frames.dtype), frames + (scale_log or 0.0)])
    att = np.zeros((layers, heads, left, 2 * d_model // heads), np.float32)
    cnn = np.zeros((layers, 1, d_model, cache_columns), np.float32)
    out, position, shift = [], 0, size * factor
    for start in range(0, frames.shape[0] - shift - dropped + 1, shift):
        mask = step_mask(position, left, size).numpy()
        log_probs, att, cnn = session.run(list(STREAMING_OUTPUTS), {
            "x": np.ascontiguousarray(frames[None, start:start + shift + dropped], dtype=np.float32),
            "offset": np.array([left + position], np.int64), "required_cache_size": np.array([left], np.int64),
            "att_cache": att, "cnn_cache": cnn, "att_mask": mask})
        out.append(log_probs[0])
        position += log_probs.shape[1]
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def _write_metadata(path: Path, meta: dict[str, Any]) -> None:
    import onnx

    model = onnx.load(str(path))
    for key, value in meta.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, str(value)
    onnx.save(model, str(path))
