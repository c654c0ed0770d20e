"""Captured training steps (``capture_steps``, fastasr.training.captured_step): the plumbing on
the CPU (shape bookkeeping, the split step through Lightning's hooks, the eager fallback, the
setting and its config key), no host reads inside the step, and on a GPU (``cuda``) a captured
step against an eager one."""

from __future__ import annotations

import logging
import math
import warnings

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf

from fastasr.config import CONFIG_DIR
from fastasr.training.captured_step import CapturedSteps, capture_wanted
from fastasr.training.graph_backends import EagerGraphs

RADAM = {"_target_": "torch.optim.RAdam", "_partial_": True, "lr": 3e-3, "weight_decay": 0.01,
         "decoupled_weight_decay": True}


def _lit(attention="full", capture=False, layers=2, inter=False, dtype=torch.float32, shared_qk=False):
    from fastasr.data.manifest import Utterance
    from fastasr.data.tokenizer import Tokenizer
    from fastasr.recognition.recogniser import Recogniser
    from fastasr.training.lit import lit_module_class

    tok = Tokenizer.build([Utterance("a", "/a.wav", 1.0, "abc cab")], "char")
    config = {"_target_": "fastasr.model.CTCModel", "d_model": 32, "heads": 2, "ff_dim": 64, "layers": layers,
              "dropout": 0.0, "subsampling": 2, "spec_augment": None, "attention": attention, "shared_qk": shared_qk}
    if inter:
        config |= {"inter_ctc_layers": [1], "inter_ctc_weight": 0.3}
    torch.manual_seed(0)
    return lit_module_class(capture)(Recogniser.from_model_config(config, tok, {"num_mel_bins": 20}),
                                     optimizer=RADAM, capture_steps=capture).to(dtype)


