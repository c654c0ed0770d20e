"""Forward time per epoch: the x-axis of the clustered-attention paper's Figure 1.

Measured once per trained member, after training, on a quiet model: every batch of one split
(dev by default) is loaded and its features computed first, then the model runs over all of
them in eval mode without gradients, ``repeats`` times; the fastest pass counts (other work
on the machine only ever adds time). The time is scaled to the training set by audio
duration, ``forward_seconds_epoch = seconds × train audio / timed audio`` (the splits share
one length distribution; ``split: train`` times the training set itself, no scaling).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fastasr.data.manifest import read_manifest
from fastasr.decoding.emissions import decoding_device
from fastasr.recognition.loading import load_recogniser
from fastasr.recognition.scoring import decoding_loader, decoding_options


@dataclass(frozen=True)
class ForwardTime:
    """One member's forward timing: the fastest pass over ``utterances`` (``audio_seconds`` of
    audio, ``frames`` feature frames) of the timed split, every pass, and the per-epoch figure."""

    seconds: float
    passes: tuple[float, ...]
    utterances: int
    frames: int
    audio_seconds: float
    epoch_seconds: float


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def manifest_seconds(manifest: str, min_duration: float | None = None, max_duration: float | None = None) -> float:
    """Audio seconds of a manifest's utterances within ``[min_duration, max_duration]``
    (the training set as the data module keeps it; bounds None: no bound)."""
    total = 0.0
    for u in read_manifest(manifest, check_audio=False):
        if (min_duration is None or u.duration >= min_duration) and (max_duration is None or u.duration <= max_duration):
            total += u.duration
    return total


def time_forward(model: torch.nn.Module, batches: list[Mapping[str, Any]], device: torch.device,
                 repeats: int = 3) -> tuple[float, ...]:
    """Seconds of each of ``repeats`` passes of ``model`` (``forward(features (B,T,F), lengths
    (B,))``) over ``batches`` (DataModule batch dicts) on ``device``, after one warm-up batch;
    the model is left in eval mode."""
    if repeats < 1:
        raise ValueError(f"budget.forward.repeats {repeats}; expected ≥ 1")
    model.eval().to(device)
    inputs = [(b["features"].to(device), b["feature_lengths"].to(device)) for b in batches]
    passes = []
    with torch.inference_mode():
        model(*inputs[0])  # warm-up: kernels, allocator, thread pool
        for _ in range(repeats):
            _sync(device)
            start = time.perf_counter()
            for features, lengths in inputs:
                model(features, lengths)
            _sync(device)
            passes.append(time.perf_counter() - start)
    return tuple(passes)


def measure_member(ckpt: str, data_cfg: Mapping[str, Any], split: str = "dev", repeats: int = 3,
                   accelerator: str = "auto", seed: int = 1234) -> tuple[ForwardTime, int]:
    """Time the forward pass of the model in checkpoint ``ckpt`` over ``data_cfg``'s ``split``
    manifest (batched as training batches it: ``data_cfg``'s frame budget); returns the
    :class:`ForwardTime` and the model's parameter count."""
    import lightning as L

    if split not in ("train", "dev", "test"):
        raise ValueError(f"budget.forward.split {split!r}; expected train, dev or test")
    L.seed_everything(seed, workers=True)  # the randomised attentions' hash planes
    recogniser = load_recogniser(ckpt)
    options = decoding_options(data_cfg)
    options["num_workers"] = 0  # load everything first, in this process: nothing else runs while timing
    manifest = str(data_cfg[f"{split}_manifest"])
    batches = [b for b in decoding_loader(recogniser, manifest, **options) if b["ids"]]
    if not batches:
        raise ValueError(f"{manifest}: no utterance to time the forward pass on")
    durations = {u.id: u.duration for u in read_manifest(manifest, check_audio=False)}
    audio = sum(durations.get(uid, 0.0) for b in batches for uid in b["ids"])
    frames = int(sum(int(b["feature_lengths"].sum()) for b in batches))
    passes = time_forward(recogniser.model, batches, decoding_device(accelerator), repeats)
    seconds = min(passes)
    if split == "train":
        epoch = seconds
    else:
        train_audio = manifest_seconds(str(data_cfg["train_manifest"]), data_cfg.get("min_duration"),
                                       data_cfg.get("max_duration"))
        epoch = seconds * train_audio / max(audio, 1e-9)
    parameters = sum(p.numel() for p in recogniser.model.parameters())
    timed = ForwardTime(seconds, passes, sum(len(b["ids"]) for b in batches), frames, audio, epoch)
    return timed, parameters
