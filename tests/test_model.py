"""The acoustic model: shapes, padding independence, attention swapping, overfitting a batch."""

import pytest
import torch
import torch.nn.functional as F

from fastasr.model import CTCModel, SinusoidalPositionalEncoding


def small_model(**kw) -> CTCModel:
    args = dict(vocab_size=11, feat_in=20, d_model=32, heads=2, ff_dim=64, layers=2, dropout=0.0)
    args.update(kw)
    return CTCModel(**args)


def test_positional_encoding_values():
    pe = SinusoidalPositionalEncoding(8)
    tab = pe.table(5, torch.device("cpu"), torch.float32)
    assert tab.shape == (5, 8)
    # position 0: sin(0)=0 on even dims, cos(0)=1 on odd dims
    assert torch.equal(tab[0, 0::2], torch.zeros(4)) and torch.equal(tab[0, 1::2], torch.ones(4))
    # dim 0 is sin(pos) (frequency 1)
    torch.testing.assert_close(tab[:, 0], torch.sin(torch.arange(5.0)))
    # a longer request grows the table and keeps the values
    torch.testing.assert_close(pe.table(3000, torch.device("cpu"), torch.float32)[:5], tab)


def test_rotary_scores_depend_on_the_offset_alone():
    """rotate(q)_n · rotate(k)_m is a function of n − m: shifting both positions keeps it."""
    from fastasr.model.positional import RotaryPositions

    torch.manual_seed(0)
    rope = RotaryPositions(8)
    q, k = torch.randn(8), torch.randn(8)
    seq_q, seq_k = q.expand(1, 1, 300, 8), k.expand(1, 1, 300, 8)  # the same vector at every position
    rq, rk = rope(seq_q.contiguous())[0, 0], rope(seq_k.contiguous())[0, 0]
    score = lambda n, m: float(rq[n] @ rk[m])  # noqa: E731
    assert score(5, 2) == pytest.approx(score(205, 202), abs=1e-4)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)
    torch.testing.assert_close(rq[0], q)  # position 0 is not turned
    torch.testing.assert_close(rq.norm(dim=-1), q.norm().expand(300))  # a rotation keeps the norm
    with pytest.raises(ValueError, match="even head dimension"):
        RotaryPositions(7)


def test_without_positions_the_model_is_blind_to_frame_order():
    """positions=none, no convolutions: permuting the frames permutes the outputs, the same
    model with sinusoids or rotary positions is not (so the option reaches the encoder)."""
    torch.manual_seed(0)
    feats, lengths = torch.randn(1, 40, 20), torch.tensor([40])
    perm = torch.randperm(40)
    for positions, blind in (("none", True), ("absolute", False), ("rotary", False)):
        torch.manual_seed(1)
        model = small_model(positions=positions).eval()
        with torch.no_grad():
            out, _ = model(feats, lengths)
            permuted, _ = model(feats[:, perm], lengths)
        assert torch.allclose(out[:, perm], permuted, atol=1e-5) == blind, positions
    assert not any(isinstance(m, SinusoidalPositionalEncoding) for m in small_model(positions="rotary").modules())
    with pytest.raises(ValueError, match=r"model.positions='relative'; expected one of"):
        small_model(positions="relative")