def _batches(shapes=((3, 40), (2, 64)), steps=8, vocab=4, seed=0):
    """``steps`` batches cycling through ``shapes`` (utterances, frames), the last row short."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(steps):
        b, t = shapes[i % len(shapes)]
        lengths = torch.full((b,), t, dtype=torch.long)
        lengths[-1] = t // 2
        out.append({"features": torch.randn(b, t, 20, generator=g), "feature_lengths": lengths,
                    "targets": torch.randint(1, vocab, (b, 5), generator=g), "target_lengths": torch.full((b,), 5),
                    "ids": [f"{i}-{j}" for j in range(b)], "texts": [""] * b, "transcripts": [""] * b, "skipped": []})
    return out


class _Losses(L.Callback):
    """Each step's loss, kept on its device while training runs (a read would be a host
    synchronisation inside the step, which the GPU tests forbid); ``values()`` reads them."""

    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].detach().clone())

    def values(self):
        return [float(loss) for loss in self.losses]


def _fit_on(accelerator, lit, batches, clip=0.05, precision="32-true", callbacks=(), logger=False,
            clip_algorithm="norm"):
    losses = _Losses()
    trainer = L.Trainer(accelerator=accelerator, devices=1, max_epochs=1, logger=logger, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        gradient_clip_val=clip, gradient_clip_algorithm=clip_algorithm, precision=precision,
                        callbacks=[losses, *callbacks], log_every_n_steps=1)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)
    trainer.fit(lit, train_dataloaders=loader)
    return losses.values(), [p.detach().clone() for p in lit.parameters()]


def _fit(lit, batches, clip=0.05):
    return _fit_on("cpu", lit, batches, clip)


#: Every attention of the registry (auto: full on 20 positions, i-clustered on 32), and full
#: with intermediate CTC.
PARAMETRIZED_ATTENTIONS = [
    ("full", False), ({"name": "clustered", "clusters": 3, "seed": 1}, False), ("full", True),
    ({"name": "i-clustered", "clusters": 3, "topk": 4}, False), ({"name": "topk", "k": 4}, False),
    ({"name": "lsh", "rounds": 1, "chunk": 8, "buckets": 4}, False),
    ({"name": "auto", "crossover": 25, "clusters": 3, "topk": 4}, False)]


@pytest.mark.parametrize("attention,inter", PARAMETRIZED_ATTENTIONS)
def test_a_split_step_through_lightnings_hooks_trains_as_the_eager_step(attention, inter):
    """The captured step's plumbing (static inputs, forward, CTC between, backward, clipping and
    RAdam as three replayed parts, through Lightning's hooks) with the stand-in backend, which
    runs what it recorded at each replay, for every attention of the registry: the same losses
    and parameters as eager training."""
    from fastasr.attention import available, build_attention

    assert {a if isinstance(a, str) else a["name"] for a, _ in PARAMETRIZED_ATTENTIONS} == set(available())
    shared_qk = getattr(build_attention(attention), "requires_shared_qk", False)
    batches = _batches()
    eager_losses, eager_params = _fit(_lit(attention, inter=inter, shared_qk=shared_qk), batches)
    lit = _lit(attention, capture=True, inter=inter, shared_qk=shared_qk)
    lit.captured = CapturedSteps(lit.model, True, warmup=1, backend=EagerGraphs())
    losses, params = _fit(lit, batches)
    assert losses == eager_losses
    for a, b in zip(params, eager_params):
        assert torch.equal(a, b)
    summary = lit.captured.summary()
    assert sorted(summary["captured"]) == [(2, 64, 20), (3, 40, 20)]  # each shape after its one eager step
    assert summary["seen"] == {(3, 40, 20): 2, (2, 64, 20): 2} and not summary["failed"]


def test_shapes_past_max_shapes_and_before_their_warmup_run_eagerly():
    lit = _lit()
    steps = CapturedSteps(lit.model, True, warmup=2, max_shapes=1, backend=EagerGraphs())
    steps.active = True
    calls = []

    def run(f, n):
        calls.append(tuple(f.shape))
        return [lit.model(f, n)[0]], n

    for batch in _batches(shapes=((3, 40), (2, 64), (3, 40), (2, 64), (3, 40), (2, 64)), steps=6):
        out = steps.forward(batch, run)
        assert (out is None) == (steps.current is None)
    assert steps.summary()["captured"] == [(3, 40, 20)]  # its third step; the second shape: none left
    assert steps.summary()["seen"] == {(3, 40, 20): 3, (2, 64, 20): 3}


class _Failing(EagerGraphs):
    def __init__(self, part):
        self.part, self.count = part, 0

    def capture(self, fn):
        self.count += 1
        if self.count == {"forward": 1, "backward": 2, "update": 3}[self.part]:
            raise RuntimeError("operation not permitted when stream is capturing")
        return super().capture(fn)


@pytest.mark.parametrize("part", ["forward", "backward", "update"])
def test_a_failed_capture_warns_once_and_the_run_trains_as_eager(part):
    batches = _batches(shapes=((3, 40),), steps=5)
    eager_losses, eager_params = _fit(_lit(), batches)
    lit = _lit(capture=True)
    lit.captured = CapturedSteps(lit.model, True, backend=_Failing(part))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses, params = _fit(lit, batches)
    ours = [w for w in caught if "capture_steps" in str(w.message)]
    assert len(ours) == 1
    assert "(3, 40, 20)" in str(ours[0].message) and f"capturing its {part} failed" in str(ours[0].message)
    assert "operation not permitted" in str(ours[0].message)
    assert lit.captured.summary()["failed"].keys() == {(3, 40, 20)}
    torch.testing.assert_close(losses, eager_losses, rtol=1e-6, atol=1e-6)
    for a, b in zip(params, eager_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_capture_forced_on_a_cpu_runs_eagerly_with_one_clear_warning(caplog):
    batches = _batches(steps=4)
    eager_losses, eager_params = _fit(_lit(), batches)
    lit = _lit(capture=True)
    with caplog.at_level(logging.WARNING, logger="fastasr.training.captured_step"):
        losses, params = _fit(lit, batches)
    messages = [r.getMessage() for r in caplog.records if r.name == "fastasr.training.captured_step"]
    assert messages == ["capture_steps=True: every training step runs eagerly (CUDA graphs need a CUDA device; "
                        "this run trains on cpu)"]
    assert not lit.captured.active and lit.captured.summary()["captured"] == []
    assert losses == eager_losses and all(torch.equal(a, b) for a, b in zip(params, eager_params))


@pytest.mark.parametrize("world,ddp,accumulate,reason", [
    (2, None, 1, "2 processes without a DistributedDataParallel wrapper (NoneType): no all-reduce of the "
                 "gradients to move into the step"),
    (1, None, 4, "gradients accumulated over 4 batches (trainer.accumulate_grad_batches): a captured backward "
                 "writes each batch's gradients afresh")])
def test_steps_that_cannot_be_captured_run_eagerly_and_say_why(world, ddp, accumulate, reason, caplog):
    lit = _lit()
    steps = CapturedSteps(lit.model, True, backend=EagerGraphs())
    optimizer = torch.optim.RAdam(lit.parameters())
    with caplog.at_level(logging.WARNING, logger="fastasr.training.captured_step"):
        assert not steps.start(torch.device("cpu"), optimizer, world, ddp=ddp, accumulate=accumulate)
    assert [r.getMessage() for r in caplog.records] == [f"capture_steps=True: every training step runs eagerly "
                                                        f"({reason})"]
    assert not steps.active
    steps.reduce_gradients()  # inactive: no collective (none is initialised here)


def test_with_capture_off_the_module_has_no_captured_steps():
    assert _lit().captured is None and _lit(capture=False).captured is None


def test_the_setting_is_in_the_config_documented_and_auto_is_off_on_a_cpu(monkeypatch):
    from fastasr.training.derived_config import resolve_train_config

    text = (CONFIG_DIR / "train.yaml").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("capture_steps:"))
    assert line.split("#")[0].split(":")[1].strip() == "auto"
    assert "CUDA graphs" in line and "auto = on for one CUDA device" in line and "off on a CPU" in line
    data = (CONFIG_DIR / "data" / "manifest.yaml").read_text()
    assert "batch_shapes: auto" in data and "shape_buckets:" in data
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = OmegaConf.create({"capture_steps": "auto", "trainer": {"accelerator": "auto", "devices": 1},
                            "data": {"batch_shapes": "auto"}})
    resolve_train_config(cfg)
    assert cfg.capture_steps is False and cfg.data.batch_shapes is False
    cfg = OmegaConf.create({"capture_steps": True, "trainer": {"accelerator": "cpu"}, "data": {"batch_shapes": "auto"}})
    assert resolve_train_config(cfg).data.batch_shapes is True


def test_auto_is_on_for_one_cuda_device_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert capture_wanted("auto", "auto") is True
    assert capture_wanted("auto", "gpu", 1, "auto") is True
    assert capture_wanted("auto", "cpu") is False
    assert capture_wanted("auto", "gpu", 2, "ddp") is False
    assert capture_wanted("auto", "gpu", 1, "auto", streaming={"chunk_sizes": [16]}) is False
    assert capture_wanted(False, "gpu") is False and capture_wanted(True, "cpu") is True
    with pytest.raises(ValueError, match="capture_steps"):
        capture_wanted("sometimes", "gpu")


_HOST_READS = ("item", "tolist", "cpu", "numpy")


@pytest.mark.parametrize("attention", ["full", {"name": "clustered", "clusters": 3}, {"name": "i-clustered", "clusters": 3, "topk": 4},
                                       {"name": "lsh", "rounds": 1, "chunk": 8, "buckets": 4}, {"name": "topk", "k": 4}])
def test_the_training_step_reads_nothing_back_to_the_host(attention, monkeypatch):
    """No ``.item()``, ``.tolist()``, ``.cpu()`` or ``.numpy()`` in the forward, loss and backward
    of a training step (each a host synchronisation on a GPU; ``self.log`` keeps tensors on the
    device). The CTC's lengths are the batch's host tensors, which torch's CUDA CTC reads there."""
    from fastasr.attention import build_attention

    lit = _lit(attention, shared_qk=getattr(build_attention(attention), "requires_shared_qk", False))
    batch = _batches(steps=1)[0]
    lit.log = lambda *a, **k: None  # outside a trainer
    called = []
    for name in _HOST_READS:
        original = getattr(torch.Tensor, name)

        def reading(self, *args, _name=name, _original=original, **kwargs):
            called.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, reading)
    loss = lit.training_step(batch, 0)
    loss.backward()
    monkeypatch.undo()
    assert called == []


