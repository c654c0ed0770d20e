"""The beam search over many utterances in worker processes (``decoding.workers``): the same
hypotheses in the same order as one process, the workers used only where they pay."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from fastasr.data.lexicon import Lexicon
from fastasr.decoding import parallel
from fastasr.decoding.beam import BeamSearchDecoder, BeamSearchOptions
from fastasr.decoding.builder import build_decoder
from fastasr.decoding.emissions import Emission, transcribe
from fastasr.lm import estimate, write_arpa
from tests.test_beam_search import PHONES, WORDS


def _pid_and(item):
    return os.getpid(), item * item


def test_results_come_in_order_from_the_workers_and_small_searches_stay_here():
    here = os.getpid()
    got = list(parallel.search_in_order(_pid_and, range(40), workers=2, start_after=8))
    assert [square for _, square in got] == [i * i for i in range(40)]
    assert here not in {pid for pid, _ in got} and len({pid for pid, _ in got}) <= 2
    few = list(parallel.search_in_order(_pid_and, range(7), workers=2, start_after=8))
    assert few == [(here, i * i) for i in range(7)]
    assert list(parallel.search_in_order(_pid_and, range(40), workers=0, start_after=8)) == \
        [(here, i * i) for i in range(40)]


def test_auto_is_the_cores_within_bounds_and_bad_values_name_the_key():
    assert parallel.resolve_workers("auto", cores=2) == 2
    assert parallel.resolve_workers("auto", cores=1) == 1
    assert parallel.resolve_workers("auto", cores=64) == parallel.MAX_AUTO_WORKERS
    assert parallel.resolve_workers(0) == 0 and parallel.resolve_workers(3) == 3
    for bad in (-1, "many", True, 1.5):
        with pytest.raises(ValueError, match=r"decoding\.workers=.*expected auto or an integer ≥ 0"):
            parallel.resolve_workers(bad)


@pytest.fixture(scope="module")
def decoder_parts(tmp_path_factory):
    lexicon = Lexicon()
    for word, pron in WORDS.items():
        lexicon.add(word, pron.split())
    lm = tmp_path_factory.mktemp("lm") / "words.arpa"
    write_arpa(estimate([["xa"]] * 20 + [["xb"]] + [["ab", "ba"], ["cab", "xb"]], order=2), lm)
    return lexicon, lm


def _emissions(count: int, frames: int = 12) -> list[torch.Tensor]:
    """Noisy (T, V) log-probabilities: a search with real choices to make."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(count, frames, len(PHONES.vocab), generator=g) * 2
    return list(torch.log_softmax(logits, dim=-1))


def test_worker_processes_find_the_hypotheses_one_process_finds(decoder_parts):
    lexicon, lm = decoder_parts
    options = BeamSearchOptions(lm_weight=1.0, beam_size=20)
    alone = BeamSearchDecoder(PHONES, lexicon, lm, options)
    spread = BeamSearchDecoder(PHONES, lexicon, lm, options, workers=2)
    emissions = _emissions(parallel.START_AFTER + 9)
    expected = [alone(e) for e in emissions]
    assert list(spread.map(emissions)) == expected
    assert list(alone.map(emissions)) == expected  # workers 0: this process
    # the transcripts of a scored decoding, in the emissions' order
    utterances = [Emission(f"u{i}", "ab", ["a", "b"], e) for i, e in enumerate(emissions)]
    assert [t.hyp_words for t in transcribe(utterances, spread, PHONES)] == [h.words for h in expected]
    assert len({h.score for h in expected}) > 1  # the emissions differ: order is tested


def test_a_spawned_worker_builds_its_decoder_from_its_arguments(decoder_parts):
    """Where processes are spawned, the decoder travels pickled: as its arguments, rebuilt there."""
    lexicon, lm = decoder_parts
    decoder = BeamSearchDecoder(PHONES, lexicon, lm, BeamSearchOptions(lm_weight=1.0), workers=2)
    copy = pickle.loads(pickle.dumps(decoder))
    assert copy is not decoder and copy.workers == 0  # a worker's copy searches in its own process
    emission = _emissions(1)[0].numpy()
    assert copy(emission) == decoder(emission)
    assert copy.describe() == decoder.describe()


def test_the_config_sets_the_workers_and_the_presets_use_auto(decoder_parts):
    lexicon, _ = decoder_parts
    decoder, _ = build_decoder({"name": "beam", "workers": 3}, PHONES, lexicon=lexicon)
    assert decoder.workers == 3
    decoder, _ = build_decoder({"name": "beam"}, PHONES, lexicon=lexicon)
    assert decoder.workers == parallel.resolve_workers(parallel.AUTO)
    assert "workers" not in decoder.describe()  # the results do not depend on it
    with pytest.raises(ValueError, match="decoding.workers='several'"):
        build_decoder({"name": "beam", "workers": "several"}, PHONES, lexicon=lexicon)
    assert np.isfinite(decoder(_emissions(1)[0]).score)