def _encoder_input(model: CTCModel, feats: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """What ``model``'s encoder receives for this batch (a forward pre-hook on it)."""
    captured: list[torch.Tensor] = []
    hook = model.encoder.register_forward_pre_hook(lambda module, args: captured.append(args[0]))
    with torch.no_grad():
        model(feats, lengths)
    hook.remove()
    return captured[0]


def test_xscaling_multiplies_the_front_end_output_by_sqrt_d_before_the_positions():
    """xscaling=True: the encoder's input is sqrt(d_model) · front end + sinusoids; without it
    (the default, so checkpoints saved before the option rebuild unchanged) front end + sinusoids."""
    feats, lengths = torch.randn(2, 30, 20), torch.tensor([30, 17])
    inputs = {}
    for xscaling in (False, True):
        torch.manual_seed(3)
        inputs[xscaling] = _encoder_input(small_model(xscaling=xscaling).eval(), feats, lengths)
    table = SinusoidalPositionalEncoding(32).table(30, torch.device("cpu"), torch.float32)
    front_end = inputs[False] - table
    torch.testing.assert_close(inputs[True] - table, front_end * 32 ** 0.5)
    assert not torch.allclose(inputs[True], inputs[False])
    assert small_model().input_scale == 1.0


def test_forward_shapes_and_log_probs():
    model = small_model().eval()
    feats = torch.randn(3, 25, 20)
    lengths = torch.tensor([25, 10, 1])
    log_probs, out_lengths = model(feats, lengths)
    assert log_probs.shape == (3, 25, 11)
    assert torch.equal(out_lengths, lengths)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(3, 25))


