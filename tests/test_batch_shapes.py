"""Batches padded to a small fixed set of shapes (``data.batch_shapes``, fastasr.data.shapes):
a run's batches come from the set, and padding a batch to its shape leaves its loss and its
parameters' gradients as they were."""

from __future__ import annotations

import pytest
import torch

from fastasr.data.dataset import collate
from fastasr.data.sampler import FrameBudgetBatchSampler, price
from fastasr.data.shapes import BatchShapes, ShapedCollate, pad_batch, real_utterances


def _lengths(n=400, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g) ** 2 * 700 + 50).long().tolist()  # 50-750 frames, many short


def _items(lengths, bins=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"features": torch.randn(n, bins, generator=g), "targets": torch.randint(1, 5, (max(1, n // 20),), generator=g),
             "id": f"u{i}", "text": "t", "transcript": "t"} for i, n in enumerate(lengths)]


@pytest.mark.parametrize("length_cost", ["linear", "quadratic"])
def test_the_buckets_hold_equal_audio_and_each_shape_fits_the_budget(length_cost):
    lengths = _lengths()
    shapes = BatchShapes.from_lengths(lengths, 6, 8000, length_cost=length_cost, quadratic_frames=400)
    assert 1 <= len(shapes) <= 6
    assert shapes.bounds == sorted(shapes.bounds) and shapes.bounds[-1] >= max(lengths)
    assert all(b % 16 == 0 for b in shapes.bounds)
    for s in shapes:
        assert price(s.frames, s.utterances, length_cost, 400) <= 8000 or s.utterances == 1
        assert price(s.frames, s.utterances + 1, length_cost, 400) > 8000  # as many as the budget prices
    counts = [s.utterances for s in shapes]
    assert counts == sorted(counts, reverse=True)  # a longer bucket never holds more
    assert BatchShapes.from_lengths(lengths, 6, 8000, max_batch_size=10).shapes[0].utterances == 10


def test_a_runs_batches_come_from_the_fixed_set_of_shapes():
    lengths = _lengths()
    items = _items(lengths)
    shapes = BatchShapes.from_lengths(lengths, 5, 6000)
    allowed = {(s.utterances, s.frames) for s in shapes}
    collate_fn = ShapedCollate(shapes)
    sampler = FrameBudgetBatchSampler(lengths, 6000, shuffle=True, seed=3, shapes=shapes)
    seen, shapes_seen = [], set()
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for indices in sampler:
            batch = collate_fn([items[i] for i in indices])
            shape = tuple(batch["features"].shape[:2])
            assert shape in allowed
            shapes_seen.add(shape)
            assert real_utterances(batch) == len(indices) == len(batch["ids"])
            assert batch["feature_lengths"][len(indices):].eq(0).all()
            assert batch["target_lengths"][len(indices):].eq(0).all()
            if epoch == 0:
                seen += indices
    assert sorted(seen) == list(range(len(lengths)))  # every utterance once an epoch
    assert len(shapes_seen) <= len(shapes)


def test_without_shapes_the_sampler_and_collate_are_as_before():
    lengths = _lengths(120)
    plain = FrameBudgetBatchSampler(lengths, 5000, shuffle=True, seed=1)
    assert plain.shapes is None
    batch = collate(_items(lengths[:3]))
    assert "utterances" not in batch and real_utterances(batch) == 3


def test_a_shorter_actual_batch_still_fits_its_shape():
    """Speed perturbation makes features shorter than the lengths planned: the bucket of the
    actual longest holds the batch (a shorter bucket's count is never smaller)."""
    shapes = BatchShapes([64, 128, 256], 1024)
    batch = collate(_items([250, 200, 100, 90]))  # planned in the 256 bucket: 4 x 256 = 1024
    shorter = collate(_items([120, 100, 90, 80]))  # the same utterances, sped up
    for b in (batch, shorter):
        padded = ShapedCollate(shapes).shapes.shape_for(b["features"].shape[1], 4)
        assert pad_batch(b, padded)["features"].shape[:2] == (padded.utterances, padded.frames)
    assert shapes.shape_for(128, 4).frames == 128 and shapes.shape_for(128, 4).utterances == 8
    assert shapes.shape_for(300, 1).frames == 304  # past the last bound: a shape of its own


def _lit(attention, dtype):
    from fastasr.data.manifest import Utterance
    from fastasr.data.tokenizer import Tokenizer
    from fastasr.recognition.recogniser import Recogniser
    from fastasr.training.lit import ASRLitModule

    tok = Tokenizer.build([Utterance("a", "/a.wav", 1.0, "abc cab")], "char")
    config = {"_target_": "fastasr.model.CTCModel", "d_model": 32, "heads": 2, "ff_dim": 64, "layers": 2,
              "dropout": 0.0, "subsampling": 2, "spec_augment": None, "attention": attention, "conv_kernel": 5}
    torch.manual_seed(0)
    lit = ASRLitModule(Recogniser.from_model_config(config, tok, {"num_mel_bins": 20})).to(dtype)
    return lit.train(), tok


@pytest.mark.parametrize("attention", ["full", {"name": "clustered", "clusters": 3, "seed": 1}])
def test_padding_a_batch_to_its_shape_leaves_loss_and_gradients_unchanged(attention):
    dtype = torch.float64
    lit, tok = _lit(attention, dtype)
    g = torch.Generator().manual_seed(5)
    lengths = [37, 30, 22]
    items = [{"features": torch.randn(n, 20, generator=g, dtype=dtype),
              "targets": torch.randint(1, len(tok), (4,), generator=g), "id": str(i), "text": "", "transcript": ""}
             for i, n in enumerate(lengths)]
    batch = collate(items)
    batch["features"] = batch["features"].to(dtype)
    padded = pad_batch(batch, BatchShapes([48], 48 * 5).shape_for(37, 3))  # 5 rows x 48 frames: 2 empty rows
    assert padded["features"].shape[:2] == (5, 48)

    def loss_and_grads(b):
        lit.zero_grad(set_to_none=True)
        loss = lit._training_loss(b)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in lit.named_parameters() if p.grad is not None}

    loss, grads = loss_and_grads(batch)
    padded_loss, padded_grads = loss_and_grads(padded)
    assert torch.isfinite(padded_loss)
    torch.testing.assert_close(padded_loss, loss, rtol=1e-12, atol=1e-12)
    assert grads.keys() == padded_grads.keys()
    for name in grads:
        torch.testing.assert_close(padded_grads[name], grads[name], rtol=1e-9, atol=1e-12, msg=name)
