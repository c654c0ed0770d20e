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


def test_sortagrad_epochs_come_shortest_first_then_shuffled():
    lens = lengths(300)
    s = FrameBudgetBatchSampler(lens, 4000, seed=1, sortagrad_epochs=2)
    plain = FrameBudgetBatchSampler(lens, 4000, seed=1)
    for epoch in range(3):
        s.set_epoch(epoch)
        plain.set_epoch(epoch)
        batches = list(s)
        longest = [max(lens[i] for i in b) for b in batches]
        assert (longest == sorted(longest)) == (epoch < 2), epoch
        # the same batches as without SortaGrad (ties broken by the same draw), only their order differs
        assert sorted(map(tuple, batches)) == sorted(map(tuple, plain)), epoch
    s.resume_at(0, 5)  # a resumed SortaGrad epoch skips the batches already trained on
    s_fresh = FrameBudgetBatchSampler(lens, 4000, seed=1, sortagrad_epochs=2)
    assert list(s) == list(s_fresh)[5:]
    with pytest.raises(ValueError, match="sortagrad_epochs -1"):
        FrameBudgetBatchSampler(lens, 4000, sortagrad_epochs=-1)


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


# ------------------------------------------------------------------ attention cost
def test_quadratic_price_shrinks_batches_of_long_utterances_only():
    """Full attention: a padded utterance of L frames costs L (1 + L / Q); every batch fits
    the budget at that price, long utterances come in far smaller batches, short ones in
    nearly the same (lhotse's quadratic_duration)."""
    lens = lengths(800) + [2400] * 12
    Q = 1000
    linear = FrameBudgetBatchSampler(lens, 8000, shuffle=False)
    quad = FrameBudgetBatchSampler(lens, 8000, shuffle=False, length_cost="quadratic", quadratic_frames=Q)
    for b in quad:
        longest = max(lens[i] for i in b)
        assert len(b) == 1 or len(b) * longest * (1 + longest / Q) <= 8000
    assert Counter(i for b in quad for i in b) == Counter(range(len(lens)))

    def size_for(sampler, index):
        return next(len(b) for b in sampler if index in b)

    long, short = len(lens) - 1, lens.index(min(lens))
    assert size_for(linear, long) == 3 and size_for(quad, long) == 1  # 2400 (1 + 2.4) > 8000 / 2
    assert size_for(quad, short) >= 0.9 * size_for(linear, short)
    assert quad.price(100, 4) == pytest.approx(4 * 100 * 1.1)
    assert linear.price(100, 4) == 400


def test_largest_batch_probe_uses_the_same_price():
    """Linear: 10 utterances of 300 frames (3000 padded frames) outweigh one of 1000; under
    the quadratic price (Q = 500) the single long utterance costs more and is probed first."""
    lens = [300] * 10 + [1000]
    linear = FrameBudgetBatchSampler(lens, 3000)
    quad = FrameBudgetBatchSampler(lens, 3000, length_cost="quadratic", quadratic_frames=500)
    assert sorted(linear.largest_batches(1)[0]) == list(range(10))
    assert quad.largest_batches(1)[0] == [10]


def test_pricing_is_validated_and_configured_by_the_attention():
    with pytest.raises(ValueError, match="length_cost 'cubic'"):
        FrameBudgetBatchSampler([10], 100, length_cost="cubic")
    with pytest.raises(ValueError, match="quadratic_frames"):
        FrameBudgetBatchSampler([10], 100, length_cost="quadratic", quadratic_frames=0)
    from hydra import compose, initialize_config_dir

    from fastasr.config import CONFIG_DIR
    from fastasr.training.derived_config import resolve_train_config

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        for attention, cost in (("full", "quadratic"), ("topk", "quadratic"), ("clustered", "linear"),
                                ("i_clustered", "linear"), ("lsh", "linear")):
            cfg = resolve_train_config(compose("train", overrides=[f"attention={attention}"]))
            assert cfg.data.length_cost == cost, attention


def test_budget_for_batches_gives_small_corpora_enough_updates():
    from fastasr.data.sampler import budget_for_batches

    lens = lengths(n=300)  # 50-800 frames: ~130k frames in all
    total = sum(lens)
    # a large budget would give this corpus few batches; the lowered one gives at least 100
    assert len(FrameBudgetBatchSampler(lens, 16000)) < 20
    budget = budget_for_batches(lens, 16000, 100)
    assert budget == total // 100
    assert len(FrameBudgetBatchSampler(lens, budget)) >= 100
    # a corpus large enough keeps the given budget; None/0 switch it off
    assert budget_for_batches(lens, 800, 100) == 800
    assert budget_for_batches(lens, 16000, None) == budget_for_batches(lens, 16000, 0) == 16000
    # never below the longest utterance's price, so that no batch is over budget alone
    assert budget_for_batches(lens, 16000, 10**6) == max(lens)
    # nor below min_frames (a floor on the lowered batch), nor above the given budget for it
    assert budget_for_batches(lens, 16000, 100, min_frames=3000) == 3000
    assert budget_for_batches(lens, 16000, 100, min_frames=500) == total // 100
    assert budget_for_batches(lens, 2000, 100, min_frames=3000) == 2000
    # priced as the sampler prices: quadratic totals are larger, so is the budget
    quad = budget_for_batches(lens, 16000, 100, "quadratic", 4000)
    assert quad == int(sum(n * (1 + n / 4000) for n in lens) / 100)
    assert len(FrameBudgetBatchSampler(lens, quad, length_cost="quadratic", quadratic_frames=4000)) >= 100
    with pytest.raises(ValueError, match="min_batches -1"):
        budget_for_batches(lens, 16000, -1)