@pytest.mark.parametrize("spec, conv_kernel, subsampling, positions", [
    ("full", None, 1, "absolute"), ("topk-4", None, 1, "absolute"), ("full", 5, 1, "absolute"),
    ("full", None, 4, "absolute"), ("full", 5, 8, "absolute"), ("full", None, 1, "rotary"),
    ("i-clustered-3", 5, 4, "none"),
])
def test_padding_does_not_change_valid_outputs(spec, conv_kernel, subsampling, positions):
    """An utterance decoded in a padded batch gives what it gives alone (with the convolution
    module too: padded frames must not reach valid ones through its depthwise conv)."""
    torch.manual_seed(0)
    model = small_model(attention=spec, conv_kernel=conv_kernel, subsampling=subsampling, positions=positions).eval()
    if conv_kernel:  # a strong depthwise kernel: any leak of the padding would show
        torch.nn.init.normal_(model.encoder.layers[0].conv.depthwise.weight, std=1.0)
    a, b = torch.randn(1, 30, 20), torch.randn(1, 10, 20)  # 10 frames: after the first stride-2 conv an odd count (5), whose last frame sees padding
    batch = torch.full((2, 30, 20), 5.0)  # padding far from the data
    batch[0], batch[1, :10] = a[0], b[0]
    lp, out = model(batch, torch.tensor([30, 10]))
    lp_b, out_b = model(b, torch.tensor([10]))
    n = int(out_b[0])  # 10 frames, or fewer after subsampling (the conv front end: every frame of it)
    assert int(out[1]) == n
    torch.testing.assert_close(lp[1, :n], lp_b[0, :n], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(lp).all()


def test_convolution_module_shape_and_checks():
    from fastasr.model.encoder import ConvolutionModule

    model = small_model(conv_kernel=3)
    assert all(layer.conv.depthwise.kernel_size == (3,) for layer in model.encoder.layers)
    assert sum(p.numel() for p in model.parameters()) > sum(p.numel() for p in small_model().parameters())
    with pytest.raises(ValueError, match="model.conv_kernel 4; expected an odd"):
        ConvolutionModule(32, 4)
    with pytest.raises(ValueError, match="norm_first"):
        small_model(conv_kernel=3, norm_first=False)


def test_set_attention_swaps_every_layer_and_keeps_parameters():
    model = small_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.set_attention("i-clustered-3")
    assert model.attention_spec == "i-clustered-3"
    assert all(layer.attn.inner.spec == "i-clustered-3" for layer in model.encoder.layers)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_lsh_needs_shared_qk():
    with pytest.raises(ValueError, match="shared_qk"):
        small_model(attention="lsh-1")
    model = small_model(attention="lsh-1", shared_qk=True)
    assert model.encoder.layers[0].attn.k_proj is None
    lp, _ = model(torch.randn(2, 40, 20), torch.tensor([40, 33]))
    assert torch.isfinite(lp).all()


@pytest.mark.parametrize("shared_qk", [False, True])
def test_capture_attention_gives_the_layers_queries_and_keys(shared_qk):
    """capture_attention(i) hands over exactly the q, k (and lengths) layer i's inner attention
    receives: the layer's own projections of its input, split into heads."""
    torch.manual_seed(0)
    model = small_model(layers=3, subsampling=2, shared_qk=shared_qk).eval()
    layer = model.attention_layers()[-1]
    assert model.attention_layers() == [block.attn for block in model.encoder.layers]
    seen = {}
    handle = layer.register_forward_pre_hook(lambda module, args: seen.update(x=args[0]))
    feats, lengths = torch.randn(2, 30, 20), torch.tensor([30, 17])
    with model.capture_attention(-1) as captured:
        assert captured.q is None and captured.calls == 0
        _, out_lengths = model(feats, lengths)
    handle.remove()
    b, n, d = seen["x"].shape
    expected_q = layer.q_proj(seen["x"]).view(b, n, 2, d // 2).transpose(1, 2)
    assert captured.layer == 2 and captured.calls == 1
    torch.testing.assert_close(captured.q, expected_q)
    assert torch.equal(captured.lengths, out_lengths) and torch.equal(out_lengths, torch.tensor([15, 9]))
    if shared_qk:
        assert captured.k is captured.q
    else:
        torch.testing.assert_close(captured.k, layer.k_proj(seen["x"]).view(b, n, 2, d // 2).transpose(1, 2))
    assert not captured.q.requires_grad
    # the hook is gone after the block: a later forward changes nothing
    model(feats[:1, :10], torch.tensor([10]))
    assert captured.calls == 1 and not layer.inner._forward_pre_hooks
    with pytest.raises(IndexError, match="3 attention layers"):
        with model.capture_attention(3):
            pass


def test_cmvn_stats_are_saved_in_state_dict():
    model = small_model()
    model.set_cmvn(torch.full((20,), 2.0), torch.full((20,), 4.0))
    state = model.state_dict()
    assert torch.equal(state["cmvn.mean"], torch.full((20,), 2.0))
    fresh = small_model()
    fresh.load_state_dict(state)
    x = torch.full((1, 3, 20), 6.0)
    lp1, _ = fresh.eval()(x, torch.tensor([3]))
    lp2, _ = model.eval()(x, torch.tensor([3]))
    torch.testing.assert_close(lp1, lp2)


def test_overfits_a_tiny_batch():
    """CTC loss on one fixed batch falls to near zero: the model, loss and lengths are wired right."""
    torch.manual_seed(0)
    model = small_model(spec_augment=None)
    feats = torch.randn(2, 40, 20)
    lengths = torch.tensor([40, 31])
    targets = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 0, 0]])
    target_lengths = torch.tensor([6, 4])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        log_probs, out_lengths = model(feats, lengths)
        loss = F.ctc_loss(log_probs.transpose(0, 1), targets, out_lengths, target_lengths)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    model.eval()
    from fastasr.decoding import ctc_greedy

    hyps = ctc_greedy(*model(feats, lengths))
    assert hyps == [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10]]


