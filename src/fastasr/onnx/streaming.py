"""``model.streaming.onnx`` (:mod:`fastasr.deploy.streaming_export`) stepped by onnxruntime, without
PyTorch: :class:`OnnxStream` feeds training's filterbank frames chunk by chunk (one frame put
before the stream's first, which the graph drops in place of sherpa-onnx's), as sherpa-onnx's online
recogniser does, and returns each complete chunk's log-probabilities, and ``finish`` those of the
frames left as a last, shorter chunk (the PyTorch stream's, ``Recogniser.stream``, with the same
chunks: ``chunk_size`` and ``left_chunks`` in the metadata)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from fastasr.decoding.windows import output_frames

__all__ = ["OnnxStream"]


class OnnxStream:
    """One stream through the graph at ``path``. ``accept(frames (T, F))`` → the ``(T', V)``
    log-probabilities of the chunks the frames completed (``T'`` may be 0); ``finish()`` → those of
    the frames left (``ModelStream.finish``'s). ``chunk_size`` /
    ``left_chunks``: encoder frames a chunk and chunks of left context (default: the metadata's)."""

    def __init__(self, path: str | os.PathLike, chunk_size: int | None = None, left_chunks: int | None = None,
                 session: Any = None) -> None:
        import onnxruntime

        self.session = session or onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        meta = self.session.get_modelmeta().custom_metadata_map
        self.size = int(chunk_size if chunk_size is not None else meta["chunk_size"])
        self.left = self.size * int(left_chunks if left_chunks is not None else meta["left_chunks"])
        self.factor = int(meta["subsampling_factor"])
        # the frames the graph drops at each window's start (fastasr.deploy.streaming_export): a
        # window is a chunk's and as many before it, the stream's first put before its first frame
        self.dropped = int(meta["right_context"]) - (self.factor - 1)
        self.vocab = int(meta["vocab_size"])
        # what the graph takes off its int16-scaled input to make training's frames (0 for int16-scaled training)
        self.scale_log = np.float32(float(meta.get("scale_log", 0.0)))
        layers, heads, d = int(meta["num_blocks"]), int(meta["head"]), int(meta["output_size"])
        self.att = np.zeros((layers, heads, self.left, 2 * d // heads), np.float32)
        self.cnn = np.zeros((layers, 1, d, int(meta["cnn_module_kernel"]) - 1), np.float32)
        self.pending: np.ndarray | None = None
        self.position = 0  # encoder frames given so far

    def accept(self, frames: np.ndarray) -> np.ndarray:
        frames = np.asarray(frames, np.float32) + self.scale_log
        if self.pending is None:
            self.pending = np.zeros((self.dropped, frames.shape[-1]), np.float32)
        self.pending = np.concatenate([self.pending, frames])
        shift, out = self.size * self.factor, []
        while self.pending.shape[0] >= shift + self.dropped:
            out.append(self._step(self.pending[:shift + self.dropped]))
            self.pending = self.pending[shift:]
        return np.concatenate(out) if out else np.zeros((0, self.vocab), np.float32)

    def finish(self) -> np.ndarray:
        """The log-probabilities of the frames not yet encoded, as a last chunk shorter than the others."""
        rest, self.pending = self.pending, None
        if rest is None or rest.shape[0] <= self.dropped:
            return np.zeros((0, self.vocab), np.float32)
        return self._step(rest, output_frames(rest.shape[0] - self.dropped, self.factor))

    def _step(self, chunk: np.ndarray, size: int | None = None) -> np.ndarray:
        mask = np.ones((1, 1, self.left + (size or self.size)), bool)
        mask[..., :max(0, self.left - self.position)] = False
        log_probs, self.att, self.cnn = self.session.run(["log_probs", "r_att_cache", "r_cnn_cache"], {
            "x": np.ascontiguousarray(chunk[None]), "offset": np.array([self.left + self.position], np.int64),
            "required_cache_size": np.array([self.left], np.int64), "att_cache": self.att, "cnn_cache": self.cnn,
            "att_mask": mask})
        self.position += log_probs.shape[1]
        return log_probs[0]
