"""Training batches padded to a small fixed set of shapes (``data.batch_shapes``).

A captured training step (:mod:`fastasr.training.captured_step`) replays one CUDA graph per
input shape, so a run whose every batch has its own ``(utterances, frames)`` would capture
a graph a batch. With batch shapes on, the training lengths are cut into ``data.shape_buckets``
buckets holding equal shares of the audio; bucket ``i`` has an upper length ``frames_i``
(rounded up to a multiple of :data:`FRAME_MULTIPLE`) and a count ``utterances_i``: as many
utterances of ``frames_i`` frames as the batch budget prices (``sampler.price``), capped by
``data.max_batch_size``. The sampler cuts each batch inside one bucket, priced at its upper
length (:class:`fastasr.data.sampler.FrameBudgetBatchSampler` ``shapes``), and
:class:`ShapedCollate` pads it to that bucket's ``(utterances_i, frames_i)``: frames with
zeros past each utterance's length, the missing utterances as empty rows (length 0, no
targets). A run then sees at most ``data.shape_buckets`` shapes.

Padding changes no number the loss is made of: every module masks the frames past an
utterance's length (CMVN, subsampling, convolution, every attention of the registry:
``fastasr.attention.masking``), an empty row attends finitely and outputs zeros
(``tests/test_attention_padding.py``), its CTC loss over no frames and no labels is 0, and the
loss divides by the real utterances (``batch["utterances"]``,
:meth:`fastasr.training.lit.ASRLitModule._ctc`), so the loss and every parameter's gradient
are those of the unpadded batch. What differs is the random draws of dropout and SpecAugment,
whose shapes grow with the batch: the same distribution, other masks.

A speed-perturbed utterance is never longer than the length the sampler planned with (its
fastest version's), and a bucket's count never grows with its length, so the bucket of a
batch's actual longest utterance always holds its utterances.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from fastasr.data.dataset import collate
from fastasr.data.sampler import price

log = logging.getLogger(__name__)

#: A bucket's upper length is rounded up to a multiple of this many frames (tensor-core tiles,
#: and every subsampling factor of the front end divides it).
FRAME_MULTIPLE = 16

#: The batch key of a padded batch's real utterance count (host int): the loss's divisor.
UTTERANCES_KEY = "utterances"


@dataclass(frozen=True)
class BatchShape:
    """One fixed batch shape: ``utterances`` rows of ``frames`` frames."""

    utterances: int
    frames: int


class BatchShapes:
    """The buckets of a run's training batches and the shape each is padded to.

    Args:
        bounds: each bucket's upper length in frames, increasing.
        max_frames: the batch budget (priced frames).
        max_batch_size: a cap on utterances a batch (None: none).
        length_cost, quadratic_frames: the sampler's pricing (:func:`fastasr.data.sampler.price`).
    """

    def __init__(self, bounds: Sequence[int], max_frames: int, max_batch_size: int | None = None,
                 length_cost: str = "linear", quadratic_frames: int = 4000) -> None:
        bounds = [int(b) for b in bounds]
        if not bounds or any(b <= 0 for b in bounds) or bounds != sorted(set(bounds)):
            raise ValueError(f"batch shapes: bounds {bounds}; expected increasing lengths > 0")
        self.bounds = bounds
        self.max_frames = int(max_frames)
        self.pricing = {"length_cost": length_cost, "quadratic_frames": int(quadratic_frames)}
        cap = max_batch_size or None
        self.shapes = [BatchShape(max(1, min(int(self.max_frames // price(b, 1, **self.pricing)), cap or 1 << 62)), b)
                       for b in bounds]

    @classmethod
    def from_lengths(cls, lengths: Sequence[int], buckets: int, max_frames: int, max_batch_size: int | None = None,
                     length_cost: str = "linear", quadratic_frames: int = 4000,
                     multiple: int = FRAME_MULTIPLE) -> BatchShapes:
        """``buckets`` buckets of equal total frames over ``lengths`` (a bucket may merge with
        its neighbour when their rounded bounds meet), the last one's bound the longest length
        rounded up."""
        if buckets < 1:
            raise ValueError(f"data.shape_buckets {buckets}; expected ≥ 1")
        ordered = sorted(int(n) for n in lengths)
        if not ordered:
            raise ValueError("batch shapes: no utterances")
        total, running, bounds, want = sum(ordered), 0, [], 1
        for n in ordered:
            running += n
            while want < buckets and running >= total * want / buckets:
                bounds.append(n)
                want += 1
        bounds.append(ordered[-1])
        rounded = sorted({-(-b // multiple) * multiple for b in bounds})
        return cls(rounded, max_frames, max_batch_size, length_cost, quadratic_frames)

    def __len__(self) -> int:
        return len(self.shapes)

    def __iter__(self):
        return iter(self.shapes)

    def bucket(self, length: int) -> int:
        """The index of the bucket of an utterance (or batch) of ``length`` frames: the first
        whose bound holds it; past the last bound, the last (:meth:`shape_for` grows it)."""
        return min(bisect.bisect_left(self.bounds, int(length)), len(self.bounds) - 1)

    def shape_for(self, longest: int, utterances: int = 1) -> BatchShape:
        """The shape a batch of ``utterances`` whose longest has ``longest`` frames is padded to.
        A batch the buckets do not hold (longer than the last bound, or more utterances than its
        bucket's count: a sampler without these shapes) keeps its own size on that axis, rounded
        up to :data:`FRAME_MULTIPLE` frames: a shape of its own, run eagerly by a captured step."""
        shape = self.shapes[self.bucket(longest)]
        frames = shape.frames if longest <= shape.frames else -(-int(longest) // FRAME_MULTIPLE) * FRAME_MULTIPLE
        return BatchShape(max(shape.utterances, int(utterances)), frames)

    def describe(self) -> str:
        """``"4 shapes (utterances x frames): 60 x 128, 33 x 240, ..."``."""
        listed = ", ".join(f"{s.utterances} x {s.frames}" for s in self.shapes)
        return f"{len(self.shapes)} shapes (utterances x frames): {listed}"


def pad_batch(batch: Mapping, shape: BatchShape) -> dict:
    """``batch`` (:func:`fastasr.data.dataset.collate`'s dict) padded to ``shape``: features
    to ``(shape.utterances, shape.frames, F)`` with zeros, ``feature_lengths`` and
    ``target_lengths`` with 0, ``targets`` with empty rows; the lists (ids, texts, ...) keep
    the real utterances only, and ``batch["utterances"]`` is their number."""
    feats = batch["features"]
    real, frames, bins = feats.shape
    if real > shape.utterances or frames > shape.frames:
        raise ValueError(f"pad_batch: a batch of {real} x {frames} frames does not fit the shape "
                         f"{shape.utterances} x {shape.frames}")
    out = dict(batch)
    out["features"] = feats.new_zeros(shape.utterances, shape.frames, bins)
    out["features"][:real, :frames] = feats
    extra = shape.utterances - real
    lengths = batch["feature_lengths"]
    out["feature_lengths"] = torch.cat([lengths, lengths.new_zeros(extra)])
    targets = batch["targets"]
    out["targets"] = torch.cat([targets, targets.new_zeros(extra, targets.shape[1])])
    out["target_lengths"] = torch.cat([batch["target_lengths"], batch["target_lengths"].new_zeros(extra)])
    out[UTTERANCES_KEY] = real
    return out


class ShapedCollate:
    """:func:`fastasr.data.dataset.collate`, then :func:`pad_batch` to the shape of the batch's
    bucket. A batch with no utterance left (all skipped for bad audio) stays empty: the step
    skips it. Picklable (dataloader workers)."""

    def __init__(self, shapes: BatchShapes, collate_fn: Callable[[Sequence[dict]], dict] = collate) -> None:
        self.shapes = shapes
        self.collate_fn = collate_fn

    def __call__(self, items: Sequence[dict]) -> dict:
        batch = self.collate_fn(items)
        if not batch["ids"]:
            return batch
        feats = batch["features"]
        return pad_batch(batch, self.shapes.shape_for(feats.shape[1], feats.shape[0]))


def real_utterances(batch: Mapping) -> int:
    """The real utterances of a batch, padded (:func:`pad_batch`) or not."""
    return int(batch.get(UTTERANCES_KEY, len(batch["ids"])))
