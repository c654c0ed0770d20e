"""The model's front end (fastasr.model.frontend): global CMVN, SpecAugment, conv subsampling."""

from __future__ import annotations

import pytest
import torch

from fastasr.model.frontend import ConvSubsampling, GlobalCMVN, SpecAugment


def test_global_cmvn_normalises_and_is_saved():
    mean, std = torch.randn(4), torch.rand(4) + 0.5
    cmvn = GlobalCMVN(mean=mean, std=std)
    x = torch.randn(2, 5, 4)
    y = cmvn(x, torch.tensor([5, 3]))
    torch.testing.assert_close(y[0], (x[0] - mean) / std)
    assert torch.all(y[1, 3:] == 0)
    state = cmvn.state_dict()
    assert set(state) == {"mean", "std"}
    other = GlobalCMVN(4)
    other.load_state_dict(state)
    torch.testing.assert_close(other.mean, mean)
    with pytest.raises(ValueError, match="expected 8"):
        GlobalCMVN(8, mean=mean, std=std)


def test_spec_augment_eval_is_identity():
    sa = SpecAugment().eval()
    x = torch.randn(2, 50, 40)
    assert sa(x, torch.tensor([50, 30])) is x


def test_spec_augment_time_masks_stay_inside_valid_frames():
    torch.manual_seed(0)
    sa = SpecAugment(freq_masks=0, time_masks=2, time_width=10, max_time_ratio=0.5).train()
    lengths = torch.tensor([100, 40, 7, 1])
    x = torch.full((4, 100, 8), 7.0)
    masked_any = False
    for _ in range(50):
        y = sa(x, lengths)
        for b, length in enumerate(lengths.tolist()):
            assert torch.all(y[b, length:] == 7.0), "a time mask touched padding"
            hit = (y[b, :length] == 0).all(-1)
            assert int(hit.sum()) <= 2 * min(10, int(0.5 * length))
            masked_any |= bool(hit.any())
    assert masked_any
    assert torch.all(x == 7.0), "input modified in place"


def test_spec_augment_freq_masks_per_utterance():
    torch.manual_seed(1)
    sa = SpecAugment(freq_masks=2, freq_width=5, time_masks=0).train()
    y = sa(torch.ones(16, 20, 40), torch.full((16,), 20))
    bands = (y == 0).all(1)  # (B, F): fully masked bins
    assert torch.all(bands.sum(1) <= 2 * 4)
    assert bands.any()
    assert len({tuple(b.tolist()) for b in bands}) > 1, "masks should differ between utterances"
    assert torch.all((y == 0) | (y == 1))


def test_spec_augment_gradient_is_its_mask():
    """d out / d x is 1 where a value passes through and 0 where it is masked: with a random
    upstream gradient g, x.grad == g * (not masked)."""
    torch.manual_seed(2)
    sa = SpecAugment(freq_masks=2, freq_width=4, time_masks=2, time_width=6, max_time_ratio=0.5,
                     mask_value=-3.5).train()
    x = (torch.rand(3, 30, 10) + 1.0).requires_grad_()  # in [1, 2): never equal to the mask value
    lengths = torch.tensor([30, 20, 9])
    y = sa(x, lengths)
    masked = y == -3.5
    assert masked.any() and (~masked).any()
    # the masks are whole frequency bands and whole time spans
    bands, spans = masked.all(1), masked.all(2)  # (B, F), (B, T)
    assert torch.equal(masked, bands[:, None, :] | spans[:, :, None])
    upstream = torch.randn_like(y)
    (y * upstream).sum().backward()
    torch.testing.assert_close(x.grad, upstream * ~masked, rtol=0, atol=0)
    torch.testing.assert_close(y[~masked], x.detach()[~masked], rtol=0, atol=0)


@pytest.mark.parametrize("factor", [1, 2, 4, 8])
def test_subsampling_lengths(factor):
    sub = ConvSubsampling(feat_in=20, d_model=16, factor=factor)
    x = torch.randn(2, 37, 20)
    lengths = torch.tensor([37, 20])
    y, out = sub(x, lengths)
    assert y.shape == (2, out.max().item(), 16)
    expected = lengths.clone()
    for _ in range(factor.bit_length() - 1):
        expected = (expected + 1) // 2
    assert torch.equal(out, expected)


def test_subsampling_rejects_bad_factor():
    with pytest.raises(ValueError, match="subsampling"):
        ConvSubsampling(20, 16, factor=3)
