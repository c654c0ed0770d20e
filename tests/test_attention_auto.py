"""attention=auto: full attention below the crossover, i-clustered from it on; calibration."""

from __future__ import annotations

import torch

from fastasr.attention import build_attention, calibrate
from fastasr.cli import calibrate as calibrate_command

H, E = 2, 8


def _inputs(n, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, H, n, E, generator=g).requires_grad_(grad) for _ in range(3)]


def test_auto_is_full_below_the_crossover_and_i_clustered_from_it():
    auto = build_attention("auto-40", crossover_no_grad=60, clusters=5, topk=4, seed=1)
    full = build_attention("full")
    iclu = build_attention("i-clustered-5", topk=4, seed=1)
    lengths = torch.tensor([39, 20])
    for n, want in ((39, full), (40, iclu)):  # under autograd: crossover 40
        q, k, v = _inputs(n, grad=True)
        lens = lengths.clamp(max=n)
        assert torch.equal(auto(q, k, v, lens), want(q, k, v, lens)), n
        assert auto.choose(n) is (auto.exact if want is full else auto.approximate)
    with torch.no_grad():  # decoding: crossover_no_grad 60
        q, k, v = _inputs(50)
        assert torch.equal(auto(q, k, v), full(q, k, v))
        q, k, v = _inputs(60)
        assert torch.equal(auto(q, k, v), iclu(q, k, v))
    # dense weights follow the decoding choice and match what the call applies
    q, k, v = _inputs(60)
    w = auto.dense_weights(q, k)
    with torch.no_grad():
        torch.testing.assert_close(auto(q, k, v), w @ v, atol=1e-5, rtol=1e-5)
    assert auto.spec == "auto-40" and auto.length_cost == "linear"


def test_auto_gradients_flow_on_both_sides():
    auto = build_attention("auto-30", clusters=4, topk=4, seed=0)
    for n in (20, 30):
        q, k, v = _inputs(n, grad=True)
        auto(q, k, v).square().sum().backward()
        assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in (q, k, v))


def test_crossover_is_where_i_clustered_stays_faster():
    assert calibrate.crossover({256: (1.0, 2.0), 512: (2.0, 1.5), 1024: (4.0, 1.0)}) == 512
    assert calibrate.crossover({256: (1.0, 0.5), 512: (2.0, 2.5), 1024: (4.0, 1.0)}) == 1024
    assert calibrate.crossover({256: (1.0, 2.0), 512: (2.0, 3.0)}) == 513  # never: beyond the grid
    assert calibrate.crossover({256: (2.0, 1.0), 512: (3.0, 1.0)}) == 256


def test_calibration_writes_both_crossovers_and_keeps_the_comments(tmp_path):
    yaml = tmp_path / "auto.yaml"
    original = calibrate_command.DEFAULT_YAML.read_text()
    yaml.write_text(original)
    assert calibrate_command.main(["--yaml", str(yaml), "--ns", "16", "32", "--tokens", "64", "--heads", "1",
                           "--dim", "8", "--repeats", "1"]) == 0
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(yaml)
    assert {cfg.crossover, cfg.crossover_no_grad} <= {16, 32, 33}
    text = yaml.read_text()
    assert text.count("# calibrated:") == 1 and "fastasr-calibrate" in text
    kept = [line for line in original.splitlines() if not line.startswith(("# calibrated", "crossover"))]
    assert all(line in text for line in kept)
    assert build_attention(cfg).spec == f"auto-{cfg.crossover}"


def test_auto_is_refused_in_a_chunked_context(tiny_corpus):
    """auto picks its path by a call's padded length, which differs between simulated (batched)
    and streamed chunks: chunked decoding and streaming refuse it in one line naming what to use
    instead; full context keeps it, and a set attention is accepted."""
    import pytest
    from recogniser_fixtures import tiny_recogniser

    recogniser = tiny_recogniser(tiny_corpus, attention="auto")
    for chunked in (lambda: recogniser.set_chunked_decoding(0.64), lambda: recogniser.stream(chunk=0.64)):
        with pytest.raises(ValueError, match=r"^attention auto\S* in a chunked context: .* attention=full or "
                                             r"attention=i-clustered") as refused:
            chunked()
        assert "\n" not in str(refused.value)
    recogniser.set_chunked_decoding(None)  # full context: auto as ever
    assert recogniser.model.decoding_context is None
    recogniser.model.set_attention("full")
    recogniser.set_chunked_decoding(0.64)
    assert recogniser.model.decoding_context is not None
