"""The training-time dataset and batches: :class:`ASRDataset` (an utterance's features, label
ids and references, an unusable recording reported as skipped), :func:`collate` (items into the
batch dict of :mod:`fastasr.data.datamodule`'s docstring) and :func:`worker_init` (the
dataloader workers' signal handling and seeding).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence

import torch
from lightning.fabric.utilities.seed import pl_worker_init_function
from torch.utils.data import Dataset

from fastasr.data.audio import BadAudioError
from fastasr.data.bad_audio import SKIPPED_KEY, skipped_item, split_skipped
from fastasr.data.feature_sources import AudioFeatures, FeatureSource
from fastasr.data.features import Fbank
from fastasr.data.manifest import Utterance


def worker_init(worker_id: int) -> None:
    """Every dataloader worker ignores SIGTERM. A scheduler (SLURM, Kubernetes) sends it to every
    process of the job, workers included; a worker that died of it would end training with
    "DataLoader worker killed" before the training process had written its preemption checkpoint
    (``callbacks.PreemptionCheckpoint``), so only the training process handles it and then shuts
    its workers down. Workers are seeded as Lightning seeds them (``seed_everything(workers=True)``),
    which a loader with its own ``worker_init_fn`` would otherwise skip."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if int(os.environ.get("PL_SEED_WORKERS", "0")):
        pl_worker_init_function(worker_id)


class ASRDataset(Dataset):
    """Utterances with precomputed label ids; ``__getitem__`` gets features from ``source``
    (default: load the audio and compute them; see ``fastasr.data.feature_sources``)."""

    def __init__(self, utterances: Sequence[Utterance], targets: Sequence[Sequence[int]],
                 references: Sequence[str], fbank: Fbank, train: bool = False,
                 source: FeatureSource | None = None) -> None:
        if not len(utterances) == len(targets) == len(references):
            raise ValueError("ASRDataset: utterances, targets and references differ in length")
        self.utterances = list(utterances)
        self.targets = [torch.as_tensor(t, dtype=torch.long) for t in targets]
        self.references = list(references)
        self.fbank = fbank
        self.train = train
        self.source = source if source is not None else AudioFeatures(fbank)

    def __len__(self) -> int:
        return len(self.utterances)

    def frame_lengths(self) -> list[int]:
        """Frames per utterance from the manifest durations (no audio read); with speed
        perturbation, those of its longest version, so a batch never exceeds its budget."""
        return [self.source.frame_range(u.duration)[1] for u in self.utterances]

    def set_epoch(self, epoch: int) -> None:
        """Augmentation draws follow the epoch (``EpochListeners`` calls this)."""
        self.source.set_epoch(epoch)

    def __getitem__(self, i: int) -> dict:
        utt = self.utterances[i]
        try:
            features = self.source(utt, train=self.train)
        except BadAudioError as err:  # skipped and reported, not fatal (fastasr.data.bad_audio)
            return skipped_item(utt.id, utt.audio_filepath, err.reason)
        return {
            "features": features,
            "targets": self.targets[i],
            "id": utt.id,
            "text": self.references[i],
            "transcript": utt.text,
        }


def collate(items: Sequence[dict]) -> dict:
    """List of dataset items → the batch dict described in the module docstring."""
    items, skipped = split_skipped(items)
    if not items:  # every utterance skipped (or an empty padding batch): the steps skip it
        return {"features": torch.zeros(0, 0, 0), "feature_lengths": torch.zeros(0, dtype=torch.long),
                "targets": torch.zeros(0, 1, dtype=torch.long), "target_lengths": torch.zeros(0, dtype=torch.long),
                "ids": [], "texts": [], "transcripts": [], SKIPPED_KEY: skipped}
    feats = [it["features"] for it in items]
    targets = [it["targets"] for it in items]
    batch_feats = torch.zeros(len(items), max(f.shape[0] for f in feats), feats[0].shape[1])
    batch_targets = torch.zeros(len(items), max(max(t.shape[0] for t in targets), 1), dtype=torch.long)
    for b, (f, t) in enumerate(zip(feats, targets)):
        batch_feats[b, : f.shape[0]] = f
        batch_targets[b, : t.shape[0]] = t
    return {
        "features": batch_feats,
        "feature_lengths": torch.tensor([f.shape[0] for f in feats], dtype=torch.long),
        "targets": batch_targets,
        "target_lengths": torch.tensor([t.shape[0] for t in targets], dtype=torch.long),
        "ids": [it["id"] for it in items],
        "texts": [it["text"] for it in items],
        "transcripts": [it["transcript"] for it in items],
        SKIPPED_KEY: skipped,
    }