def test_a_captured_runs_checkpoint_resumes_in_an_eager_run_on_the_cpu(tmp_path):
    """A captured run's optimiser is capturable, its learning rate a device tensor; its
    checkpoint saves the state as an eager run keeps it, so a CPU run (where a capturable RAdam
    refuses to step) resumes from it, and its own steps go on from the saved ones."""
    from fastasr.training.checkpoint_io import portable_optimizer_state

    lit = _lit(capture=True)
    lit.captured = CapturedSteps(lit.model, True, warmup=1, backend=EagerGraphs())
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(lit, train_dataloaders=torch.utils.data.DataLoader(_batches(steps=2), batch_size=None))
    (optimizer,) = trainer.optimizers
    for group in optimizer.param_groups:  # as make_capturable leaves them on a GPU
        group["capturable"], group["lr"] = True, torch.tensor(float(group["lr"]))
    trainer.save_checkpoint(tmp_path / "captured.ckpt")
    (state,) = torch.load(tmp_path / "captured.ckpt", weights_only=True)["optimizer_states"]
    assert [(g["capturable"], type(g["lr"])) for g in state["param_groups"]] == [(False, float)]
    assert {float(s["step"]) for s in state["state"].values()} == {2.0}

    resumed = torch.optim.RAdam(lit.parameters(), **{k: v for k, v in RADAM.items() if k[0] != "_"})
    resumed.load_state_dict(state)
    for p in lit.parameters():
        p.grad = torch.ones_like(p)
    resumed.step()
    assert {float(s["step"]) for s in resumed.state.values()} == {3.0}

    raw = optimizer.state_dict()  # unmade portable, the same load refuses to step on the CPU
    fresh = torch.optim.RAdam(lit.parameters(), **{k: v for k, v in RADAM.items() if k[0] != "_"})
    fresh.load_state_dict(raw)
    with pytest.raises(AssertionError, match="capturable=True"):
        fresh.step()
    portable_optimizer_state(raw)
    fresh.load_state_dict(raw)
    fresh.step()