@pytest.mark.parametrize(
    "spec,shared_qk",
    [("full", False), ("full", True), ("lsh-1", True), ("lsh-4", True), ("clustered-4", False),
     ("i-clustered-4", False), ("topk-8", False), ("oracle-top", False)],
)
def test_every_variant_trains_a_few_steps_without_nan(spec, shared_qk):
    """Smoke: each attention trains the model (mixed lengths, shorter than k and C) and the loss falls."""
    torch.manual_seed(0)
    model = small_model(attention=spec, shared_qk=shared_qk, spec_augment=None)
    feats = torch.randn(3, 48, 20)
    lengths = torch.tensor([48, 30, 6])
    targets = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 0], [8, 9, 0, 0]])
    target_lengths = torch.tensor([4, 3, 2])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        log_probs, out_lengths = model(feats, lengths)
        loss = F.ctc_loss(log_probs.transpose(0, 1), targets, out_lengths, target_lengths)
        opt.zero_grad()
        loss.backward()
        assert torch.isfinite(loss)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_intermediate_ctc_outputs_are_the_tapped_layers_through_the_final_norm_and_head():
    """forward_with_intermediate: the final log-probs are forward's, and the tapped layer's are
    log_softmax(head(final_norm(output of that layer))), recomputed here layer by layer."""
    torch.manual_seed(0)
    model = small_model(layers=3, inter_ctc_layers=[2, 1], inter_ctc_weight=0.3).eval()
    assert model.inter_ctc_layers == (1, 2)
    feats, lengths = torch.randn(2, 48, 20), torch.tensor([48, 30])
    with torch.no_grad():
        final, out_lengths, inter = model.forward_with_intermediate(feats, lengths)
        plain, plain_lengths = model(feats, lengths)
        x, sub_lengths = model._encoder_input(feats, lengths)
        expected = []
        for layer in model.encoder.layers[:2]:
            x = layer(x, sub_lengths)
            expected.append(model.head(model.encoder.final_norm(x)).log_softmax(-1))
    torch.testing.assert_close(final, plain)
    assert torch.equal(out_lengths, plain_lengths) and torch.equal(out_lengths, sub_lengths)
    assert len(inter) == 2 and all(t.shape == final.shape for t in inter)
    for got, want in zip(inter, expected):
        torch.testing.assert_close(got, want)
    assert not torch.allclose(inter[0], final)  # a different layer's output, not a copy
    # without taps the same call gives no intermediate outputs
    _, _, none = small_model().eval().forward_with_intermediate(feats, lengths)
    assert none == []


@pytest.mark.parametrize("layers, weight, message", [
    ([0], 0.3, r"model.inter_ctc_layers=\[0\]: expected distinct layer numbers in 1..2"),
    ([3], 0.3, r"model.inter_ctc_layers=\[3\]: expected distinct layer numbers in 1..2"),
    ([1, 1], 0.3, r"model.inter_ctc_layers=\[1, 1\]"),
    ([1], 0.0, r"model.inter_ctc_weight=0.0: expected a value in \(0, 1\)"),
    ([1], 1.0, r"model.inter_ctc_weight=1.0: expected a value in \(0, 1\)"),
    ([], 0.3, r"model.inter_ctc_weight=0.3 but model.inter_ctc_layers is empty"),
])
def test_intermediate_ctc_settings_are_checked(layers, weight, message):
    with pytest.raises(ValueError, match=message):
        small_model(layers=3, inter_ctc_layers=layers, inter_ctc_weight=weight)


def _lit_module(**model):
    """A LightningModule over a small full-attention model (``model``: its config's changes) and
    a character tokenizer of "abc cab", seeded; the module and its tokenizer."""
    from fastasr.data.manifest import Utterance
    from fastasr.data.tokenizer import Tokenizer
    from fastasr.recognition.recogniser import Recogniser
    from fastasr.training.lit import ASRLitModule

    tok = Tokenizer.build([Utterance("a", "/a.wav", 1.0, "abc cab")], "char")
    config = {"_target_": "fastasr.model.CTCModel", "d_model": 32, "heads": 2, "ff_dim": 64, "layers": 2,
              "dropout": 0.0, "subsampling": 2, "spec_augment": None, "attention": "full", **model}
    torch.manual_seed(0)
    return ASRLitModule(Recogniser.from_model_config(config, tok, {"num_mel_bins": 20})), tok


