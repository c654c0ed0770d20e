"""FrameBudgetBatchSampler: coverage, budget, determinism, DDP split."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import torch

from fastasr.data.sampler import FrameBudgetBatchSampler


def lengths(n=500, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(50, 800, (n,), generator=g)).tolist()


def padded(batch, lens):
    return len(batch) * max(lens[i] for i in batch)


def test_every_utterance_once_and_budget_respected():
    lens = lengths()
    s = FrameBudgetBatchSampler(lens, max_frames=4000, seed=3)
    for epoch in range(3):
        s.set_epoch(epoch)
        batches = list(s)
        assert len(batches) == len(s)
        assert Counter(i for b in batches for i in b) == Counter(range(len(lens)))
        assert all(padded(b, lens) <= 4000 for b in batches)
    # batches are of similar length: the spread inside a batch is small
    assert max(max(lens[i] for i in b) - min(lens[i] for i in b) for b in batches) < 100


def test_shuffle_is_deterministic_per_seed_and_epoch():
    lens = lengths()
    a, b = FrameBudgetBatchSampler(lens, 4000, seed=1), FrameBudgetBatchSampler(lens, 4000, seed=1)
    a.set_epoch(5)
    b.set_epoch(5)
    assert list(a) == list(b)
    b.set_epoch(6)
    assert list(a) != list(b)
    assert list(FrameBudgetBatchSampler(lens, 4000, seed=2)) != list(FrameBudgetBatchSampler(lens, 4000, seed=1))


def test_no_shuffle_gives_ascending_lengths():
    lens = lengths(100)
    flat = [i for b in FrameBudgetBatchSampler(lens, 3000, shuffle=False) for i in b]
    assert [lens[i] for i in flat] == sorted(lens)


def test_overlong_utterance_gets_own_batch_with_one_warning(caplog):
    lens = [100, 100, 5000, 6000, 100]
    with caplog.at_level(logging.WARNING, logger="fastasr.data.sampler"):
        s = FrameBudgetBatchSampler(lens, max_frames=1000)
    batches = list(s)
    assert [2] in batches and [3] in batches
    assert Counter(i for b in batches for i in b) == Counter(range(5))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "2 utterance(s) longer than max_frames=1000" in warnings[0].getMessage()


def test_max_batch_size():
    lens = [10] * 100
    batches = list(FrameBudgetBatchSampler(lens, max_frames=10_000, max_batch_size=8))
    assert max(len(b) for b in batches) == 8 and sum(map(len, batches)) == 100


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("replicas", [2, 3])
def test_ddp_split(replicas, drop_last):
    lens = lengths(301)
    ranks = [FrameBudgetBatchSampler(lens, 4000, seed=7, num_replicas=replicas, rank=r, drop_last=drop_last)
             for r in range(replicas)]
    for s in ranks:
        s.set_epoch(2)
    per_rank = [list(s) for s in ranks]
    counts = {len(b) for b in per_rank}
    assert len(counts) == 1 and counts == {len(ranks[0])}, "ranks must get equal numbers of batches"
    single = FrameBudgetBatchSampler(lens, 4000, seed=7)
    single.set_epoch(2)
    all_batches = list(single)
    if drop_last:
        seen = [i for b in per_rank for batch in b for i in batch]
        assert len(seen) == len(set(seen)), "with drop_last no utterance repeats"
        assert len(per_rank[0]) == len(all_batches) // replicas
    else:
        assert {i for b in per_rank for batch in b for i in batch} == set(range(len(lens)))
    # the split is disjoint as batches: rank r takes batches r, r+R, ... of the shuffled list
    for r, batches in enumerate(per_rank):
        assert batches[: len(all_batches[r::replicas])] == all_batches[r::replicas][: len(batches)]


def test_largest_batches_and_validation():
    lens = lengths(200)
    s = FrameBudgetBatchSampler(lens, 3000)
    top = s.largest_batches(2)
    assert padded(top[0], lens) == max(padded(b, lens) for b in s)
    with pytest.raises(ValueError, match="rank"):
        FrameBudgetBatchSampler(lens, 3000, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="max_frames"):
        FrameBudgetBatchSampler(lens, 0)
