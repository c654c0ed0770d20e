"""How sharp each layer's attention is in a checkpoint: the entropy of every head's rows.

    python -m benchmarks.models.attention_entropy CKPT [CKPT ...] --manifest data/S/dev.jsonl \
        [--utterances 6]

For each checkpoint, runs the first ``--utterances`` utterances of the manifest through the
model (one padded batch, eval mode, CPU) and prints one row: per encoder layer, the lowest and
highest mean entropy (nats) of a head's attention rows over the valid queries, beside ``log N``,
the entropy of uniform attention over the batch's mean length. A head near ``log N`` attends to
everything alike (it carries no content); a head near 0 attends to one key. The weights are the
full softmax ``softmax(Q K^T / sqrt(E))`` over the valid keys (full attention's
``dense_weights``), of the queries and keys the layer
hands its inner attention (``CTCModel.capture_attention``), whatever variant it trained with.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from fastasr.attention import build_attention
from fastasr.data.features import Fbank
from fastasr.data.manifest import read_manifest
from fastasr.recognition.loading import load_recogniser


def head_entropies(q: torch.Tensor, k: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of each head's softmax attention rows over the valid queries.

    ``q, k``: ``(B, H, N, E)``; ``lengths``: ``(B,)`` valid positions. Returns ``(H,)``, the mean
    over the batch's utterances of each one's mean over its valid queries. Uniform attention
    over ``L`` keys gives ``log L``; attention on one key gives 0."""
    weights = build_attention("full").dense_weights(q.double(), k.double(), lengths)  # (B, H, N, N)
    entropy = -(weights * weights.clamp_min(1e-300).log()).sum(-1)  # (B, H, N)
    per_utterance = [entropy[b, :, : int(lengths[b])].mean(-1) for b in range(q.shape[0])]
    return torch.stack(per_utterance).mean(0)


def layer_entropies(model, features: torch.Tensor, lengths: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Every attention layer's :func:`head_entropies` for one batch, and the lengths the
    encoder saw (after subsampling)."""
    per_layer = []
    with torch.no_grad():
        for layer in range(len(model.attention_layers())):
            with model.capture_attention(layer) as captured:
                model(features, lengths)
            per_layer.append(head_entropies(captured.q, captured.k, captured.lengths))
    return per_layer, captured.lengths


def batch_of(manifest: Path, recogniser, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``count`` utterances of ``manifest`` as one padded feature batch."""
    fbank = Fbank(recogniser.features)
    feats = [fbank.from_file(utt.audio_filepath) for utt in read_manifest(manifest, on_error="raise")[:count]]
    if not feats:
        raise SystemExit(f"attention_entropy: {manifest} has no utterances")
    lengths = torch.tensor([f.shape[0] for f in feats])
    return torch.nn.utils.rnn.pad_sequence(feats, batch_first=True), lengths


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="+", type=Path)
    ap.add_argument("--manifest", type=Path, required=True, help="utterances to attend over (a dev split)")
    ap.add_argument("--utterances", type=int, default=6, help="how many of its first utterances (one batch)")
    args = ap.parse_args(argv)
    print("| checkpoint | log N | " + "layer entropies, min–max over heads (nats), layer 1 first |")
    print("| --- | ---: | --- |")
    for ckpt in args.checkpoints:
        recogniser = load_recogniser(ckpt)
        features, lengths = batch_of(args.manifest, recogniser, args.utterances)
        per_layer, seen = layer_entropies(recogniser.model.eval(), features, lengths)
        cells = " · ".join(f"{float(h.min()):.2f}–{float(h.max()):.2f}" for h in per_layer)
        print(f"| {ckpt} | {math.log(float(seen.float().mean())):.2f} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