def test_the_training_loss_mixes_final_and_intermediate_ctc_by_the_weight():
    """(1 - w) * CTC(final) + w * mean over taps of CTC(tap), each CTC in nats per label."""
    lit, tok = _lit_module(layers=3, inter_ctc_layers=[1, 2], inter_ctc_weight=0.25)
    abc, cab_c = tok.encode("abc"), tok.encode("cab c")
    assert len(abc) == 3 and len(cab_c) >= 4
    targets = torch.tensor([abc + [0], cab_c[:4]])
    batch = {"ids": ["u1", "u2"], "features": torch.randn(2, 40, 20), "feature_lengths": torch.tensor([40, 32]),
             "targets": targets, "target_lengths": torch.tensor([3, 4])}
    lit.train()
    loss = lit._training_loss(batch)
    with torch.no_grad():
        final, out_lengths, inter = lit.model.forward_with_intermediate(batch["features"], batch["feature_lengths"])

    def ctc(lp):
        per = F.ctc_loss(lp.transpose(0, 1), targets, out_lengths, batch["target_lengths"], reduction="none",
                         zero_infinity=True)
        return (per / batch["target_lengths"]).mean()

    want = 0.75 * ctc(final) + 0.25 * (ctc(inter[0]) + ctc(inter[1])) / 2
    torch.testing.assert_close(loss.detach(), want)
    assert not torch.allclose(want, ctc(final))  # the intermediate part changes the loss


def test_grad_norm_is_logged_as_a_device_tensor_without_reading_back(monkeypatch):
    """``train/grad_norm``: the gradients' L2 norm (Lightning's ``grad_norm`` total), logged as a
    tensor on the gradients' device with no value read back to the host (each read a sync on a
    GPU; Lightning's ``grad_norm`` reads every parameter's norm). On the meta device, where any
    read raises, it is a meta tensor."""
    from lightning.pytorch.utilities import grad_norm

    lit, tok = _lit_module()
    batch = {"ids": ["u1", "u2"], "features": torch.randn(2, 40, 20), "feature_lengths": torch.tensor([40, 32]),
             "targets": torch.tensor([tok.encode("abc"), tok.encode("cab")]), "target_lengths": torch.tensor([3, 3])}
    lit.train()
    lit._training_loss(batch).backward()
    logged = {}
    monkeypatch.setattr(lit, "log", lambda name, value, **kw: logged.update({name: value}))
    lit.on_before_optimizer_step(None)
    want = grad_norm(lit.model, norm_type=2)["grad_2.0_norm_total"]
    torch.testing.assert_close(logged["train/grad_norm"], want, rtol=1e-5, atol=0)
    lit.model.to("meta")
    for p in lit.model.parameters():
        p.grad = torch.empty_like(p)
    with pytest.raises(RuntimeError, match="meta"):  # a read back, as Lightning's grad_norm makes
        grad_norm(lit.model, norm_type=2)
    lit.on_before_optimizer_step(None)
    assert logged["train/grad_norm"].device.type == "meta"


