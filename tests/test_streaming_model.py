"""Chunked context and chunk-by-chunk encoding (fastasr.model.chunking, fastasr.model.streaming)."""

from __future__ import annotations

import pytest
import torch

from fastasr.model import CTCModel
from fastasr.model.chunking import ChunkContext, ChunkTraining
from fastasr.model.encoder import ConvolutionModule

ATTENTIONS = ["full", {"name": "clustered", "clusters": 4, "seed": 3},
              {"name": "i-clustered", "clusters": 4, "topk": 3, "seed": 3}]


def model(attention="full", **kw) -> CTCModel:
    torch.manual_seed(0)
    args = dict(vocab_size=7, feat_in=12, d_model=16, heads=2, ff_dim=24, layers=2, dropout=0.0, attention=attention,
                subsampling=4, conv_kernel=5, utterance_cmvn=True, positions="absolute", spec_augment=None)
    args.update(kw)
    m = CTCModel(**args).eval()
    m.set_cmvn(torch.randn(12) * 0.1, torch.rand(12) + 0.5)
    return m


def test_windows_hold_each_chunks_visible_frames_and_unwindow_inverts():
    ctx = ChunkContext(3, left_chunks=1)
    x = torch.arange(2 * 8, dtype=torch.float32).view(2, 1, 8, 1)  # frame values = indices (+8 for b=1)
    w, lens = ctx.windows(x, torch.tensor([8, 5]))
    assert w.shape == (2 * 3, 1, 6, 1)
    # chunk 0 sees [0, 3), chunk 1 [0, 6), chunk 2 [3, 8) (left context 1 chunk)
    assert w[0, 0, :3, 0].tolist() == [0, 1, 2] and lens[0] == 3
    assert w[1, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5] and lens[1] == 6
    assert w[2, 0, :5, 0].tolist() == [3, 4, 5, 6, 7] and lens[2] == 5
    assert lens[3:].tolist() == [3, 5, 2]  # the second sequence ends at 5
    assert torch.equal(ctx.unwindow(w, 8), x)


