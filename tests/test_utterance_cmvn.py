"""Per-utterance CMVN (model.utterance_cmvn): statistics over valid frames only, invariance to
a recording's channel (a per-bin gain and offset), padding untouched."""

import pytest
import torch

from fastasr.model import CTCModel
from fastasr.model.utterance_cmvn import UtteranceCMVN


def _batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 50, 8, generator=gen) * 3 + 5
    lengths = torch.tensor([50, 31, 12])
    for b, n in enumerate(lengths.tolist()):
        x[b, n:] = 1e4  # garbage in the padding must not reach the statistics
    return x, lengths


def test_each_utterance_has_zero_mean_unit_std_over_its_valid_frames():
    x, lengths = _batch()
    y = UtteranceCMVN()(x, lengths)
    assert y.shape == x.shape
    for b, n in enumerate(lengths.tolist()):
        valid = y[b, :n]
        torch.testing.assert_close(valid.mean(0), torch.zeros(8), atol=1e-5, rtol=0)
        torch.testing.assert_close(valid.std(0, unbiased=False), torch.ones(8), atol=1e-4, rtol=0)
        assert torch.all(y[b, n:] == 0)


def test_a_channel_gain_and_offset_per_bin_is_removed():
    x, lengths = _batch()
    gain = torch.linspace(0.5, 2.0, 8)
    offset = torch.linspace(-3.0, 4.0, 8)
    norm = UtteranceCMVN()
    torch.testing.assert_close(norm(x * gain + offset, lengths), norm(x, lengths), atol=1e-4, rtol=1e-4)


def test_no_lengths_means_every_frame_is_valid_and_constant_bins_stay_finite():
    x = torch.zeros(2, 10, 4)
    x[..., 0] = 7.0  # a constant bin (digital silence): centred, not divided by ~0
    y = UtteranceCMVN()(x)
    assert torch.isfinite(y).all() and torch.all(y == 0)
    with pytest.raises(ValueError, match="min_std"):
        UtteranceCMVN(min_std=0.0)


def test_model_with_utterance_cmvn_ignores_the_recording_channel():
    torch.manual_seed(0)
    model = CTCModel(vocab_size=5, feat_in=8, d_model=16, heads=2, ff_dim=32, layers=1, subsampling=2,
                     utterance_cmvn=True).eval()
    plain = CTCModel(vocab_size=5, feat_in=8, d_model=16, heads=2, ff_dim=32, layers=1, subsampling=2).eval()
    plain.load_state_dict(model.state_dict())  # no parameters or buffers of its own: same state dict
    x, lengths = _batch(1)
    shifted = x + torch.linspace(-2.0, 2.0, 8)  # e.g. another microphone's spectral tilt
    out, out_len = model(x, lengths)
    out_shifted, _ = model(shifted, lengths)
    valid = torch.arange(out.shape[1])[None, :] < out_len[:, None]
    torch.testing.assert_close(out_shifted[valid], out[valid], atol=1e-4, rtol=1e-4)
    plain_out, _ = plain(x, lengths)
    plain_shifted, _ = plain(shifted, lengths)
    assert not torch.allclose(plain_shifted[valid], plain_out[valid], atol=1e-3)  # global CMVN alone does not
