"""Dropout with the counter-based mask (``fastasr.kernels.layers.dropout``, ``csrc/dropout.cpp``).

The C++ kernel's mask must be bit for bit ``keep_mask`` (its stream written in PyTorch)
for any number of threads; values and gradients are ``x * keep / (1 - p)``; the rate
is ``p`` within sampling error; seeds come from torch's generator, so ``manual_seed``
reproduces a mask. Without the kernels the module is torch's dropout.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from torch import nn

from fastasr.kernels import native
from fastasr.kernels.layers import dropout as dropout_mod
from fastasr.kernels.layers.dropout import (
    Dropout,
    GeluDropout,
    dropout,
    gelu_dropout,
    keep_mask,
    uses_native,
)

native_only = pytest.mark.skipif(
    os.environ.get("FASTASR_NATIVE", "").strip() == "0", reason="FASTASR_NATIVE=0"
)


def test_keep_mask_matches_hand_computed_stream():
    """Element 0 and 1 of seed 0 and seed 2^32 + 5, worked through lowbias32 by hand in Python ints."""

    def mix(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    def u24(i, seed):
        lo, hi = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
        return mix(mix((i * 0x9E3779B9 + lo) & 0xFFFFFFFF) ^ hi) >> 8

    for seed in (0, 2**32 + 5, -7):
        for p in (0.1, 0.5, 0.9):
            want = torch.tensor([u24(i, seed & (2**64 - 1)) >= round(p * 2**24) for i in range(64)])
            assert torch.equal(keep_mask((8, 8), p, seed).flatten(), want)


def test_keep_mask_rate_and_independence():
    p, n = 0.1, 200_000
    keep = keep_mask((n,), p, seed=1234)
    sd = math.sqrt(p * (1 - p) / n)
    assert abs((1 - keep.float().mean().item()) - p) < 5 * sd
    # neighbouring elements are independent: P(both dropped) ~ p^2
    both = (~keep[:-1] & ~keep[1:]).float().mean().item()
    assert abs(both - p * p) < 5 * math.sqrt(p * p / n)
    # seeds differing only in the high word give unrelated masks
    other = keep_mask((n,), p, seed=1234 + 2**32)
    agree = (keep == other).float().mean().item()
    assert abs(agree - (p * p + (1 - p) ** 2)) < 0.01


def test_keep_mask_rejects_p_out_of_range():
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\)"):
        keep_mask((3,), 1.0, 0)


@native_only
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_native_dropout_equals_the_reference_stream(threads, dtype):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.randn(3, 70_001, generator=torch.Generator().manual_seed(0)).to(dtype)
        x.requires_grad_(True)
        p, seed = 0.3, 987654321987
        y = native.dropout(x, p, seed)
        keep = keep_mask(x.shape, p, seed)
        acc = torch.float64 if dtype == torch.float64 else torch.float32  # the kernel's arithmetic
        scale = torch.tensor(1 / (1 - p), dtype=acc)
        want = (x.detach().to(acc) * keep * scale).to(dtype)
        assert torch.equal(y.detach(), want)
        g = torch.randn_like(x)
        y.backward(g)
        assert torch.equal(x.grad, (g.to(acc) * keep * scale).to(dtype))
    finally:
        torch.set_num_threads(before)


@native_only
def test_native_dropout_noncontiguous_and_nonfinite():
    x = torch.randn(40, 30).t()  # non-contiguous
    y = native.dropout(x, 0.5, 11)
    assert torch.equal(y, x.contiguous() * keep_mask(x.shape, 0.5, 11) * 2.0)
    nan = torch.full((1000,), float("nan"))
    assert torch.isnan(native.dropout(nan, 0.5, 3)).all()  # a dropped NaN stays NaN, as in torch


@native_only
def test_dropout_seeds_from_torch_generator(monkeypatch):
    monkeypatch.setenv("FASTASR_KERNELS", "auto")
    x = torch.ones(1000)
    assert uses_native(x, 0.1)
    torch.manual_seed(5)
    a = dropout(x, 0.1)
    b = dropout(x, 0.1)
    torch.manual_seed(5)
    assert torch.equal(dropout(x, 0.1), a)
    assert not torch.equal(a, b)
    values = a.unique()
    assert values.numel() == 2 and values[0] == 0 and values[1] == pytest.approx(1 / 0.9)


def test_dropout_falls_back_to_torch(monkeypatch):
    monkeypatch.setenv("FASTASR_KERNELS", "reference")
    x = torch.ones(1000)
    assert not uses_native(x, 0.1)
    torch.manual_seed(5)
    got = dropout(x, 0.1)
    torch.manual_seed(5)
    assert torch.equal(got, nn.functional.dropout(x, 0.1, training=True))
    assert not uses_native(x, 1.0) and torch.equal(dropout(x, 1.0), torch.zeros(1000))


def test_dropout_module_is_identity_in_eval_and_stateless():
    m = Dropout(0.4)
    assert isinstance(m, nn.Dropout) and m.p == 0.4 and not m.state_dict()
    x = torch.randn(5, 7)
    m.eval()
    assert dropout_mod.dropout(x, 0.4, training=False) is x
    assert m(x) is x
    m.train()
    y = m(x)
    assert y.shape == x.shape
    dropped = y == 0
    assert torch.allclose(y[~dropped], x[~dropped] / 0.6)


def test_every_dropout_of_the_model_is_the_threaded_one():
    from fastasr.model.ctc_model import CTCModel

    model = CTCModel(vocab_size=5, feat_in=8, d_model=12, heads=2, ff_dim=16, layers=2, dropout=0.1,
                     conv_kernel=3, positions="absolute")
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert len(dropouts) == 2 * 4 + 1  # per layer: attention, convolution, 2 feed-forward; + positions
    assert all(type(m) in (Dropout, GeluDropout) and m.p == 0.1 for m in dropouts)
    assert sum(type(m) is GeluDropout for m in dropouts) == 2  # a layer's feed-forward: GELU and its dropout


@pytest.mark.parametrize("choice", ["auto", "reference"])
def test_gelu_dropout_is_dropout_after_gelu_with_the_same_draws(monkeypatch, choice):
    """Off the Triton kernels (the CPU, and CUDA without ``TRITON_GELU_DROPOUT``), ``GeluDropout``
    is ``dropout(gelu(x))``: the same calls, so the same numbers and mask under one seed; in
    eval, GELU alone. It is an ``nn.Dropout`` (its ``p`` is what ``BudgetDropout`` sets)."""
    monkeypatch.setenv("FASTASR_KERNELS", choice)
    x = torch.randn(6, 50, generator=torch.Generator().manual_seed(3))
    module = GeluDropout(0.2)
    assert isinstance(module, nn.Dropout) and not list(module.state_dict())
    torch.manual_seed(7)
    got = module(x)
    torch.manual_seed(7)
    want = dropout(nn.functional.gelu(x), 0.2)
    assert torch.equal(got, want) and bool((got == 0).any())
    assert torch.equal(module.eval()(x), nn.functional.gelu(x))
    assert torch.equal(gelu_dropout(x, 0.0), nn.functional.gelu(x))
    assert not dropout_mod.TRITON_GELU_DROPOUT  # off until a GPU times it

