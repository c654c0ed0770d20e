"""A trained recogniser as a folder that runs without PyTorch: ONNX models, units, features, lexicon, LM.

:func:`export_recogniser` writes, for a checkpoint's :class:`~fastasr.recognition.recogniser.Recogniser`:

* ``model.onnx``: filterbank features ``x`` ``(N, T, F)`` float32 and their lengths ``x_lens``
  ``(N,)`` int64 in; log-probabilities ``log_probs`` ``(N, T', V)`` float32 and their lengths
  ``log_probs_len`` ``(N,)`` int64 out. ``x`` is Kaldi's filterbank of samples in [-1, 1], the
  scale of sherpa-onnx's default one (:data:`INPUT_SAMPLES`; training's, of int16-scaled samples,
  is a constant higher, which the graph adds: :class:`OnnxCTC`; nothing for a model trained on
  samples in [-1, 1], ``features.sample_scale=1``). The model's own global and
  per-utterance CMVN and its subsampling are inside; the batch and time axes are dynamic;
  sinusoidal and rotary positions are computed in the graph for any length (no table cut at a
  maximum). The input and output names are icefall's CTC export's, so sherpa-onnx's offline CTC
  recogniser loads it by its public ``OfflineRecognizer.from_zipformer_ctc`` with its default
  features (docs/DEPLOY.md says what they change). ``x``'s frames are on sherpa-onnx's grid too:
  centred on the hops, the edges mirrored (``snip_edges = false``), where training's first window
  starts at the first sample. At 25 ms windows and 10 ms hops sherpa-onnx's frame ``t + 1`` lies
  2.5 ms after training's frame ``t`` and its frame 0 has no counterpart, so the graph drops the
  first :func:`dropped_frames` frames (``x_lens`` less as many): the subsampling keeps the phase
  the model trained with (one frame off, every output frame would stand 10 ms from where the model
  learnt it). A runtime feeding training's frames puts as many before them
  (:meth:`fastasr.onnx.onnx_recogniser.OnnxRecogniser.run`). A model trained on sherpa-onnx's
  filterbank (``features.snip_edges=false features.high_freq=-400``) drops none: sherpa-onnx
  then computes training's frames exactly, and its words are fastasr's
  (:func:`sherpa_onnx_differences`, which the export logs and records).
* ``model.int8.onnx``: the same graph with the weights of its matrix products quantised to int8
  by onnxruntime's dynamic quantisation (activations quantised per call; :data:`INT8_OPS`).
* ``tokens.txt``: ``symbol id`` per line, sherpa-onnx's unit table (``<blk>`` for the blank, ``▁``
  for the word boundary ``|``; a phoneme model's phonemes as ``▁PH``, so that sherpa-onnx's text
  is the phonemes separated by spaces).
* ``recogniser.json``: :meth:`Recogniser.to_dict` (units, features, lexicon; the LM as a path)
  plus ``export``: the attention exported, the input and output names, the scale of the samples
  the input filterbank is of (``input_samples``), the frames the graph drops (``dropped_frames``),
  where training's filterbank differs from sherpa-onnx's default one (``sherpa_onnx_differences``),
  the subsampling factor, the seconds per output frame, the opset and the checkpoint it came from.
* ``lm.arpa``: the word LM the checkpoint carries, when it carries one.

Full attention exports as it is (its key-mask path, one graph for every length). The fast
attentions (clustered, i-clustered, LSH, top-k, and ``auto``, which switches between full and
i-clustered by length) decide with data-dependent control flow on the host — K-means iteration
counts, sorting and gathering by cluster, C++ and Triton kernels — that an ONNX graph cannot hold
as one exact computation; they export with the attention swapped to full, the swap
``evaluate.py attention=full`` and the approximation matrix measure (:data:`SWAP_NOTE`). What the
committed matrices measured for it ships with the package, in ``swap_costs.json`` beside this
module (:func:`swap_costs`; generated from ``docs/results/*/matrix.csv`` by
:func:`write_swap_costs`, and a test holds the two equal); this module reads no docs.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fastasr.attention import build_attention
from fastasr.onnx.filterbank import KALDI_FEATURES, SHERPA_ONNX_FEATURES
from fastasr.recognition.recogniser import Recogniser

log = logging.getLogger(__name__)

__all__ = ["ExportResult", "OnnxCTC", "dropped_frames", "export_recogniser", "exported_attention", "INPUT_NAMES",
           "OUTPUT_NAMES", "sherpa_onnx_differences"]

#: The graph's inputs and outputs (icefall's CTC export's names, which sherpa-onnx reads by position).
INPUT_NAMES = ("x", "x_lens")
OUTPUT_NAMES = ("log_probs", "log_probs_len")
#: The ONNX opset the graph is written in.
OPSET = 17
#: The operators whose weights ``model.int8.onnx`` holds in int8: the matrix products. onnxruntime's
#: integer convolutions (``ConvInteger``) are slower on a CPU than its float ones: with them the
#: built-in model ran slower than fp32 on a 2-core CPU (a trial without a raw file), without them
#: faster (docs/results/export/RESULTS.md).
INT8_OPS = ("MatMul",)
#: The attentions that export as they are.
EXPORTABLE = ("full",)
#: What the swap to full attention costs, and where it is measured.
SWAP_NOTE = ("the fast attentions choose clusters and keys with host-side control flow that an ONNX graph cannot "
             "hold; exported with full attention instead: the same weights, the swap the approximation matrix "
             "measures (docs/MATRIX.md; evaluate.py ckpt_path=... attention=full gives this model's number)")
#: Sherpa-onnx's name of the blank, and its word-start mark (shown as a space in its text).
SHERPA_BLANK, SHERPA_WORD_START = "<blk>", "\u2581"


#: The scale of the samples whose filterbank the graph reads: sherpa-onnx's default (lhotse's and
#: icefall's). Training's (``fastasr.data.features.Fbank``) scales them to int16 first, which adds
#: ``2 ln 32768`` to every log-mel energy: the graph adds it back (:class:`OnnxCTC`).
INPUT_SAMPLES = "[-1, 1]"
#: What int16-scaled samples add to a log-mel energy: ``ln(32768²)``.
SAMPLE_SCALE_LOG = 2.0 * math.log(32768.0)
#: The log of the floor Kaldi's filterbank puts under a mel energy (float32's epsilon): every bin
#: of a frame of digital silence, at either sample scale.
LOG_FLOOR = math.log(float(torch.finfo(torch.float32).eps))


def dropped_frames(features: Any) -> int:
    """Frames a graph drops at the start of its input (module docstring): how many hops
    sherpa-onnx's first frame centre lies before training's, rounded (1 at 25 ms windows and 10 ms
    hops; 0 for a model trained on sherpa-onnx's grid, ``snip_edges`` False). ``features``:
    anything with ``frame_length_ms``, ``frame_shift_ms`` and, optionally, ``snip_edges``."""
    if not getattr(features, "snip_edges", True):
        return 0
    return max(0, round((features.frame_length_ms - features.frame_shift_ms) / (2 * features.frame_shift_ms)))


def sherpa_onnx_differences(features: Any) -> list[str]:
    """The settings in which training's filterbank differs from sherpa-onnx's default one
    (:data:`fastasr.onnx.filterbank.SHERPA_ONNX_FEATURES`), as ``key=training's (sherpa-onnx: its)``;
    none: sherpa-onnx computes training's frames and its words are fastasr's. ``features``:
    anything with ``snip_edges``, ``high_freq`` and ``sample_scale`` (Kaldi's defaults where absent)."""
    return [f"{key}={getattr(features, key, KALDI_FEATURES[key])} (sherpa-onnx: {value})"
            for key, value in SHERPA_ONNX_FEATURES.items() if getattr(features, key, KALDI_FEATURES[key]) != value]


def log_sherpa_onnx_features(features: Any) -> list[str]:
    """:func:`sherpa_onnx_differences`, said in one log line (what an export says of sherpa-onnx)."""
    differences = sherpa_onnx_differences(features)
    if differences:
        log.info("sherpa-onnx's default filterbank differs from training's in %s: its words come near fastasr's, "
                 "not equal (docs/DEPLOY.md); train with features.snip_edges=false "
                 "features.high_freq=-400 features.sample_scale=1 for the same words", ", ".join(differences))
    else:
        log.info("sherpa-onnx's default filterbank is training's: its words are fastasr's")
    return differences


class OnnxCTC(nn.Module):
    """The exported computation: ``(x (N, T, F), x_lens (N,))`` → ``(log_probs (N, T', V), log_probs_len (N,))``,
    lengths as int64. ``x``: log-mel filterbanks of samples in [-1, 1] (:data:`INPUT_SAMPLES`) on
    sherpa-onnx's frame grid; the graph drops each utterance's first ``dropped`` frames (its length
    less as many, at least one frame left; ``T`` kept by padding at the end) and adds
    ``scale_log`` (:data:`SAMPLE_SCALE_LOG` for training's int16-scaled samples; 0, nothing, for a
    model trained on samples in [-1, 1], ``features.sample_scale=1``) to make them training's, except
    to a frame whose every bin is at the floor (:data:`LOG_FLOOR`: digital silence, which training's
    filterbank floors too). A frame, not a bin: training's filterbank less the constant (what the
    runtime feeds) may put a single bin near the floor, never a whole frame. A bin below the floor
    in the [-1, 1] filterbank but not in training's cannot be restored: sherpa-onnx's offline
    filterbank floors near-silent bins that int16-scaled training keeps."""

    def __init__(self, model: nn.Module, dropped: int = 0, scale_log: float = SAMPLE_SCALE_LOG) -> None:
        super().__init__()
        self.model = model
        self.dropped = dropped
        self.scale_log = float(scale_log)  # ln(sample_scale²): 0 for a model trained on samples in [-1, 1]

    def forward(self, x: torch.Tensor, x_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.dropped:
            x = nn.functional.pad(x[:, self.dropped:], (0, 0, 0, self.dropped))
            x_lens = (x_lens - self.dropped).clamp_min(1)
        if self.scale_log:
            silent = (x - LOG_FLOOR).abs().amax(dim=-1, keepdim=True) < 1e-4
            x = torch.where(silent, x, x + self.scale_log)
        log_probs, lengths = self.model(x, x_lens)
        return log_probs, lengths.to(torch.int64)


def exported_attention(trained: str | dict[str, Any]) -> tuple[str, str | None]:
    """``(attention spec the graph holds, why it is not the trained one or None)`` for a model
    trained with ``trained``."""
    inner = build_attention(trained)
    if inner.name in EXPORTABLE:
        return inner.spec, None
    costs = swap_costs(inner.spec)
    return "full", f"attention {inner.spec}: {SWAP_NOTE}" + (f"; the matrix measured: {'; '.join(costs)}" if costs
                                                              else "")


#: The swap's costs the package ships: :func:`matrix_swap_costs` of the committed matrices.
SWAP_COSTS_FILE = Path(__file__).with_name("swap_costs.json")


def matrix_swap_costs(results: str | os.PathLike) -> list[dict[str, Any]]:
    """For every ``<matrix>/matrix.csv`` under ``results`` (the repository's ``docs/results``) and
    every attention it trained with both its own and full attention decoded: ``{"matrix",
    "trained", "metric", "own", "full"}`` (the error rates in percent, rounded to 4 places)."""
    costs = []
    for table in sorted(Path(results).glob("*/matrix.csv")):
        with open(table, encoding="utf-8", newline="") as f:
            cells = {(r["train"], r["eval"]): r for r in csv.DictReader(f) if r.get("status") == "ok"}
        for (trained, decoded), own in sorted(cells.items()):
            full = cells.get((trained, "full"))
            if decoded != trained or trained == "full" or full is None:
                continue
            metric = "per" if own.get("per") else "cer"
            costs.append({"matrix": table.parent.name, "trained": trained, "metric": metric,
                          "own": round(float(own[metric]), 4), "full": round(float(full[metric]), 4)})
    return costs


def write_swap_costs(results: str | os.PathLike, path: str | os.PathLike = SWAP_COSTS_FILE) -> None:
    """Write :func:`matrix_swap_costs` of ``results`` to ``path`` (the package's ``swap_costs.json``):
    run after a matrix's result is committed,
    ``python -c "from fastasr.deploy.export import write_swap_costs; write_swap_costs('docs/results')"``."""
    Path(path).write_text(json.dumps(matrix_swap_costs(results), indent=1) + "\n", encoding="utf-8")


def swap_costs(trained: str, costs: list[dict[str, Any]] | None = None) -> list[str]:
    """What the approximation matrices measured for a model trained with ``trained`` and decoded
    with full attention, against decoding with its own: one line a matrix, e.g. ``matrix-long:
    PER 25.10 with i-clustered-100, 24.87 with full (-0.23 points)``. Empty where no matrix trained
    it. ``costs``: :func:`matrix_swap_costs`' entries; by default the package's
    (:data:`SWAP_COSTS_FILE`)."""
    if costs is None:
        costs = json.loads(SWAP_COSTS_FILE.read_text(encoding="utf-8"))
    return [f"{c['matrix']}: {c['metric'].upper()} {c['own']:.2f} with {trained}, {c['full']:.2f} with full "
            f"({c['full'] - c['own']:+.2f} points)" for c in costs if c["trained"] == trained]


@dataclass
class ExportResult:
    """What :func:`export_recogniser` wrote: the folder, its files, and the attention the graph
    holds (``swapped``: why it is not the trained one, or None)."""

    out: Path
    files: list[str]
    attention: str
    trained_attention: str
    swapped: str | None
    max_abs_diff: float | None = None


def tokens_txt(recogniser: Recogniser) -> str:
    """sherpa-onnx's ``tokens.txt`` of the recogniser's units (module docstring)."""
    tok = recogniser.tokenizer
    lines = []
    for i, unit in enumerate(tok.vocab):
        if i == tok.blank_id:
            symbol = SHERPA_BLANK
        elif unit == tok.word_boundary:
            symbol = SHERPA_WORD_START if tok.kind != "phoneme" else SHERPA_WORD_START + unit
        elif tok.kind == "phoneme":
            symbol = SHERPA_WORD_START + unit
        else:
            symbol = unit
        if not symbol or any(c.isspace() for c in symbol):
            raise ValueError(f"unit {i} ({unit!r}) has no sherpa-onnx symbol: tokens.txt takes units without spaces")
        lines.append(f"{symbol} {i}\n")
    return "".join(lines)


def _example(recogniser: Recogniser, lengths: tuple[int, ...] = (160, 97)) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded utterances of random filterbank frames of ``lengths`` (lengths that differ, so the
    padding mask is traced)."""
    generator = torch.Generator().manual_seed(len(lengths))
    x = torch.randn(len(lengths), max(lengths), recogniser.feat_in, generator=generator) * 3.0 - 10.0
    return x, torch.tensor(lengths, dtype=torch.int64)


#: The batches :func:`export_recogniser` checks the graph on: the traced shape, and another batch
#: size and a length over six times the traced one (dynamic axes, positions past the example's).
CHECK_LENGTHS = ((160, 97), (1003, 640, 31))


def max_difference(wrapper: nn.Module, session: Any, recogniser: Recogniser) -> float:
    """The largest absolute difference between PyTorch's and onnxruntime's log-probabilities over
    the valid frames of :data:`CHECK_LENGTHS`' batches."""
    worst = 0.0
    for lengths in CHECK_LENGTHS:
        x, x_lens = _example(recogniser, lengths)
        with torch.no_grad():
            expected, out_lengths = wrapper(x, x_lens)
        got = session.run([OUTPUT_NAMES[0]], {INPUT_NAMES[0]: x.numpy(), INPUT_NAMES[1]: x_lens.numpy()})[0]
        for b, n in enumerate(out_lengths.tolist()):
            worst = max(worst, float((torch.from_numpy(got[b, :n]) - expected[b, :n]).abs().max()))
    return worst


def export_recogniser(recogniser: Recogniser, out: str | os.PathLike, *, source: str = "", int8: bool = True,
                      check: bool = True) -> ExportResult:
    """Write ``recogniser`` (with its model loaded) to the folder ``out`` (module docstring).

    ``check``: run the example batch through PyTorch and onnxruntime and record the largest
    absolute difference of the log-probabilities (``ExportResult.max_abs_diff``). The graph holds
    the whole-recording (full-context) computation: a model trained with chunks (``model.streaming``)
    says so in one warning (:func:`full_context_note`). The caller's recogniser is left as it was:
    its attention, train or eval mode and chunked decoding context are put back afterwards.

    Raises:
        ValueError: the recogniser has no model, or a unit has no sherpa-onnx symbol.
    """
    model = recogniser.model
    if model is None:
        raise ValueError("export_recogniser: the recogniser has no model loaded (load_recogniser(ckpt_path))")
    note = full_context_note(model)
    if note:
        log.warning("%s", note)
    inners, training, context = [layer.inner for layer in model.attention_layers()], model.training, model.decoding_context
    model.set_decoding_context(None)
    try:
        return _export(recogniser, out, source, int8, check)
    finally:
        for layer, inner in zip(model.attention_layers(), inners):
            layer.inner = inner
        model.train(training)
        model.set_decoding_context(context)


def full_context_note(model: nn.Module) -> str | None:
    """The line :func:`export_recogniser` warns with for a model trained with chunks, or None."""
    chunks = getattr(model, "chunk_training", None)
    if chunks is None:
        return None
    left = "all" if chunks.left_frames is None else f"{chunks.left_frames}"
    return (f"the model trained with chunks (model.streaming: chunk_sizes {list(chunks.chunk_sizes)}, left_frames "
            f"{left} encoder frames) exports as a full-context graph: it decodes each window whole, as "
            "fastasr-transcribe does, not chunk by chunk as Recogniser.stream does")


def _export(recogniser: Recogniser, out: str | os.PathLike, source: str, int8: bool, check: bool) -> ExportResult:
    """:func:`export_recogniser`'s work; it changes the model's attention and mode, which its caller puts back."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    trained = build_attention(recogniser.attention).spec  # what recogniser.json records
    attention, swapped = exported_attention(recogniser.attention)
    model = recogniser.model
    model.set_attention(attention)
    model.eval()
    dropped = dropped_frames(recogniser.features)
    wrapper = OnnxCTC(model, dropped, 2.0 * math.log(recogniser.features.sample_scale)).eval()
    example = _example(recogniser, CHECK_LENGTHS[0])
    onnx_path = out / "model.onnx"
    # TorchScript tracing (dynamo=False): the shape checks of the attention run on the example
    # and stay out of the graph; every tensor computation, the masks from x_lens included, is traced
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        # the dropped frames' slice ends at the dynamic length, which the exporter says it cannot fold
        warnings.filterwarnings("ignore", message="Constant folding - Only steps=1")
        torch.onnx.export(
            wrapper, example, str(onnx_path), input_names=list(INPUT_NAMES), output_names=list(OUTPUT_NAMES),
            dynamic_axes={"x": {0: "N", 1: "T"}, "x_lens": {0: "N"}, "log_probs": {0: "N", 1: "T_out"},
                          "log_probs_len": {0: "N"}},
            opset_version=OPSET, dynamo=False,
        )
    _add_metadata(onnx_path, recogniser, attention, dropped)
    files = ["model.onnx"]
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quiet = logging.getLogger()  # onnxruntime suggests a pre-processing pass on the root logger
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            quantize_dynamic(str(onnx_path), str(out / "model.int8.onnx"), weight_type=QuantType.QInt8,
                             op_types_to_quantize=list(INT8_OPS))
        finally:
            quiet.setLevel(level)
        files.append("model.int8.onnx")
    (out / "tokens.txt").write_text(tokens_txt(recogniser), encoding="utf-8")
    files.append("tokens.txt")
    state = recogniser.to_dict()
    lm = state.get("lm")
    if lm is not None:
        text = lm.get("arpa")
        if text is None and Path(lm["path"]).is_file():
            shutil.copyfile(lm["path"], out / "lm.arpa")
        elif text is not None:
            (out / "lm.arpa").write_text(text, encoding="utf-8")
        state["lm"] = {**{k: v for k, v in lm.items() if k != "arpa"}, "path": "lm.arpa"}
        files.append("lm.arpa")
    state["export"] = {
        "attention": attention, "trained_attention": trained, "swapped": swapped,
        "inputs": list(INPUT_NAMES), "outputs": list(OUTPUT_NAMES), "input_samples": INPUT_SAMPLES,
        "dropped_frames": dropped, "sherpa_onnx_differences": log_sherpa_onnx_features(recogniser.features),
        "opset": OPSET,
        "subsampling": recogniser.subsampling, "frame_seconds": recogniser.frame_seconds,
        "source": source, "int8": int8,
    }
    (out / "recogniser.json").write_text(json.dumps(state, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    files.append("recogniser.json")
    result = ExportResult(out, files, attention, trained, swapped)
    if check:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        result.max_abs_diff = max_difference(wrapper, session, recogniser)
    return result


def _add_metadata(path: Path, recogniser: Recogniser, attention: str, dropped: int) -> None:
    """The model's metadata (``onnx`` ``metadata_props``): what a runtime needs besides the
    graph, for tools that read only the ONNX file (sherpa-onnx prints them with ``debug``)."""
    import onnx

    model = onnx.load(str(path))
    features = recogniser.features
    meta = {
        "model_type": "fastasr_ctc", "model_author": "fastasr", "attention": attention,
        "vocab_size": recogniser.vocab_size, "subsampling_factor": recogniser.subsampling,
        "sample_rate": features.sample_rate, "feature_dim": features.num_mel_bins,
        "frame_length_ms": features.frame_length_ms, "frame_shift_ms": features.frame_shift_ms,
        "input_samples": INPUT_SAMPLES, "dropped_frames": dropped, "units": recogniser.tokenizer.kind,
    }
    for key, value in meta.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, str(value)
    onnx.save(model, str(path))
