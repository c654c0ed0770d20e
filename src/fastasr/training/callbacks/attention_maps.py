"""Attention maps of one fixed dev utterance at every validation (the paper's Figure 8, for speech).

For one encoder layer and a few heads, the image shows the attention matrix the model's own
variant applies (``InnerAttention.dense_weights``) and, for every variant other than full,
the full softmax attention of the same queries and keys beside it, with the mean L1
distance between the two rows. Saved as PNG in ``<run dir>/attention_maps/`` and sent to
TensorBoard (``add_image``) and wandb (``log_image``) when those loggers are present.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import matplotlib.image
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure

from fastasr.attention import build_attention
from fastasr.rundir import ATTENTION_MAPS_DIR

log = logging.getLogger(__name__)


def mean_l1_distance(weights: np.ndarray, reference: np.ndarray) -> float:
    """Mean over queries of the L1 distance between two attention rows (0: equal, 2: disjoint)."""
    return float(np.abs(weights - reference).sum(-1).mean())


def render_attention_maps(
    maps: Sequence[tuple[str, np.ndarray]],
    heads: Sequence[int],
    title: str = "",
    panel_size: float = 3.2,
    dpi: int = 100,
) -> np.ndarray:
    """Draw attention matrices as a (heads × variants) grid; returns an RGB image (H, W, 3) uint8.

    Args:
        maps: ``(label, weights)`` per column, ``weights`` of shape (len(heads), N, N).
        heads: the head index of each row (for the titles).
        title: figure title.
        panel_size: inches per panel; the image is ``dpi * panel_size`` pixels a panel
            (plus a fixed margin for the title).
    """
    rows, cols = len(heads), len(maps)
    fig = Figure(figsize=(panel_size * cols, panel_size * rows + 0.5), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    # Figure + Agg canvas, not pyplot: no global backend switch, safe in any process.
    reference = maps[-1][1] if cols > 1 else None
    for c, (label, weights) in enumerate(maps):
        for r, head in enumerate(heads):
            ax = axes[r, c]
            w = weights[r]
            ax.imshow(w, aspect="auto", interpolation="nearest", cmap="viridis", norm=PowerNorm(0.5, 0, max(float(w.max()), 1e-9)))
            name = f"{label} · head {head}"
            if reference is not None and c < cols - 1:
                name += f"\nL1 to full {mean_l1_distance(w, reference[r]):.3f}"
            ax.set_title(name, fontsize=8)
            ax.tick_params(labelsize=6)
            if r == rows - 1:
                ax.set_xlabel("key frame", fontsize=7)
            if c == 0:
                ax.set_ylabel("query frame", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    return image


class AttentionMapLogger(L.Callback):
    """Logs attention maps of one dev utterance after each validation epoch.

    The utterance is chosen during the first validation epoch (not the sanity check) — the
    longest dev utterance of that whole pass, or the first of its first batch with
    ``pick="first"`` — and kept for the rest of the run (and across a resume), so every image
    shows the same input. The longest is the default because a short utterance says nothing
    about an approximation: with fewer positions than clusters, clustered attention is exact.

    Args:
        layer: encoder layer index (negative counts from the end); None = the middle layer.
        heads: how many heads (the first ``heads``), or a list of head indices.
        compare_full: add the full-attention map beside a non-full variant's own map.
        every_n_epochs: log every n-th validation.
        pick: "longest" utterance of the first validation epoch | "first" of its first batch.
        max_frames: crop longer utterances to their first ``max_frames`` (after subsampling)
            so the matrices stay legible and small; None keeps all.
        seed: seed of the randomised variants' hashing for the image (the training RNG
            state is left untouched).
        dirname: sub-directory of the run directory for the PNG files.
    """

    def __init__(
        self,
        layer: int | None = None,
        heads: int | Sequence[int] = 3,
        compare_full: bool = True,
        every_n_epochs: int = 1,
        pick: str = "longest",
        max_frames: int | None = 800,
        seed: int = 0,
        dirname: str = ATTENTION_MAPS_DIR,
        panel_size: float = 3.2,
        dpi: int = 100,
    ):
        super().__init__()
        if pick not in ("longest", "first"):
            raise ValueError(f"AttentionMapLogger pick='{pick}'; expected 'longest' or 'first'")
        self.layer = layer
        self.heads = heads
        self.compare_full = compare_full
        self.every_n_epochs = max(1, int(every_n_epochs))
        self.pick = pick
        self.max_frames = max_frames
        self.seed = seed
        self.dirname = dirname
        self.panel_size = panel_size
        self.dpi = dpi
        self._utterance: tuple[str, torch.Tensor] | None = None
        self._chosen = False  # True once a whole validation epoch has been seen (or restored)
        self.last_image: np.ndarray | None = None
        self.last_path: Path | None = None

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {} if self._utterance is None else {"id": self._utterance[0], "features": self._utterance[1]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "features" in state_dict:
            self._utterance = (state_dict["id"], state_dict["features"])
            self._chosen = True

    # ------------------------------------------------------------------ hooks
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self._chosen or trainer.sanity_checking or dataloader_idx != 0 or not isinstance(batch, Mapping):
            return
        if self.pick == "first" and (batch_idx != 0 or self._utterance is not None):
            return
        lengths = batch["feature_lengths"]
        if len(lengths) == 0:  # every utterance skipped for bad audio
            return
        i = int(lengths.argmax()) if self.pick == "longest" else 0
        if self._utterance is not None and int(lengths[i]) <= self._utterance[1].shape[0]:
            return  # not longer than the one kept so far
        ids = batch.get("ids")
        utt_id = str(ids[i]) if ids is not None else f"dev[{batch_idx}:{i}]"
        feats = batch["features"][i, : int(lengths[i])]
        self._utterance = (utt_id, feats.detach().to("cpu", copy=True).clone())

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self._utterance is None:
            return
        self._chosen = True
        if not trainer.is_global_zero:
            return
        if trainer.current_epoch % self.every_n_epochs:
            return
        try:
            self.log_maps(trainer, pl_module)
        except Exception as err:  # a dashboard must never kill a training run
            log.warning("attention maps skipped: %s: %s", type(err).__name__, err)

    # ------------------------------------------------------------------ work
    def _layer_index(self, n_layers: int) -> int:
        if self.layer is None:
            return n_layers // 2
        idx = self.layer if self.layer >= 0 else n_layers + self.layer
        if not 0 <= idx < n_layers:
            raise ValueError(f"AttentionMapLogger layer={self.layer}; the model has {n_layers} layers")
        return idx

    def _head_list(self, n_heads: int) -> list[int]:
        heads = list(range(min(self.heads, n_heads))) if isinstance(self.heads, int) else list(self.heads)
        bad = [h for h in heads if not 0 <= h < n_heads]
        if bad:
            raise ValueError(f"AttentionMapLogger heads={bad}; the model has {n_heads} heads")
        return heads

    @torch.no_grad()
    def compute_maps(self, model: torch.nn.Module, features: torch.Tensor) -> tuple[list[tuple[str, np.ndarray]], list[int], int]:
        """Run ``model`` (a CTCModel) on one utterance ``features`` (T, F); returns the
        ``(label, weights (heads, N, N))`` columns, the head indices and the layer index."""
        layers = model.attention_layers()
        idx = self._layer_index(len(layers))
        attn = layers[idx]
        heads = self._head_list(attn.heads)
        device = next(model.parameters()).device
        # The randomised variants draw hash planes from torch's global RNG: run on a fork of
        # it, seeded, so the image is reproducible and training randomness is untouched.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(self.seed)
            q, k, lengths = self._capture(model, idx, features.to(device))
            n = q.shape[2] if lengths is None else int(lengths[0])
            if self.max_frames is not None:
                n = min(n, self.max_frames)
            shared = k is q
            sel = torch.tensor(heads, device=q.device)
            q = q[:, sel, :n].float()
            k = q if shared else k[:, sel, :n].float()  # shared-Q/K variants (LSH) check k is q
            lens = torch.tensor([n], device=q.device)
            own_spec = getattr(attn.inner, "spec", "full")
            maps = [(own_spec, attn.inner.dense_weights(q, k, lens)[0].float().cpu().numpy())]
            if self.compare_full and own_spec != "full":
                full = build_attention("full").dense_weights(q, k, lens)[0].float().cpu().numpy()
                maps.append(("full", full))
        return maps, heads, idx

    @staticmethod
    def _capture(model: torch.nn.Module, layer: int, x: torch.Tensor):
        """Run ``model`` in eval mode on one utterance ``x`` (T, F) and return layer
        ``layer``'s attention inputs ``(q, k, lengths)`` (``model.capture_attention``)."""
        was_training = model.training
        model.eval()
        try:
            with model.capture_attention(layer) as captured:
                model(x[None], torch.tensor([x.shape[0]], device=x.device))
            return captured.q, captured.k, captured.lengths
        finally:
            model.train(was_training)

    def log_maps(self, trainer: L.Trainer, pl_module: L.LightningModule) -> np.ndarray:
        """Compute, render, save and log the maps; returns the RGB image (H, W, 3)."""
        utt_id, features = self._utterance
        maps, heads, idx = self.compute_maps(pl_module.model, features)
        epoch, step = trainer.current_epoch, trainer.global_step
        title = f"{utt_id} · layer {idx} · epoch {epoch} · step {step}"
        image = render_attention_maps(maps, heads, title, self.panel_size, self.dpi)
        out_dir = Path(trainer.default_root_dir) / self.dirname
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"epoch{epoch:03d}-step{step}.png"
        matplotlib.image.imsave(path, image)
        tag = f"attention_maps/layer{idx}"
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_image(tag, image, global_step=step, dataformats="HWC")
            elif isinstance(logger, WandbLogger):
                logger.log_image(key=tag, images=[image], step=step, caption=[title])
        self.last_image, self.last_path = image, path
        return image