@pytest.mark.parametrize("attention", ATTENTIONS, ids=lambda a: a if isinstance(a, str) else a["name"])
def test_chunked_attention_never_sees_a_later_chunk(attention):
    """Perturb every frame after chunk i: the encoder's outputs up to chunk i's end stay the same."""
    m = model(attention)
    ctx = ChunkContext(4, left_chunks=2)
    feats = torch.randn(1, 160, 12)  # 40 encoder frames: 10 chunks
    out = m(feats, torch.tensor([160]), ctx)[0]
    for chunk in (2, 5):
        end = (chunk + 1) * 4
        changed = feats.clone()
        changed[:, end * 4:] = torch.randn_like(changed[:, end * 4:]) * 3
        again = m(changed, torch.tensor([160]), ctx)[0]
        torch.testing.assert_close(again[0, :end], out[0, :end], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(again[0, end:], out[0, end:], atol=1e-3)
    full = m(feats, torch.tensor([160]))[0]
    assert not torch.allclose(full[0, :4], out[0, :4], atol=1e-3)  # full context does see ahead


@pytest.mark.parametrize("attention", ATTENTIONS, ids=lambda a: a if isinstance(a, str) else a["name"])
def test_chunked_context_is_exact_with_padding(attention):
    """An utterance gives the same chunked outputs alone and padded in a batch."""
    m = model(attention)
    ctx = ChunkContext(3, left_chunks=1)
    a, b = torch.randn(1, 90, 12), torch.randn(1, 57, 12)
    batch = torch.cat([a, torch.nn.functional.pad(b, (0, 0, 0, 33))])
    out, lens = m(batch, torch.tensor([90, 57]), ctx)
    alone = m(b, torch.tensor([57]), ctx)[0]
    assert lens.tolist() == [23, 15]
    torch.testing.assert_close(out[1, :15], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positions", ["absolute", "rotary", "none"])
@pytest.mark.parametrize("attention", ATTENTIONS, ids=lambda a: a if isinstance(a, str) else a["name"])
@pytest.mark.parametrize("left", [1, None])
def test_stream_equals_the_simulated_chunked_forward(attention, positions, left):
    m = model(attention, positions=positions)
    ctx = ChunkContext(3, left_chunks=left)
    feats = torch.randn(1, 101, 12)  # not a whole number of chunks: the last is shorter
    expected = m(feats, torch.tensor([101]), ctx)[0][0]
    stream = m.start_stream(ctx)
    pieces = [stream.accept(feats[0, i:i + 7]) for i in range(0, 101, 7)] + [stream.finish()]
    got = torch.cat(pieces)
    assert got.shape == expected.shape == (26, 7)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("factor", [1, 2, 8])
def test_stream_equals_the_simulated_forward_at_every_subsampling(factor):
    m = model(subsampling=factor, utterance_cmvn=False, conv_kernel=None)
    ctx = ChunkContext(2, left_chunks=2)
    feats = torch.randn(1, 83, 12)
    expected = m(feats, torch.tensor([83]), ctx)[0][0]
    stream = m.start_stream(ctx)
    got = torch.cat([stream.accept(feats[0, :50]), stream.accept(feats[0, 50:]), stream.finish()])
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_one_chunk_as_long_as_the_utterance_is_full_context_without_utterance_cmvn():
    m = model(utterance_cmvn=False)
    feats = torch.randn(1, 64, 12)
    torch.testing.assert_close(m(feats, torch.tensor([64]), ChunkContext(16))[0], m(feats, torch.tensor([64]))[0],
                               atol=1e-5, rtol=1e-5)


def test_chunk_limited_convolution_sees_zeros_after_its_chunk():
    torch.manual_seed(0)
    conv = ConvolutionModule(8, kernel=5, dropout=0.0).eval()
    x = torch.randn(1, 12, 8)
    ctx = ChunkContext(4)
    out = conv(x, None, ctx)
    for start in (0, 4, 8):
        part = x.clone()
        part[:, start + 4:] = 0  # no later frames at all: the same as a conv over a zero-padded end
        y = conv.gate(part)
        y[:, start + 4:] = 0
        ref = conv.finish(conv.depthwise(y.transpose(1, 2)).transpose(1, 2))
        torch.testing.assert_close(out[:, start:start + 4], ref[:, start:start + 4])


def test_training_draws_chunks_and_full_context():
    draws = ChunkTraining((2, 8), full_context=0.5, left_frames=5)
    import random
    rng = random.Random(0)
    seen = [draws.draw(rng) for _ in range(200)]
    assert 60 < sum(c is None for c in seen) < 140
    assert {c.size for c in seen if c} == {2, 8}
    assert {c.left_chunks for c in seen if c} == {3, 1}  # 5 frames: 3 chunks of 2, 1 chunk of 8
    m = model(streaming={"chunk_sizes": [2], "full_context": 0.0, "left_frames": 2}).train()
    feats = torch.randn(1, 64, 12)
    chunked = m(feats, torch.tensor([64]))[0]
    torch.testing.assert_close(chunked, m.eval()(feats, torch.tensor([64]), ChunkContext(2, 1))[0])


@pytest.mark.parametrize("bad, match", [
    ({"chunk_sizes": [0]}, "chunk_sizes"),
    ({"full_context": 1.0}, "full_context"),
    ({"left_frames": -1}, "left_frames"),
    ({"chunk": 4}, "unknown key"),
])
def test_bad_streaming_config_is_named(bad, match):
    assert model(streaming={"chunk_sizes": []}).chunk_training is None  # the config's default: off
    with pytest.raises(ValueError, match=match):
        model(streaming=bad)


def test_stream_refuses_training_mode_and_bad_frames():
    m = model().train()
    with pytest.raises(ValueError, match="training mode"):
        m.start_stream(ChunkContext(2))
    stream = m.eval().start_stream(ChunkContext(2))
    with pytest.raises(ValueError, match=r"\(T, 12\)"):
        stream.accept(torch.randn(5, 10))


def test_a_runs_first_lines_name_its_chunks():
    from omegaconf import OmegaConf

    from fastasr.training.derived_config import run_summary

    model = {"layers": 2, "heads": 2, "d_model": 32, "attention": "full",
             "streaming": {"chunk_sizes": [4, 8], "left_frames": 64, "full_context": 0.5}}
    assert "attention full, streaming: chunks of [4, 8] frames, left 64, full context 0.5" in run_summary(
        OmegaConf.create({"model": model}))
    model["streaming"]["chunk_sizes"] = []
    assert "attention full, full context" in run_summary(OmegaConf.create({"model": model}))


@pytest.mark.parametrize("attention", ATTENTIONS, ids=lambda a: a if isinstance(a, str) else a["name"])
def test_a_chunked_training_step_back_propagates(attention):
    """Chunked training with every attention: the CTC loss of a drawn chunked context has finite
    gradients reaching the first layer's projections (through the windows' gather and scatter)."""
    m = model(attention, streaming={"chunk_sizes": [2, 4], "full_context": 0.0, "left_frames": 4}).train()
    feats, lengths = torch.randn(2, 96, 12), torch.tensor([96, 70])
    log_probs, out_lengths = m(feats, lengths)
    targets = torch.randint(1, 7, (2, 5))
    loss = torch.nn.functional.ctc_loss(log_probs.transpose(0, 1), targets, out_lengths, torch.tensor([5, 5]))
    loss.backward()
    grad = m.encoder.layers[0].attn.q_proj.weight.grad
    assert torch.isfinite(loss) and grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


# every attention of the registry a stream takes: the exact per-query ones (full, top-k) attend with
# the chunk's queries alone; the others run on the window's queries, kept in the cache
EVERY_ATTENTION = [
    ("full", {}), ("topk-3", {}), ({"name": "clustered", "clusters": 4, "seed": 3}, {}),
    ({"name": "i-clustered", "clusters": 4, "topk": 3, "seed": 3}, {}),
    ({"name": "lsh", "rounds": 2, "chunk": 4, "buckets": 4, "seed": 3}, {"shared_qk": True}),
    ({"name": "auto", "crossover_no_grad": 8, "clusters": 4, "topk": 3, "seed": 3}, {}),
]


def _name(a):
    return a if isinstance(a, str) else a["name"]


@pytest.mark.parametrize("attention, extra", EVERY_ATTENTION, ids=[_name(a) for a, _ in EVERY_ATTENTION])
def test_every_attention_streams_as_the_simulated_forward(attention, extra):
    m = model(attention, positions="rotary", **extra)
    ctx = ChunkContext(3, left_chunks=2)
    feats = torch.randn(1, 130, 12)
    with torch.no_grad():  # as decoding runs (auto's crossover depends on it)
        expected = m(feats, torch.tensor([130]), ctx)[0][0]
    stream = m.start_stream(ctx)
    got = torch.cat([stream.accept(feats[0, i:i + 11]) for i in range(0, 130, 11)] + [stream.finish()])
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("attention", ATTENTIONS, ids=lambda a: a if isinstance(a, str) else a["name"])
def test_the_layer_caches_never_exceed_the_window_and_stay_constant(attention):
    """After each chunk every layer holds at most the left context (keys, values, the convolution's
    frames; the window's queries only for the clustered variants), and after enough chunks exactly
    that: the same lengths at chunk 10 as at chunk 60."""
    m = model(attention)
    ctx = ChunkContext(2, left_chunks=3)  # 6 frames of left context
    stream = m.start_stream(ctx)
    lengths = []
    for _ in range(60):
        stream.accept(torch.randn(2 * 4, 12))  # one chunk: 2 encoder frames of 4 input frames
        for state in stream.layers:
            assert state.frames <= 6 and state.values.shape[2] == state.frames
            assert state.queries.shape[2] == (0 if attention == "full" else state.frames)
            assert state.conv_left.shape[1] == 2  # kernel 5: two frames before the chunk
        lengths.append([state.frames for state in stream.layers])
    assert lengths[9] == lengths[59] == [6, 6] and lengths[0] == [2, 2]
    assert stream.pending.shape[0] == 0 and stream.before.shape[1] == 4  # the front end's frames


def test_a_streamed_chunk_projects_and_attends_with_its_own_queries_only(monkeypatch):
    """Full attention in a stream: the chunk's C queries against the window's L + C keys."""
    import fastasr.model.encoder as encoder

    shapes = []
    real = encoder.chunk_attention

    def spy(q, k, v, top=None):
        shapes.append((q.shape[2], k.shape[2]))
        return real(q, k, v, top)

    monkeypatch.setattr(encoder, "chunk_attention", spy)
    m = model()
    projected = []
    m.encoder.layers[0].attn.q_proj.register_forward_hook(lambda mod, args, out: projected.append(args[0].shape[1]))
    stream = m.start_stream(ChunkContext(4, left_chunks=2))
    stream.accept(torch.randn(4 * 4 * 6, 12))  # six chunks
    assert set(projected) == {4}
    assert shapes[::2] == [(4, 4), (4, 8), (4, 12), (4, 12), (4, 12), (4, 12)]  # layer 1 of each chunk
