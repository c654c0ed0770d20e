"""benchmarks/models/attention_entropy.py: how sharp each layer's attention is in a checkpoint."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.models import attention_entropy as entropy
from fastasr.model import CTCModel


def test_uniform_attention_has_the_entropy_log_of_the_valid_keys_and_one_hot_none():
    """Head 0: every key alike (q = 0) → log L over each utterance's own L valid keys, padding
    ignored; head 1: each query matches one key by far → ~0."""
    B, N, E = 2, 6, 4
    lengths = torch.tensor([6, 3])
    q = torch.zeros(B, 2, N, E)
    k = torch.zeros(B, 2, N, E)
    k[:, 1, :, 0] = torch.arange(N, dtype=torch.float32) * 1000.0  # head 1: the largest key wins
    q[:, 1, :, 0] = 1.0
    h = entropy.head_entropies(q, k, lengths)
    assert h.shape == (2,)
    assert h[0].item() == pytest.approx((math.log(6) + math.log(3)) / 2, abs=1e-9)
    assert h[1].item() == pytest.approx(0.0, abs=1e-9)


def test_layer_entropies_of_a_model_reads_every_layer():
    torch.manual_seed(0)
    model = CTCModel(vocab_size=11, feat_in=20, d_model=32, heads=2, ff_dim=64, layers=3, dropout=0.0,
                     subsampling=2).eval()
    per_layer, seen = entropy.layer_entropies(model, torch.randn(2, 30, 20), torch.tensor([30, 17]))
    assert len(per_layer) == 3 and all(h.shape == (2,) for h in per_layer)
    assert torch.equal(seen, torch.tensor([15, 9]))
    # a head's mean entropy lies between one-hot (0) and uniform over the longest utterance
    assert all(0.0 <= float(h.min()) and float(h.max()) <= math.log(15) + 1e-6 for h in per_layer)
