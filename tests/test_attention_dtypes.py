"""Half precisions, float64, seeds and devices."""

from __future__ import annotations

import pytest
import torch

from fastasr.attention import InnerAttention, build_attention

B, H, N, E = 2, 2, 40, 16
LENGTHS = torch.tensor([40, 23])

SPECS = {
    "full": ("full", {}),
    "topk-8": ("topk-8", {"chunk": 16}),
    "clustered-5": ("clustered-5", {"seed": 0}),
    "i-clustered-5": ("i-clustered-5", {"topk": 8, "seed": 0}),
    "lsh-2": ("lsh-2", {"chunk": 8, "buckets": 4, "seed": 0}),
}

# Max abs error against float32 on the same (rounded) inputs, outputs of size ~1.
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def _build(name, **extra):
    spec, kw = SPECS[name]
    return build_attention(spec, **{**kw, **extra})


def _inputs(seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, E, generator=g).to(device) for _ in range(3)]


def _call(attn, q, k, v, lengths=LENGTHS):
    return attn(q, q if attn.requires_shared_qk else k, v, lengths)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(SPECS))
def test_half_precisions_run_and_stay_close_to_float32(name, dtype):
    """Compared with float32 on the *same rounded inputs*, so hashing and top-k
    selection see identical numbers and only the arithmetic precision differs."""
    attn = _build(name)
    q, k, v = (x.to(dtype) for x in _inputs())
    out = _call(attn, q, k, v)
    assert out.dtype == dtype and out.shape == (B, H, N, E)
    assert bool(torch.isfinite(out).all())
    expected = _call(attn, q.float(), k.float(), v.float())
    err = float((out.float() - expected).abs().max())
    assert err < TOLERANCE[dtype], f"{name} {dtype}: max error {err:.2e}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(SPECS))
def test_half_precision_gradients_are_finite(name, dtype):
    attn = _build(name)
    q, k, v = (x.to(dtype).requires_grad_() for x in _inputs(1))
    _call(attn, q, k, v).float().square().sum().backward()
    for t in (q, v) if attn.requires_shared_qk else (q, k, v):
        assert t.grad.dtype == dtype and bool(torch.isfinite(t.grad).all())


@pytest.mark.parametrize("name", list(SPECS))
def test_autocast_does_not_change_the_result(name):
    """Under autocast the variants keep their own precision: same output, bit for bit."""
    attn = _build(name)
    q, k, v = _inputs(7)
    for x in (q, k, v), tuple(t.to(torch.bfloat16) for t in (q, k, v)):
        plain = _call(attn, *x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = _call(attn, *x)
        assert auto.dtype == x[0].dtype and torch.equal(auto, plain)


@pytest.mark.parametrize("name", list(SPECS))
def test_float64_is_computed_in_float64(name):
    attn = _build(name)
    q, k, v = (x.double() for x in _inputs(2))
    out = _call(attn, q, k, v)
    assert out.dtype == torch.float64
    w = attn.dense_weights(q, q if attn.requires_shared_qk else k, LENGTHS)
    assert w.dtype == torch.float64
    torch.testing.assert_close(out, w @ v, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("name", ["clustered-5", "i-clustered-5", "lsh-2"])
def test_seed_makes_every_call_reproducible(name):
    q, k, v = _inputs(3)
    a = _build(name, seed=5)
    first = _call(a, q, k, v)
    torch.manual_seed(123)  # the global RNG does not matter with a seed
    assert torch.equal(_call(a, q, k, v), first)
    assert torch.equal(_call(_build(name, seed=5), q, k, v), first)
    others = [_call(_build(name, seed=s), q, k, v) for s in range(6, 9)]
    assert any(not torch.equal(o, first) for o in others), "the seed has no effect"


@pytest.mark.parametrize("name", ["clustered-5", "i-clustered-5", "lsh-2"])
def test_a_seed_draws_once_a_shape(name, monkeypatch):
    """A seeded attention's planes or rotations are drawn at its first call and kept: later calls
    draw nothing (a CUDA graph can replay them; seeding a generator inside a capture is refused),
    and a seed set later draws anew."""
    q, k, v = _inputs(3)
    a = _build(name, seed=5)
    first = _call(a, q, k, v)

    def no_draw(*args, **kwargs):
        raise AssertionError("a seeded call drew again")

    with monkeypatch.context() as m:
        m.setattr(torch, "randn", no_draw)
        assert torch.equal(_call(a, q, k, v), first)
    a._set_hparams(seed=6)
    assert torch.equal(_call(a, q, k, v), _call(_build(name, seed=6), q, k, v))


@pytest.mark.parametrize("name", ["clustered-5", "i-clustered-5", "lsh-2"])
def test_without_seed_the_global_rng_decides(name):
    q, k, v = _inputs(4)
    attn = _build(name, seed=None)
    torch.manual_seed(7)
    first = _call(attn, q, k, v)
    torch.manual_seed(7)
    assert torch.equal(_call(attn, q, k, v), first)
    draws = [_call(attn, q, k, v) for _ in range(4)]  # RNG advanced: new planes each call
    assert any(not torch.equal(d, first) for d in draws)


def test_forward_draws_no_numpy_random_numbers():
    import numpy as np

    np.random.seed(0)
    state = np.random.get_state()[1].copy()
    q, k, v = _inputs(5)
    for name in SPECS:
        _call(_build(name, **({} if name in ("full", "topk-8") else {"seed": None})), q, k, v)
    assert (np.random.get_state()[1] == state).all()


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(SPECS))
def test_cuda_matches_cpu(name, monkeypatch):
    attn = _build(name)
    # Hash planes and rotations are drawn on the inputs' device, where a seed gives other
    # numbers; draw them on the CPU for both runs so that the kernels are compared.
    draw = InnerAttention._randn
    monkeypatch.setattr(
        InnerAttention, "_randn",
        lambda self, *shape, device="cpu": draw(self, *shape, device="cpu").to(device),
    )
    q, k, v = _inputs(6)
    cpu = _call(attn, q, k, v)
    gpu = _call(attn, *(x.cuda() for x in (q, k, v)), LENGTHS.cuda())
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(SPECS))
def test_non_contiguous_inputs_give_the_same_result(name):
    """Heads split from a (B, N, H, E) projection arrive as transposed views."""
    attn = _build(name)
    q, k, v = _inputs(8)
    views = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
    assert not views[0].is_contiguous()
    torch.testing.assert_close(_call(attn, *views), _call(attn, q, k, v), atol=1e-6, rtol=1e-5)
