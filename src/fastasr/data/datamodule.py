"""``ASRDataModule``: manifests → tokenizer, CMVN statistics and batches.

A batch is a dict::

    features         (B, T, F) float32   log-mel filterbanks, zero-padded (CMVN is in the model)
    feature_lengths  (B,) int64          valid frames
    targets          (B, S) int64        label ids, padded with 0 (the blank)
    target_lengths   (B,) int64
    ids              list[str]           utterance ids
    texts            list[str]           reference words, in the tokenizer's word space
                                         (char: the lower-cased text; phoneme: phonetic spellings)
    transcripts      list[str]           the manifest's ``text`` as it is (real words, for word decoding)
    skipped          list[SkippedUtterance]  utterances of this batch left out for unusable audio
                                         (``fastasr.data.bad_audio``); a batch may have no utterance left

Filtering in ``setup()``: training utterances outside
``[min_duration, max_duration]`` are dropped, and training and dev utterances
whose labels cannot be aligned by CTC to their frames (``S + repeats >
frames // subsampling_factor``, frames from the manifest duration) are dropped,
each with an info log giving the count. Test utterances are never filtered;
dev/test utterances with units unseen in training are dropped with a warning
(``on_bad_utterance=skip``) or raise (``raise``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from fastasr.data.augment import AugmentConfig, EpochListeners, WaveformAugment
from fastasr.data.dataset import ASRDataset, collate, worker_init
from fastasr.data.feature_cache import CacheConfig
from fastasr.data.feature_sources import FeatureSource, feature_source
from fastasr.data.features import (
    Fbank,
    FeatureConfig,
    cmvn_cache_path,
    compute_cmvn_stats,
    with_native_rate,
)
from fastasr.data.manifest import Utterance, read_manifest
from fastasr.data.resumable import ResumableDataLoader, training_position
from fastasr.data.sampler import FrameBudgetBatchSampler, budget_for_batches, price
from fastasr.data.shapes import BatchShapes, ShapedCollate
from fastasr.data.tokenizer import KINDS, Tokenizer, UnknownUnitError, ctc_min_frames

log = logging.getLogger(__name__)

#: Share of the training audio that ``min_duration``/``max_duration`` may drop before a warning.
DROPPED_AUDIO_WARNING = 0.05


class ASRDataModule(pl.LightningDataModule):
    """Manifests → tokenizer, CMVN statistics and length-bucketed batches.

    After ``setup()``: ``.tokenizer`` (``Tokenizer``), ``.cmvn_stats``
    (``(mean, std)`` float tensors ``(F,)``, or None outside fitting unless
    given), ``.feature_dim``. ``dataloader_for(path)`` serves any manifest.

    Args (Hydra ``conf/data/*.yaml``):
        train_manifest, dev_manifest, test_manifest: ``.jsonl`` paths (None: not used).
        tokenizer: ``phoneme``, ``char``, ``bpe`` or ``unigram``.
        vocab_size: ``bpe`` / ``unigram`` units including the blank (sentencepiece, learnt on train).
        phone_folding: ``phoneme`` only: a named folding of ``phone_sets`` (``timit``: 61 → 48
            phones for training, 48 → 39 for scoring), or None.
        features: mapping with the ``FeatureConfig`` fields.
        max_frames_per_batch: budget per batch in priced frames (``FrameBudgetBatchSampler``).
        min_batches_per_epoch: training only: lower the budget below ``max_frames_per_batch``
            where needed so that an epoch has at least this many batches (per process under
            DDP; ``sampler.budget_for_batches``); None: the budget as given.
        min_frames_per_batch: the lowest budget ``min_batches_per_epoch`` may lower to (priced
            frames; None: no floor but the longest utterance).
        max_batch_size: optional cap on utterances per batch.
        length_cost: ``linear`` or ``quadratic``: how the sampler prices a padded utterance
            (quadratic for full attention; ``conf/data`` derives it from the attention).
        quadratic_frames: the sampler's ``Q`` of the quadratic price (frames).
        sortagrad_epochs: training only: the first this many epochs take their batches
            shortest first (SortaGrad) instead of in random order; 0: never.
        num_workers: dataloader worker processes.
        min_duration, max_duration: training utterances outside are dropped (seconds; None: no bound).
        on_bad_utterance: ``skip`` (warn and drop) or ``raise`` — bad manifest lines,
            and dev/test utterances with units unknown to the tokenizer.
        vocab: a tokenizer state (``{"kind", "vocab"}``), a ``Tokenizer``, or a unit
            list, to use instead of building one from the training manifest.
        cmvn_stats: ``{"mean": [...], "std": [...]}`` or ``(mean, std)``, instead of computing them.
        subsampling_factor: the model's frame reduction (``model.subsampling``, given by whoever
            builds this module from the model config), for the label-length filter.
        seed: batch shuffling seed (per epoch: seed + epoch).
        pin_memory: pin batches (for GPU training).
        cache: ``data.cache`` (``CacheConfig`` fields: dir, mode, dtype): the feature cache.
        augment: ``data.augment`` (``AugmentConfig`` fields): training-only augmentation.
        batch_shapes: training only: pad every batch to its bucket's fixed (utterances, frames)
            shape (:mod:`fastasr.data.shapes`), so that a captured step replays a handful of
            graphs; ``auto`` (``train.py`` resolves it to ``capture_steps``'s decision; left
            unresolved it is off) or a bool.
        shape_buckets: with ``batch_shapes``, the number of buckets, and so of shapes.
    """

    def __init__(
        self,
        train_manifest: str | None = None,
        dev_manifest: str | None = None,
        test_manifest: str | None = None,
        tokenizer: str = "phoneme",
        vocab_size: int | None = None,
        phone_folding: str | None = None,
        features: Mapping | FeatureConfig | None = None,
        max_frames_per_batch: int = 16000,
        min_batches_per_epoch: int | None = None,
        min_frames_per_batch: int | None = None,
        max_batch_size: int | None = None,
        length_cost: str = "linear",
        quadratic_frames: int = 4000,
        sortagrad_epochs: int = 0,
        num_workers: int = 0,
        min_duration: float | None = None,
        max_duration: float | None = None,
        on_bad_utterance: str = "skip",
        vocab: Mapping | Tokenizer | Sequence[str] | None = None,
        cmvn_stats: Mapping | Sequence | None = None,
        subsampling_factor: int = 1,
        seed: int = 0,
        pin_memory: bool = False,
        cache: Mapping | None = None,
        augment: Mapping | None = None,
        batch_shapes: bool | str = False,
        shape_buckets: int = 8,
    ) -> None:
        super().__init__()
        if on_bad_utterance not in ("skip", "raise"):
            raise ValueError(f"on_bad_utterance {on_bad_utterance!r}; expected 'skip' or 'raise'")
        if tokenizer not in KINDS:
            raise ValueError(f"tokenizer {tokenizer!r}; expected one of {KINDS}")
        if subsampling_factor < 1:
            raise ValueError(f"subsampling_factor {subsampling_factor}; expected ≥ 1")
        self.manifests = {"train": train_manifest, "dev": dev_manifest, "test": test_manifest}
        self.tokenizer_kind = tokenizer
        self.vocab_size = vocab_size
        self.phone_folding = phone_folding
        self.feature_config = FeatureConfig.from_dict(features)
        self.max_frames_per_batch = int(max_frames_per_batch)
        if min_batches_per_epoch is not None and min_batches_per_epoch < 0:
            raise ValueError(f"min_batches_per_epoch {min_batches_per_epoch}; expected ≥ 0 or None")
        self.min_batches_per_epoch = min_batches_per_epoch
        if min_frames_per_batch is not None and min_frames_per_batch < 0:
            raise ValueError(f"min_frames_per_batch {min_frames_per_batch}; expected ≥ 0 or None")
        self.min_frames_per_batch = min_frames_per_batch
        self._train_budget: int | None = None
        self.max_batch_size = max_batch_size
        self.pricing = {"length_cost": length_cost, "quadratic_frames": int(quadratic_frames)}
        if sortagrad_epochs < 0:
            raise ValueError(f"sortagrad_epochs {sortagrad_epochs}; expected ≥ 0")
        self.sortagrad_epochs = int(sortagrad_epochs)
        self.num_workers = int(num_workers)
        self.min_duration = min_duration
        self.max_duration = max_duration
        self.on_bad_utterance = on_bad_utterance
        self.subsampling_factor = int(subsampling_factor)
        self.seed = int(seed)
        self.pin_memory = pin_memory
        self.cache_config = CacheConfig.from_dict(cache)
        self.augment_config = AugmentConfig.from_dict(augment)
        if batch_shapes not in (True, False, "auto"):
            raise ValueError(f"batch_shapes {batch_shapes!r}; expected true, false or auto")
        self.batch_shapes = batch_shapes is True
        if int(shape_buckets) < 1:
            raise ValueError(f"shape_buckets {shape_buckets}; expected ≥ 1")
        self.shape_buckets = int(shape_buckets)
        self._train_shapes: BatchShapes | None = None
        self.tokenizer: Tokenizer | None = self._tokenizer_from(vocab) if vocab is not None else None
        self.cmvn_stats: tuple[torch.Tensor, torch.Tensor] | None = (
            self._stats_from(cmvn_stats) if cmvn_stats is not None else None
        )
        self._utterances: dict[str, list[Utterance]] = {}
        self.datasets: dict[str, ASRDataset] = {}

    # ------------------------------------------------------------ helpers
    def _tokenizer_from(self, vocab) -> Tokenizer:
        if isinstance(vocab, Tokenizer):
            tok = vocab
        elif isinstance(vocab, Mapping):
            tok = Tokenizer.from_state_dict(vocab)
        else:
            tok = Tokenizer(self.tokenizer_kind, list(vocab))
        if tok.kind != self.tokenizer_kind:
            log.info("tokenizer kind %r from the given vocab overrides tokenizer=%r", tok.kind, self.tokenizer_kind)
            self.tokenizer_kind = tok.kind
        return tok

    @staticmethod
    def _stats_from(stats) -> tuple[torch.Tensor, torch.Tensor]:
        mean, std = (stats["mean"], stats["std"]) if isinstance(stats, Mapping) else stats
        return torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(std, dtype=torch.float32)

    @property
    def feature_dim(self) -> int:
        return self.feature_config.num_mel_bins

    @property
    def fbank(self) -> Fbank:
        return Fbank(self.feature_config)

    def _read(self, split: str) -> list[Utterance]:
        if split not in self._utterances:
            path = self.manifests[split]
            if not path:
                raise ValueError(f"data.{split}_manifest is not set; it is needed for this stage")
            self._utterances[split] = read_manifest(path, on_error=self.on_bad_utterance)
            log.info("%s: %d utterances from %s", split, len(self._utterances[split]), path)
        return self._utterances[split]

    def _encode(self, split: str, utterances: Sequence[Utterance], ctc_filter: bool,
                source: FeatureSource | None = None) -> tuple[list[Utterance], list[list[int]], list[str]]:
        """Label ids and reference words; drops unknown-unit and (optionally) CTC-infeasible utterances."""
        tok = self.tokenizer
        kept, targets, refs = [], [], []
        unknown: list[str] = []
        too_long = 0
        for utt in utterances:
            try:
                ids = tok.encode(utt)
            except UnknownUnitError as e:
                if self.on_bad_utterance == "raise" or split == "train":
                    raise
                unknown.append(str(e))
                continue
            if not ids:
                unknown.append(f"utterance {utt.id!r} has no units")
                continue
            if ctc_filter:
                frames = (source.frame_range(utt.duration)[0] if source is not None  # shortest speed factor
                          else self.feature_config.frames_for_duration(utt.duration)) // self.subsampling_factor
                if ctc_min_frames(ids) > frames:
                    too_long += 1
                    continue
            kept.append(utt)
            targets.append(ids)
            refs.append(" ".join(tok.units_to_words(tok.decode(ids))))
        if unknown:
            log.warning("%s: dropped %d utterance(s) the tokenizer cannot encode, e.g. %s",
                        split, len(unknown), unknown[0])
        if too_long:
            log.info("%s: dropped %d of %d utterances whose labels are longer than their frames "
                     "(CTC needs labels + repeats ≤ frames // %d)",
                     split, too_long, len(utterances), self.subsampling_factor)
        if not kept:
            raise ValueError(f"{split}: no utterance left after filtering")
        return kept, targets, refs

    # ------------------------------------------------------------ Lightning hooks
    def setup(self, stage: str | None = None) -> None:
        """Read manifests, build the tokenizer (unless given), compute or load
        CMVN statistics (when fitting, unless given) and build datasets."""
        splits = {"fit": ("train", "dev"), "validate": ("dev",), "test": ("test",), "predict": ()}.get(
            stage, ("train", "dev", "test") if stage is None else ()
        )
        splits = tuple(s for s in splits if self.manifests[s] or s == "train")
        if not self.feature_config.resolved:  # features.sample_rate null: the training audio's own rate
            self.feature_config = with_native_rate(self.feature_config, [u.audio_filepath for u in self._read("train")],
                                                   f"data.train_manifest {self.manifests['train']}")
        if self.tokenizer is None:
            self.tokenizer = Tokenizer.build(self._read("train"), self.tokenizer_kind,
                                             vocab_size=self.vocab_size, phone_folding=self.phone_folding)
            log.info("%s", self.tokenizer)
        if "train" in splits and "train" not in self.datasets:
            train = self._read("train")
            lo = self.min_duration if self.min_duration is not None else 0.0
            hi = self.max_duration if self.max_duration is not None else math.inf
            in_range = [u for u in train if lo <= u.duration <= hi]
            if len(in_range) < len(train):
                total_s = sum(u.duration for u in train)
                share = (total_s - sum(u.duration for u in in_range)) / max(total_s, 1e-9)
                message = (f"train: dropped {len(train) - len(in_range)} of {len(train)} utterances outside "
                           f"[{lo}, {hi}] s ({share:.0%} of the audio)")
                if share > DROPPED_AUDIO_WARNING:
                    log.warning("%s: set data.min_duration / data.max_duration to keep them (longer "
                                "utterances cost memory and time a batch; data.max_duration=null keeps all)",
                                message)
                else:
                    log.info("%s", message)
            source = self._feature_source("train", train)
            utts, targets, refs = self._encode("train", in_range, ctc_filter=True, source=source)
            self.datasets["train"] = ASRDataset(utts, targets, refs, self.fbank, train=True, source=source)
            if self.cmvn_stats is None:
                cache = cmvn_cache_path(self.manifests["train"], self.feature_config, [u.id for u in utts])
                self.cmvn_stats = compute_cmvn_stats(utts, self.fbank, cache, num_workers=self.num_workers,
                                                     on_bad_audio=self.on_bad_utterance)
        for split in ("dev", "test"):
            if split in splits and split not in self.datasets:
                source = self._feature_source(split, self._read(split))
                utts, targets, refs = self._encode(split, self._read(split), ctc_filter=split == "dev")
                self.datasets[split] = ASRDataset(utts, targets, refs, self.fbank, train=False, source=source)

    def _feature_source(self, split: str, utterances: list[Utterance],
                        manifest: str | Path | None = None) -> FeatureSource:
        """Audio or feature cache for a split (``feature_sources.feature_source``), with the
        ``data.augment`` augmentation for ``train`` only."""
        augment = None
        if split == "train" and self.augment_config.enabled:
            augment = WaveformAugment(self.augment_config, self.feature_config.sample_rate, self.seed)
            log.info("train: augmentation %s", self.augment_config)
        manifest = manifest if manifest is not None else self.manifests.get(split)
        return feature_source(split, manifest, utterances, self.feature_config, self.cache_config, augment,
                              self.num_workers)

    def _replicas(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 1, 0
        return int(trainer.world_size), int(trainer.global_rank)

    @property
    def train_frames_per_batch(self) -> int:
        """The training batch budget: ``max_frames_per_batch``, lowered on a small corpus to
        give ``min_batches_per_epoch`` batches per process (decided once, logged)."""
        if self._train_budget is None:
            lengths = self._dataset("train").frame_lengths()
            replicas, _ = self._replicas()
            wanted = (self.min_batches_per_epoch or 0) * replicas
            self._train_budget = budget_for_batches(lengths, self.max_frames_per_batch, wanted, **self.pricing,
                                                    min_frames=self.min_frames_per_batch)
            if self._train_budget < self.max_frames_per_batch:
                log.info("train: batch budget %d priced frames (data.max_frames_per_batch=%d would give this "
                         "%d-utterance corpus fewer than data.min_batches_per_epoch=%d updates an epoch; "
                         "data.min_frames_per_batch=%s)", self._train_budget, self.max_frames_per_batch,
                         len(lengths), self.min_batches_per_epoch, self.min_frames_per_batch)
        return self._train_budget

    def set_train_budget(self, frames: int) -> None:
        """Train with a budget of ``frames`` priced frames from now on (``data.max_frames_per_batch``
        replaced: what ``callbacks.largest_batch_probe`` found the device holds); the training
        loader built after this call uses it, ``min_batches_per_epoch`` still applying."""
        if frames <= 0:
            raise ValueError(f"set_train_budget: {frames} frames; expected > 0")
        self.max_frames_per_batch = int(frames)
        self._train_budget = None
        self._train_shapes = None

    def budget_ceiling(self) -> int:
        """The largest training budget worth trying: the whole training set's price divided
        among ``min_batches_per_epoch`` batches (one batch an epoch without it); what
        :meth:`train_frames_per_batch` would lower a larger one to."""
        lengths = self._dataset("train").frame_lengths()
        replicas, _ = self._replicas()
        return budget_for_batches(lengths, 1 << 62, max(1, (self.min_batches_per_epoch or 1) * replicas),
                                  **self.pricing)

    def pessimistic_batch(self, frames: int, seed: int = 0) -> dict:
        """A batch of the most a ``frames`` budget takes of the longest training utterances: as
        many rows of the longest length as the budget prices (capped by ``max_batch_size``),
        random features, each row with the most labels a training utterance has. What
        ``callbacks.largest_batch_probe`` tries to find the budget a device holds."""
        ds = self._dataset("train")
        longest = max(ds.frame_lengths())
        rows = max(1, int(frames // price(longest, 1, **self.pricing)))
        if self.max_batch_size:
            rows = min(rows, int(self.max_batch_size))
        labels = max(int(t.shape[0]) for t in ds.targets)
        g = torch.Generator().manual_seed(seed)
        vocab = len(self.tokenizer) if self.tokenizer is not None else 2
        return {"features": torch.randn(rows, longest, self.feature_dim, generator=g),
                "feature_lengths": torch.full((rows,), longest, dtype=torch.long),
                "targets": torch.randint(1, max(vocab, 2), (rows, labels), generator=g),
                "target_lengths": torch.full((rows,), labels, dtype=torch.long),
                "ids": [f"probe-{i}" for i in range(rows)], "texts": [""] * rows, "transcripts": [""] * rows,
                "skipped": []}

    @property
    def train_shapes(self) -> BatchShapes | None:
        """The fixed shapes training batches are padded to (``batch_shapes``), decided once
        from the training lengths and budget and logged; None when off."""
        if not self.batch_shapes:
            return None
        if self._train_shapes is None:
            self._train_shapes = BatchShapes.from_lengths(
                self._dataset("train").frame_lengths(), self.shape_buckets, self.train_frames_per_batch,
                self.max_batch_size, **self.pricing)
            log.info("train: batches padded to %s (data.batch_shapes; data.shape_buckets=%d)",
                     self._train_shapes.describe(), self.shape_buckets)
        return self._train_shapes

    def _loader(self, dataset: ASRDataset, shuffle: bool, distributed: bool = True) -> DataLoader:
        replicas, rank = self._replicas() if distributed else (1, 0)
        budget = self.train_frames_per_batch if shuffle else self.max_frames_per_batch
        shapes = self.train_shapes if shuffle else None
        sampler = FrameBudgetBatchSampler(
            dataset.frame_lengths(), budget, self.max_batch_size, shuffle=shuffle,
            seed=self.seed, num_replicas=replicas, rank=rank, **self.pricing,
            pad="repeat" if shuffle else "empty",  # evaluation scores every utterance exactly once
            sortagrad_epochs=self.sortagrad_epochs if shuffle else 0, shapes=shapes,
        )
        kwargs = dict(batch_sampler=sampler, collate_fn=collate if shapes is None else ShapedCollate(shapes),
                      num_workers=self.num_workers,
                      pin_memory=self.pin_memory, persistent_workers=self.num_workers > 0,
                      worker_init_fn=worker_init)
        if shuffle:
            # Lightning's per-epoch set_epoch (and a resume's) also reaches the dataset's augmentation draws
            sampler.sampler = EpochListeners(sampler.sampler, dataset)
            # training: the position in the epoch travels in checkpoints (mid-epoch resume)
            return ResumableDataLoader(dataset, position=lambda: training_position(self.trainer), **kwargs)
        return DataLoader(dataset, **kwargs)

    def _dataset(self, split: str) -> ASRDataset:
        if split not in self.datasets:
            self.setup({"train": "fit", "dev": "validate", "test": "test"}[split])
        return self.datasets[split]

    def train_dataloader(self) -> DataLoader:
        return self._loader(self._dataset("train"), shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self._dataset("dev"), shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self._dataset("test"), shuffle=False)

    def dataloader_for(self, manifest_path: str | Path, max_frames_per_batch: int | None = None) -> DataLoader:
        """An evaluation dataloader (no shuffling, no filtering, single process)
        for any manifest, with this module's tokenizer and features."""
        if self.tokenizer is None:
            raise RuntimeError("dataloader_for: no tokenizer yet; give vocab= or call setup() first")
        utts = read_manifest(manifest_path, on_error=self.on_bad_utterance)
        source = self._feature_source(Path(manifest_path).name, utts, manifest_path)
        utts, targets, refs = self._encode(Path(manifest_path).name, utts, ctc_filter=False)
        dataset = ASRDataset(utts, targets, refs, self.fbank, train=False, source=source)
        sampler = FrameBudgetBatchSampler(dataset.frame_lengths(), max_frames_per_batch or self.max_frames_per_batch,
                                          self.max_batch_size, shuffle=False, **self.pricing)
        return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=self.num_workers,
                          pin_memory=self.pin_memory, worker_init_fn=worker_init)

    def largest_train_batches(self, k: int = 1) -> list[dict]:
        """The ``k`` most expensive training batches, by the sampler's price (to try before
        training); with ``batch_shapes``, padded to their shapes, as training runs them."""
        ds = self._dataset("train")
        shapes = self.train_shapes
        sampler = FrameBudgetBatchSampler(ds.frame_lengths(), self.train_frames_per_batch, self.max_batch_size,
                                          **self.pricing, shapes=shapes)
        collate_fn = collate if shapes is None else ShapedCollate(shapes)
        return [collate_fn([ds[i] for i in b]) for b in sampler.largest_batches(k)]
