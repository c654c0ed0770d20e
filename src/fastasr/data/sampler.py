"""Length-bucketed batches capped by what they cost to attend to (icefall/lhotse style).

A batch of ``n`` utterances padded to ``L`` frames is priced ``n x price(L)``:

* ``length_cost="linear"`` (clustered, improved clustered, LSH attention): ``price(L) = L``,
  the padded frames;
* ``length_cost="quadratic"`` (full and top-k attention, O(L^2)): ``price(L) = L + L^2 / Q``
  with ``Q = quadratic_frames``: at ``L = Q`` the attention's quadratic part costs as much
  as the linear rest of the model (lhotse's ``quadratic_duration``, in frames).

So full attention gets fewer long utterances per batch and cannot blow time or memory on
them, while the linear variants fill the same budget with more.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from typing import Protocol

import torch
from torch.utils.data import Sampler

log = logging.getLogger(__name__)


class Shape(Protocol):
    """A batch shape: its utterance count and frames."""

    utterances: int
    frames: int


class Shapes(Protocol):
    """What the sampler reads of a run's batch shapes (:class:`fastasr.data.shapes.BatchShapes`):
    the bucket of a length, each bucket's shape, and the shape a batch is padded to."""

    shapes: Sequence[Shape]

    def bucket(self, length: int) -> int: ...

    def shape_for(self, longest: int, size: int) -> Shape: ...


class _EpochForwarder:
    """What Lightning finds at ``batch_sampler.sampler``: forwards ``set_epoch``."""

    def __init__(self, owner: FrameBudgetBatchSampler) -> None:
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)


LENGTH_COSTS = ("linear", "quadratic")


def price(longest: int, size: int = 1, length_cost: str = "linear", quadratic_frames: int = 4000) -> float:
    """What ``size`` utterances padded to ``longest`` frames cost (see the module docstring)."""
    if length_cost == "quadratic":
        return size * longest * (1.0 + longest / quadratic_frames)
    return float(size * longest)


def budget_for_batches(lengths: Sequence[int], max_frames: int, min_batches: int | None,
                       length_cost: str = "linear", quadratic_frames: int = 4000,
                       min_frames: int | None = None) -> int:
    """The batch budget that cuts ``lengths`` into at least ``min_batches`` batches.

    ``max_frames`` when the corpus is large enough; on a small corpus, the total price of its
    utterances divided by ``min_batches`` (every batch costs at most the budget, so at least
    that many come out), but never below ``min_frames`` nor the price of the longest utterance.
    ``min_batches`` None or 0: ``max_frames``. This keeps a small corpus from getting a few dozen
    updates an epoch out of a budget sized for a large one, and ``min_frames`` keeps it from
    batches so small that their gradient is mostly noise (docs/RECIPES.md "Batches").
    """
    if not min_batches:
        return int(max_frames)
    if min_batches < 0:
        raise ValueError(f"min_batches {min_batches}; expected ≥ 0 (or None)")
    total = sum(price(int(n), 1, length_cost, quadratic_frames) for n in lengths)
    longest = price(int(max(lengths)), 1, length_cost, quadratic_frames)
    return int(min(max_frames, max(total / min_batches, longest, min_frames or 0)))


