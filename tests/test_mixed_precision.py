"""Mixed precision trains with every attention variant; CTC is computed in float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_train_eval import compose_train

from fastasr.model import CTCModel
from fastasr.training.fit import train

# (spec for the model, config overrides for train.py)
VARIANTS = {
    "full": ("full", ["attention=full"]),
    "lsh": ("lsh-1", ["attention=lsh", "model.shared_qk=true"]),
    "clustered": ("clustered-4", ["attention=clustered", "attention.clusters=4"]),
    "i-clustered": ("i-clustered-4", ["attention=i_clustered", "attention.clusters=4", "attention.topk=8"]),
    "topk": ("topk-8", ["attention=topk", "attention.k=8"]),
    "oracle-top": ("oracle-top", ["attention=oracle_top"]),
}


@pytest.fixture
def ctc_dtypes(monkeypatch) -> list[torch.dtype]:
    """The dtypes of the log-probabilities every ``F.ctc_loss`` call receives."""
    seen: list[torch.dtype] = []
    real = F.ctc_loss

    def spy(log_probs, *args, **kwargs):
        seen.append(log_probs.dtype)
        return real(log_probs, *args, **kwargs)

    monkeypatch.setattr(F, "ctc_loss", spy)
    return seen


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_model_under_autocast_gives_float32_log_probs_and_finite_gradients(variant, dtype):
    torch.manual_seed(0)
    spec = VARIANTS[variant][0]
    model = CTCModel(12, 40, d_model=32, heads=2, ff_dim=64, layers=2, attention=spec,
                     shared_qk=spec.startswith("lsh"), subsampling=2)
    x, lengths = torch.randn(3, 160, 40), torch.tensor([160, 120, 64])
    targets, target_lengths = torch.randint(1, 12, (3, 10)), torch.tensor([10, 8, 5])
    with torch.autocast("cpu", dtype=dtype):
        log_probs, out_lengths = model(x, lengths)
        loss = F.ctc_loss(log_probs.transpose(0, 1), targets, out_lengths, target_lengths)
    assert log_probs.dtype == torch.float32
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_bf16_mixed_training_with_every_attention(tiny_corpus, tmp_path, variant, ctc_dtypes):
    """A few steps of the tiny model with ``trainer.precision=bf16-mixed`` on the CPU."""
    result = train(compose_train(
        tiny_corpus, tmp_path, f"name=bf16-{variant}", *VARIANTS[variant][1], "trainer.precision=bf16-mixed",
        "trainer.max_epochs=1", "data.max_batch_size=4", "model.subsampling=2", "test=false",
        "callbacks.attention_maps.every_n_epochs=100",
    ))
    ckpt = torch.load(result.last_ckpt, map_location="cpu", weights_only=True)
    assert ckpt["global_step"] >= 3
    assert ckpt["callbacks"]["NonFiniteLossGuard"] == {"skipped": 0}  # no NaN/inf loss or gradient
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())
    assert result.val["val/loss"] == pytest.approx(result.val["val/loss"])  # finite, not NaN
    assert ctc_dtypes and set(ctc_dtypes) == {torch.float32}


@pytest.mark.cuda  # 16-mixed (float16 + gradient scaling) needs a GPU
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_16_mixed_training_on_gpu_with_every_attention(tiny_corpus, tmp_path, variant, ctc_dtypes):
    result = train(compose_train(
        tiny_corpus, tmp_path, f"name=fp16-{variant}", *VARIANTS[variant][1], "trainer.accelerator=gpu",
        "trainer.precision=16-mixed", "trainer.max_epochs=2", "data.max_batch_size=4", "test=false",
    ))
    ckpt = torch.load(result.last_ckpt, map_location="cpu", weights_only=True)
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())
    assert set(ctc_dtypes) == {torch.float32}


@pytest.mark.parametrize(("avx512_bf16", "amx", "expected"), [
    (True, False, "bf16-mixed"), (False, True, "bf16-mixed"), (False, False, "32-true"),
])
def test_auto_precision_on_the_cpu_follows_native_bfloat16(monkeypatch, avx512_bf16, amx, expected):
    from fastasr.training.derived_config import auto_precision

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert auto_precision("cpu") == expected
    assert auto_precision("auto") == expected  # no GPU visible: the CPU's
    assert auto_precision("mps") == "32-true"


def test_auto_precision_on_a_gpu_follows_its_bfloat16(monkeypatch):
    from fastasr.training.derived_config import auto_precision

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for native, expected in ((True, "bf16-mixed"), (False, "32-true")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True, n=native: n)
        assert auto_precision("auto") == expected
        assert auto_precision("gpu") == expected
    assert auto_precision("cpu") == "32-true"  # trainer.accelerator=cpu beside a GPU: the CPU's


def test_precision_auto_is_filled_in_and_other_values_stay(monkeypatch, tiny_corpus, tmp_path):
    from test_config import compose_train
    from test_train_eval import compose_train as compose_on

    from fastasr.training.config_check import ConfigError, check_train_config
    from fastasr.training.derived_config import resolve_train_config

    monkeypatch.setattr("fastasr.training.derived_config.native_bf16", lambda device_type: device_type == "cpu")
    assert compose_train("trainer.precision=auto", "trainer.accelerator=cpu").trainer.precision == "bf16-mixed"
    monkeypatch.setattr("fastasr.training.derived_config.native_bf16", lambda device_type: False)
    assert compose_train("trainer.precision=auto", "trainer.accelerator=cpu").trainer.precision == "32-true"
    assert compose_train("trainer.precision=bf16-mixed").trainer.precision == "bf16-mixed"
    assert compose_train().trainer.precision == "32-true"  # the built-in recipe: float32
    check_train_config(resolve_train_config(compose_on(tiny_corpus, tmp_path, "trainer.precision=auto")))
    with pytest.raises(ConfigError, match=r"trainer.precision='bf17'.*'auto'"):
        check_train_config(resolve_train_config(compose_on(tiny_corpus, tmp_path, "trainer.precision=bf17")))