def _poisoned(batches, steps, value=float("nan")):
    for i in steps:
        batches[i]["features"] = batches[i]["features"] * value
    return batches


def test_a_nonfinite_captured_step_is_undone_on_the_device_as_an_eager_skip():
    """``callbacks.nonfinite_loss`` in a captured step: the update graph undoes the update of a
    NaN batch on the device, leaving the parameters and the optimiser's state as the eager
    step's skip does; the guard counts it from the outcome it reads back later, and reads no
    value back in the step itself."""
    from fastasr.training.callbacks.nonfinite_loss import NonFiniteLossGuard

    class Counting(NonFiniteLossGuard):  # the host's verdicts: a read back each
        reads = 0

        def _finite(self, trainer, pl_module):
            self.reads += 1
            return super()._finite(trainer, pl_module)

    batches = _poisoned(_batches(), [4])  # shape (3, 40)'s third step: replayed
    eager_guard, guard = Counting(), Counting()
    eager = _lit()
    eager_losses, eager_params = _fit_on("cpu", eager, batches, callbacks=[eager_guard])
    lit = _lit(capture=True)
    lit.captured = CapturedSteps(lit.model, True, warmup=1, backend=EagerGraphs())
    losses, params = _fit_on("cpu", lit, batches, callbacks=[guard])
    assert lit.captured.guard is not None and sorted(lit.captured.summary()["captured"]) == [(2, 64, 20), (3, 40, 20)]
    assert eager_guard.skipped == guard.skipped == 1
    assert (eager_guard.reads, guard.reads) == (8, 2)  # the captured run's: its two shapes' eager steps
    assert losses[:4] == eager_losses[:4] and losses[5:] == eager_losses[5:]
    assert torch.isnan(torch.tensor(losses[4])) and torch.isnan(torch.tensor(eager_losses[4]))
    for a, b in zip(params, eager_params):
        assert torch.equal(a, b)
    for p, q in zip(lit.parameters(), eager.parameters()):  # RAdam's moments and step counts too
        state, eager_state = lit.trainer.optimizers[0].state[p], eager.trainer.optimizers[0].state[q]
        assert all(torch.equal(state[k], eager_state[k]) for k in eager_state)


