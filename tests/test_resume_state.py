"""The pieces of crash-safe resumption, without a training run: the sampler's resume position,
the resumable training loader's checkpoint state, and atomic checkpoint files.
(``test_survival.py`` kills real runs; it is slow.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fastasr.data.resumable import ResumableDataLoader, training_position
from fastasr.data.sampler import FrameBudgetBatchSampler
from fastasr.training.checkpoint_io import STALL_ENV, AtomicCheckpointIO

LENGTHS = [100 + 37 * i % 400 for i in range(40)]


def sampler(**kw) -> FrameBudgetBatchSampler:
    return FrameBudgetBatchSampler(LENGTHS, 1000, seed=5, **kw)


def test_resume_at_skips_the_batches_done_of_that_epoch_once():
    full = sampler()
    full.set_epoch(3)
    epoch3 = list(full)
    s = sampler()
    s.resume_at(3, 4)
    assert s.epoch == 3 and len(s) == len(epoch3)  # len stays the epoch's: Lightning counts the skipped
    assert list(s) == epoch3[4:]
    assert list(s) == epoch3  # one pass only
    s.resume_at(3, 2)
    s.set_epoch(4)  # another epoch was selected before the pass: no skip
    full.set_epoch(4)
    assert list(s) == list(full)
    with pytest.raises(ValueError, match="batches_done"):
        s.resume_at(0, -1)


def test_ddp_padding_for_evaluation_is_empty_batches():
    for pad, expect_empty in (("repeat", False), ("empty", True)):
        ranks = [FrameBudgetBatchSampler(LENGTHS[:5], 10_000, max_batch_size=2, shuffle=False,
                                         num_replicas=2, rank=r, pad=pad) for r in (0, 1)]
        batches = [list(s) for s in ranks]
        assert len(batches[0]) == len(batches[1]) == 2  # 3 batches of ≤ 2 → padded to 4
        ids = [i for b in batches for batch in b for i in batch]
        assert sorted(set(ids)) == list(range(5))
        assert (batches[1][-1] == []) is expect_empty
        assert (len(ids) == 5) is expect_empty  # empty padding: every utterance exactly once
    with pytest.raises(ValueError, match="pad"):
        sampler(pad="zeros")


def fake_trainer(epoch_started: int, epoch_processed: int, batches_processed: int):
    progress = SimpleNamespace(
        epoch_progress=SimpleNamespace(current=SimpleNamespace(started=epoch_started, processed=epoch_processed)),
        epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(current=SimpleNamespace(processed=batches_processed))),
    )
    return SimpleNamespace(fit_loop=progress)


def test_training_position_reads_the_trainer_progress():
    assert training_position(fake_trainer(3, 2, 5)) == (2, 5)  # inside epoch 2, 5 batches done
    assert training_position(fake_trainer(3, 3, 7)) == (3, 0)  # between epochs: the next one from its start


def loader(position=None, **sampler_kw) -> ResumableDataLoader:
    return ResumableDataLoader(list(range(len(LENGTHS))), batch_sampler=sampler(**sampler_kw),
                               collate_fn=lambda items: items, position=position)


def test_resumable_loader_state_round_trip():
    saved = loader(position=lambda: (2, 3)).state_dict()
    assert saved == {"epoch": 2, "batches_done": 3, "batches_per_epoch": len(loader()), "num_replicas": 1}
    reference = sampler()
    reference.set_epoch(2)
    resumed = loader()
    resumed.load_state_dict(saved)
    assert list(resumed) == list(reference)[3:]
    # a checkpoint written after the epoch's last batch (end-of-epoch validation) resumes at the next epoch
    finished = loader()
    finished.load_state_dict(dict(saved, batches_done=len(finished)))
    reference.set_epoch(3)
    assert finished.batch_sampler.epoch == 3 and list(finished) == list(reference)
    # resumed on twice as many processes: each skips half as many of its own batches
    two = loader(num_replicas=2, rank=0)
    two.load_state_dict(dict(saved, batches_done=6, num_replicas=1))
    assert two.batch_sampler._resume == (2, 3)
    with pytest.raises(TypeError, match="resume_at"):
        ResumableDataLoader([1, 2], batch_size=1)


# ----------------------------------------------------------------------------- atomic checkpoint files
def test_checkpoint_writes_are_atomic(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "ckpts" / "last.ckpt"
    io.save_checkpoint({"global_step": 1, "w": torch.ones(3)}, path)
    assert torch.load(path, weights_only=True)["global_step"] == 1

    # a save that dies half-way leaves the previous checkpoint whole and no temporary file
    real_save = torch.save

    def dying_save(obj, f, *a, **k):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"global_step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.setattr(torch, "save", real_save)
    assert torch.load(path, weights_only=True)["global_step"] == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]

    # the leftover of a killed save (another pid) is removed by the next save of that name
    stale = path.with_name(".last.ckpt.tmp-999999")
    stale.write_bytes(b"cut")
    io.save_checkpoint({"global_step": 3}, path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]
    assert torch.load(path, weights_only=True)["global_step"] == 3


def test_checkpoint_stall_hook_only_from_its_step(tmp_path, monkeypatch):
    slept = []
    monkeypatch.setattr("fastasr.training.checkpoint_io.time.sleep", slept.append)
    monkeypatch.setenv(STALL_ENV, "5:30")
    io = AtomicCheckpointIO()
    io.save_checkpoint({"global_step": 4}, tmp_path / "a.ckpt")
    io.save_checkpoint({"global_step": 5}, tmp_path / "a.ckpt")
    assert slept == [30.0]
    assert torch.load(tmp_path / "a.ckpt", weights_only=True)["global_step"] == 5