class FrameBudgetBatchSampler(Sampler[list[int]]):
    """Batches of utterances of similar length whose price
    ``len(batch) × price(longest_in_batch)`` is at most ``max_frames`` (see the module
    docstring; with linear pricing that is the padded size ``len(batch) × longest``).

    Utterances are sorted by length (ties broken randomly per epoch when
    ``shuffle``) and cut greedily into batches; an utterance priced above
    ``max_frames`` gets a batch of its own (with one warning). Then the order
    of the batches is shuffled, reproducibly for ``seed`` + the epoch set with
    ``set_epoch`` (Lightning calls it). Without shuffling, batches come
    shortest first; with ``sortagrad_epochs=E``, the first ``E`` epochs (0, …, E - 1) do too
    (SortaGrad, Amodei et al. 2016, "Deep Speech 2": a curriculum from short to long
    utterances that steadies CTC's first updates), ties still broken randomly.

    With ``num_replicas > 1`` (DDP), rank ``r`` gets batches ``r, r + R, ...``
    of the shuffled list, so ranks see disjoint batches and the same number of
    them: the list is first padded (``pad="repeat"``: by repeating batches from
    its start; ``pad="empty"``: with empty batches, so that evaluation scores
    every utterance exactly once) or, with ``drop_last``, cut to a multiple of
    ``num_replicas``. With one replica every utterance appears exactly once per
    epoch and ``drop_last`` has no effect.

    Mid-epoch resumption: :meth:`resume_at` makes the next pass over an epoch
    skip the batches this rank has already trained on (``len`` stays the
    whole epoch's count, as Lightning counts the skipped batches as done).

    Args:
        lengths: per-utterance lengths in frames (dataset index order).
        max_frames: budget of a batch, in (priced) frames.
        max_batch_size: optional cap on utterances per batch.
        length_cost: ``"linear"`` or ``"quadratic"``: how a padded utterance is priced.
        quadratic_frames: ``Q`` of the quadratic price (frames); unused when linear.
        sortagrad_epochs: with ``shuffle``, the number of first epochs whose batches come
            shortest first instead of in random order (0: none).
        shapes: :class:`fastasr.data.shapes.BatchShapes` (``data.batch_shapes``): each batch is
            cut inside one bucket, at most that bucket's count of utterances, so that it pads to
            the bucket's fixed shape; None: batches as the price alone cuts them.
    """

    def __init__(self, lengths: Sequence[int], max_frames: int, max_batch_size: int | None = None,
                 shuffle: bool = True, seed: int = 0, num_replicas: int = 1, rank: int = 0,
                 drop_last: bool = False, pad: str = "repeat", length_cost: str = "linear",
                 quadratic_frames: int = 4000, sortagrad_epochs: int = 0,
                 shapes: Shapes | None = None) -> None:
        if pad not in ("repeat", "empty"):
            raise ValueError(f"pad {pad!r}; expected 'repeat' or 'empty'")
        if max_frames <= 0:
            raise ValueError(f"max_frames {max_frames}; expected > 0")
        if max_batch_size is not None and max_batch_size <= 0:
            raise ValueError(f"max_batch_size {max_batch_size}; expected > 0 or None")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} of {num_replicas} replicas; expected 0 ≤ rank < num_replicas")
        if length_cost not in LENGTH_COSTS:
            raise ValueError(f"length_cost {length_cost!r}; expected one of {', '.join(LENGTH_COSTS)}")
        if quadratic_frames <= 0:
            raise ValueError(f"quadratic_frames {quadratic_frames}; expected > 0")
        if sortagrad_epochs < 0:
            raise ValueError(f"sortagrad_epochs {sortagrad_epochs}; expected ≥ 0")
        if len(lengths) == 0:
            raise ValueError("FrameBudgetBatchSampler: no utterances")
        self.lengths = torch.as_tensor(list(lengths), dtype=torch.long)
        if (self.lengths <= 0).any():
            raise ValueError("FrameBudgetBatchSampler: lengths must be > 0")
        self.max_frames = int(max_frames)
        self.max_batch_size = max_batch_size
        self.length_cost, self.quadratic_frames = length_cost, int(quadratic_frames)
        self.shuffle, self.seed = shuffle, int(seed)
        self.sortagrad_epochs = int(sortagrad_epochs)
        self.shapes = shapes
        self.num_replicas, self.rank, self.drop_last, self.pad = num_replicas, rank, drop_last, pad
        self.epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, batches of it to skip), see resume_at
        # Lightning calls set_epoch on `dataloader.batch_sampler.sampler`, not on the batch sampler
        self.sampler = _EpochForwarder(self)
        too_long = sum(self.price(int(length)) > self.max_frames for length in self.lengths.tolist())
        if too_long:
            priced = "" if length_cost == "linear" else f" at the quadratic price L (1 + L / {quadratic_frames})"
            log.warning("%d utterance(s) longer than max_frames=%d%s (longest %d frames) get a batch of their own",
                        too_long, self.max_frames, priced, int(self.lengths.max()))
        self._num_batches = len(self._make_batches(torch.Generator().manual_seed(0)))

    def price(self, longest: int, size: int = 1) -> float:
        """What ``size`` utterances padded to ``longest`` frames cost (see the module docstring)."""
        return price(longest, size, self.length_cost, self.quadratic_frames)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shuffle to produce (same seed + epoch → same batches)."""
        self.epoch = int(epoch)

    def resume_at(self, epoch: int, batches_done: int) -> None:
        """Make the next pass start at batch ``batches_done`` (this rank's count) of ``epoch``.

        Selects ``epoch`` at once (Lightning creates the iterator, and DataLoader workers
        prefetch from it, before it calls ``set_epoch``), through ``self.sampler`` so that
        whatever listens there (the training set's augmentation draws) follows too; the skip
        applies to one pass only, and only if that pass is over ``epoch``.
        """
        if batches_done < 0:
            raise ValueError(f"resume_at: batches_done {batches_done}; expected ≥ 0")
        self.sampler.set_epoch(epoch)
        self._resume = (int(epoch), int(batches_done))

    def _make_batches(self, gen: torch.Generator | None) -> list[list[int]]:
        n = len(self.lengths)
        if self.shuffle and gen is not None:
            perm = torch.randperm(n, generator=gen)
            order = perm[torch.argsort(self.lengths[perm], stable=True)]  # random tie-breaks
        else:
            order = torch.argsort(self.lengths, stable=True)
        if self.shapes is not None:
            return self._bucketed(order)
        batches, cur, longest = [], [], 0
        cap = self.max_batch_size or n
        for i, length in zip(order.tolist(), self.lengths[order].tolist()):
            new_longest = max(longest, length)
            if cur and (self.price(new_longest, len(cur) + 1) > self.max_frames or len(cur) >= cap):
                batches.append(cur)
                cur, new_longest = [], length
            cur.append(i)
            longest = new_longest
        if cur:
            batches.append(cur)
        return batches

    def _bucketed(self, order: torch.Tensor) -> list[list[int]]:
        """``order`` (by length) cut into batches that never cross a bucket of ``self.shapes``
        nor exceed its count (which its upper length priced within the budget)."""
        batches, cur, bucket = [], [], -1
        for i, length in zip(order.tolist(), self.lengths[order].tolist()):
            b = self.shapes.bucket(length)
            if cur and (b != bucket or len(cur) >= self.shapes.shapes[b].utterances):
                batches.append(cur)
                cur = []
            cur.append(i)
            bucket = b
        if cur:
            batches.append(cur)
        return batches

    def _epoch_batches(self) -> list[list[int]]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        batches = self._make_batches(gen if self.shuffle else None)
        if self.shuffle and self.epoch >= self.sortagrad_epochs:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]
        return batches

    def _per_rank_count(self) -> int:
        if self.drop_last:
            return self._num_batches // self.num_replicas
        return math.ceil(self._num_batches / self.num_replicas)

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._epoch_batches()
        if self.num_replicas > 1:
            total = self._per_rank_count() * self.num_replicas
            if total > len(batches):  # pad by repeating from the start, or with empty batches
                extra = total - len(batches)
                batches = batches + ([batches[i % len(batches)] for i in range(extra)]
                                     if self.pad == "repeat" else [[] for _ in range(extra)])
            batches = batches[:total][self.rank::self.num_replicas]
        skip = 0
        if self._resume is not None:
            epoch, skip = self._resume
            self._resume = None
            if epoch != self.epoch:
                skip = 0
        yield from batches[skip:]

    def __len__(self) -> int:
        return self._per_rank_count() if self.num_replicas > 1 else self._num_batches

    def largest_batches(self, k: int = 1) -> list[list[int]]:
        """The ``k`` most expensive batches by the same price that built them (with ``shapes``,
        padded to their shape): try them before training so that an out-of-memory shows at once."""
        batches = self._make_batches(None)
        if self.shapes is not None:  # what a batch costs padded to its shape
            shapes = [self.shapes.shape_for(int(self.lengths[b].max()), len(b)) for b in batches]
            key = [self.price(s.frames, s.utterances) for s in shapes]
        else:
            key = [self.price(int(self.lengths[b].max()), len(b)) for b in batches]
        order = sorted(range(len(batches)), key=lambda i: -key[i])
        return [batches[i] for i in order[:k]]