@pytest.mark.parametrize("config", [
    {"subsampling": 1, "positions": "absolute"},  # the paper's model
    {"subsampling": 4, "positions": "rotary", "conv_kernel": 15, "utterance_cmvn": True, "inter_ctc_layers": [1],
     "inter_ctc_weight": 0.3, "spec_augment": {"freq_masks": 2, "freq_width": 8, "time_masks": 2, "time_width": 20,
                                               "max_time_ratio": 0.2}},  # a recorded-speech recipe's
    {"subsampling": 2, "norm_first": False},  # post-norm
    {"subsampling": 4, "streaming": {"chunk_sizes": [4], "full_context": 0.0, "left_frames": 8}},  # chunked
    {"subsampling": 1, "positions": "absolute", "attention": "clustered-8"},  # the paper's, clustered
    {"subsampling": 1, "positions": "absolute", "attention": "i-clustered-8"},
], ids=["paper", "recipe", "post-norm", "chunked", "paper-clustered", "paper-i-clustered"])
def test_a_training_step_moves_nothing_between_host_and_device(config):
    """Forward in training mode, backward, clipping and a RAdam update on the meta device, where
    reading a value back to the host raises: on a GPU such a read is a synchronisation, the
    host waiting for the GPU to drain before it issues the next kernel. Nor does the step copy
    a tensor from the host to the device (a dispatch mode sees every op): a blocking copy on a
    GPU, and what a step captured as a CUDA graph cannot hold. (CTC's lengths are torch's: its
    CUDA CTC copies them to the host; a sum of the log-probabilities stands in.)"""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class _HostToDevice(TorchDispatchMode):  # ops that take a host tensor (not a scalar) to the device
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if (any(isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim() > 0
                    for t in tree_leaves((args, kwargs)))
                    and any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in tree_leaves(out))):
                self.ops.append(str(func))
            return out

    torch.manual_seed(0)
    model = CTCModel(vocab_size=12, feat_in=20, d_model=32, heads=2, ff_dim=64, layers=2, dropout=0.1,
                     **{"attention": "full", **config}).to("meta").train()
    feats, lengths = torch.empty(3, 64, 20, device="meta"), torch.empty(3, dtype=torch.long, device="meta")
    copies = _HostToDevice()
    with copies:
        if config.get("inter_ctc_layers"):
            log_probs, out_lengths, inter = model.forward_with_intermediate(feats, lengths)
            loss = log_probs.float().sum() + sum(lp.float().sum() for lp in inter)
        else:
            log_probs, out_lengths = model(feats, lengths)
            loss = log_probs.float().sum()
        assert log_probs.device.type == out_lengths.device.type == "meta"
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        torch.optim.RAdam(model.parameters(), lr=1e-4, weight_decay=0.01).step()
        torch.ones(2).to("meta")  # the mode's own check: a copy it must see
    assert copies.ops == ["aten._to_copy.default"], copies.ops
    assert all(p.grad is not None and p.device.type == "meta" for p in model.parameters() if p.requires_grad)
    with pytest.raises((RuntimeError, NotImplementedError), match="meta"):  # a read back raises
        float(loss.detach())


def test_pre_norm_layers_cast_their_norms_output_once_with_the_switch(monkeypatch):
    """``layer_norm.CAST_ONCE``: a pre-norm layer's norms (``cast_output``) give autocast's dtype,
    so the queries', keys' and values' projections read one cast instead of casting the same
    float32 output three times, forward and back; the same output (the projections read the
    same values) and gradients within bf16's rounding (theirs summed in bf16). Off: torch's
    layer norm as it is. (A float32 residual stream, as CUDA autocast keeps it: its layer norms
    run in float32.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    from fastasr.kernels.layers import layer_norm
    from fastasr.model.encoder import EncoderLayer

    B, N, d = 2, 24, 32

    class _Casts(TorchDispatchMode):  # (B, N, d) activations cast, or their gradients cast back
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and tuple(args[0].shape) == (B, N, d):
                self.count += 1
            return func(*args, **(kwargs or {}))

    def run(cast_once: bool):
        monkeypatch.setattr(layer_norm, "CAST_ONCE", cast_once)
        torch.manual_seed(0)
        layer = EncoderLayer(d, 2, 64, "full", dropout=0.0).train()
        x = torch.randn(B, N, d, generator=torch.Generator().manual_seed(1)).requires_grad_()
        casts = _Casts()
        with casts:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = layer(x, torch.tensor([N, N - 4]))
            out.float().square().sum().backward()
        grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
        return out.detach(), x.grad, grads, casts.count

    ref_out, ref_dx, ref_grads, ref_casts = run(False)
    out, dx, grads, casts = run(True)
    assert ref_casts - casts == 4  # norm1's output: 3 casts -> 1, forward and back
    assert out.dtype == ref_out.dtype == torch.float32 and torch.equal(out, ref_out)
    torch.testing.assert_close(dx, ref_dx, atol=2e-2, rtol=2e-2)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], atol=2e-2, rtol=2e-2, msg=name)