class _Metrics(L.pytorch.loggers.logger.Logger):
    """The metrics Lightning logs, by step."""

    name, version = "metrics", 0

    def __init__(self):
        super().__init__()
        self.rows = {}

    def log_hyperparams(self, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.rows.setdefault(step, {}).update(metrics)


class _Norms(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the gradient norms taken (foreach norms: ``get_total_norm``, ``clip_grad_norm_``)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._foreach_norm.Scalar
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("clip_algorithm", ["norm", "value"])
def test_a_captured_update_takes_one_norm_and_logs_it_as_the_eager_step(clip_algorithm):
    """The update graph takes the gradients' norm once: the non-finite guard's verdict, the
    clipping by norm and the ``train/grad_norm`` log share it (an eager step takes three: the
    guard's, the log's and the clipping's). The logged norms and the parameters are the eager
    run's; a skipped NaN batch logs NaN in both."""
    from fastasr.training.callbacks.nonfinite_loss import NonFiniteLossGuard

    def fit(lit):
        logger, norms = _Metrics(), _Norms()
        with norms:
            _, params = _fit_on("cpu", lit, _poisoned(_batches(), [4]), clip={"norm": 0.05, "value": 0.01}[clip_algorithm],
                                callbacks=[NonFiniteLossGuard()], logger=logger, clip_algorithm=clip_algorithm)
        return [logger.rows.get(step, {}).get("train/grad_norm") for step in range(8)], params, norms.count

    eager_norms, eager_params, eager_count = fit(_lit())
    lit = _lit(capture=True)
    lit.captured = CapturedSteps(lit.model, True, warmup=1, backend=EagerGraphs())
    norms, params, count = fit(lit)
    assert sorted(lit.captured.summary()["captured"]) == [(2, 64, 20), (3, 40, 20)]
    per_eager_step = 3 if clip_algorithm == "norm" else 2  # the eager NaN step: the guard's alone
    assert eager_count == 7 * per_eager_step + 1 and count == 2 * per_eager_step + 6  # six steps replayed
    assert norms[:4] == eager_norms[:4] and norms[5:] == eager_norms[5:] and None not in norms
    assert math.isnan(norms[4]) and math.isnan(eager_norms[4])  # not the step before's norm again
    for a, b in zip(params, eager_params):
        assert torch.equal(a, b)


def test_nonfinite_captured_steps_in_a_row_stop_the_run_a_few_steps_later():
    from fastasr.training.callbacks.nonfinite_loss import (
        READ_BACK_LAG,
        NonFiniteLossError,
        NonFiniteLossGuard,
    )

    lit = _lit(capture=True)
    lit.captured = CapturedSteps(lit.model, True, warmup=1, backend=EagerGraphs())
    with pytest.raises(NonFiniteLossError, match="3 consecutive batches") as err:
        _fit_on("cpu", lit, _poisoned(_batches(steps=8), range(2, 8)), callbacks=[NonFiniteLossGuard(3)])
    assert "step 2: 2-0 2-1 2-2; step 3: 3-0 3-1; step 4: 4-0 4-1 4-2" in str(err.value)
    assert lit.trainer.global_step == 4 + READ_BACK_LAG + 1  # read at step 6's end
    assert all(torch.isfinite(p).all() for p in lit.parameters())


class _HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every read of a tensor's value back to the host: ``.item()``, ``bool()``,
    ``float()``, and a tensor given where an operator takes a host scalar (each a
    synchronisation on a GPU, which no CUDA graph's capture holds)."""

    READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)

    def __init__(self, reads):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


class _Recording(EagerGraphs):
    """The stand-in backend, each replay under :class:`_HostReads`."""

    def __init__(self):
        self.reads, self.replays = [], 0

    def capture(self, fn):
        from fastasr.training.graph_backends import Graph

        def replay():
            self.replays += 1
            with _HostReads(self.reads):
                return fn()

        return Graph(replay)


@pytest.mark.parametrize("attention,inter", PARAMETRIZED_ATTENTIONS)
def test_the_captured_parts_read_nothing_back_to_the_host(attention, inter, monkeypatch):
    """What a CUDA graph would hold (the forward, the backward, and the update with clipping and
    the non-finite guard's device skip, a NaN batch among them) reads no value back: a read
    would fail the capture on a GPU. Two CPU-only reads are left out: RAdam's step counts (a
    CPU refuses its ``capturable`` mode, which a GPU run takes: ``make_capturable``, torch's
    path made for graphs) and the attention's lengths check (a device-side assert on a GPU)."""
    from torch.utils._python_dispatch import _disable_current_modes

    import fastasr.attention.base
    from fastasr.attention import build_attention
    from fastasr.training.callbacks.nonfinite_loss import NonFiniteLossGuard

    def unrecorded(fn):
        def call(*args, **kwargs):
            with _disable_current_modes():
                return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(torch.optim.RAdam, "step", unrecorded(torch.optim.RAdam.step))
    monkeypatch.setattr(fastasr.attention.base, "check_lengths", unrecorded(fastasr.attention.base.check_lengths))

    shared_qk = getattr(build_attention(attention), "requires_shared_qk", False)
    lit = _lit(attention, capture=True, inter=inter, shared_qk=shared_qk)
    backend = _Recording()
    lit.captured = CapturedSteps(lit.model, True, warmup=1, backend=backend)
    guard = NonFiniteLossGuard()
    _fit_on("cpu", lit, _poisoned(_batches(), [4]), callbacks=[guard])
    assert backend.replays == 3 * 6 and guard.skipped == 1  # six replayed steps, three parts each
    assert backend.reads == []
