"""The one step that fills in the values of a training config that follow from other values.

The YAML under ``conf/`` holds plain values and ``${}`` references; a value that follows from others
by a rule is marked ``auto`` there and filled in here, by :func:`resolve_train_config`, before
anything reads it. :func:`fastasr.training.fit.train` resolves and then checks
(:func:`fastasr.training.config_check.check_train_config`) once, before the config is saved as the
run's ``config.yaml`` and instantiated; ``train.py``'s preflight does the same once before the run
directory exists (:mod:`fastasr.cli.preflight`); the matrix and the budget study resolve every member
they compose (``fastasr.studies.matrix.members``, ``fastasr.studies.budget.members``), so what they
compare and train is what ``python train.py`` runs. ``python train.py ... --cfg job`` shows the
composed config with these keys as ``auto``; the run's first log lines (:func:`run_summary`) and
its ``config.yaml`` hold their values.

* ``data.tokenizer``: the top-level ``tokenizer`` when it is set (``python train.py tokenizer=char``;
  it wins over ``data.tokenizer``), else the data config's own (``conf/data/*.yaml``).
* ``attention`` (``???``) and ``model.shared_qk`` (null) of a matrix member
  (``conf/experiment/matrix_member_base.yaml``): what its train spec ``member`` stands for,
  :func:`train_member`, the one home of the shared-Q/K rule (``shared-full`` → full attention
  with shared Q/K; LSH → shared Q/K; the matrix's eval rules build on it, ``fastasr.studies.matrix.rules``). A value given instead is kept (the matrix refuses a member whose
  values contradict its spec: ``fastasr.studies.matrix.members.compose_member``).
* ``data.length_cost`` ``auto`` (``conf/data/manifest.yaml``): the batch price of the model's
  attention, :func:`fastasr.attention.length_cost` (``quadratic``: full, top-k; ``linear``:
  clustered, i-clustered, LSH).
* ``callbacks.model_checkpoint.monitor`` ``auto`` (``conf/callbacks/default.yaml``):
  ``val/<unit metric>`` of ``data.tokenizer``, :func:`fastasr.data.tokenizer.unit_metric`
  (``val/per`` for phonemes, ``val/cer`` for characters and subwords); the epoch checkpoints' file
  name refers to it (``${callbacks.model_checkpoint.monitor}``).
* ``trainer.precision`` ``auto`` (the recorded-speech recipe's): ``bf16-mixed`` where the device
  training runs on multiplies bfloat16 natively, else ``32-true`` (:func:`auto_precision`);
  ``bf16-on-gpu`` (the built-in recipe's): the same on a GPU, ``32-true`` on a CPU.
* ``data.num_workers`` ``auto``: :func:`auto_workers`, the machine's cores less one for the
  training process, at least 2 and at most 8.
* ``capture_steps`` ``auto`` (``conf/train.yaml``): on where a captured step runs, one CUDA
  device without DDP or chunked streaming training (:func:`fastasr.training.captured_step.capture_wanted`);
  ``data.batch_shapes`` ``auto``: ``capture_steps``'s value (padded batch shapes serve the graphs).

A value given on the command line instead of ``auto`` (``data.length_cost=linear``,
``callbacks.model_checkpoint.monitor=val/loss``) is kept. Resolving is idempotent.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from fastasr.attention import build_attention, length_cost
from fastasr.data.tokenizer import unit_metric
from fastasr.model.frontend import SpecAugment
from fastasr.training.captured_step import capture_wanted

#: The value of a key that :func:`resolve_train_config` fills in by its rule.
AUTO = "auto"
#: ``trainer.precision`` value that :func:`resolve_train_config` replaces by :func:`auto_precision`'s.
AUTO_PRECISION = AUTO
#: ``trainer.precision`` value: :func:`auto_precision`'s choice on a GPU, ``32-true`` on a CPU.
GPU_BF16_PRECISION = "bf16-on-gpu"
#: The ``trainer.precision`` values that :func:`resolve_train_config` replaces.
DERIVED_PRECISIONS = (AUTO_PRECISION, GPU_BF16_PRECISION)
#: ``data.num_workers`` value that :func:`resolve_train_config` replaces by :func:`auto_workers`'s.
AUTO_WORKERS = AUTO
#: The train spec of full attention on a model with one projection for queries and keys.
SHARED_FULL = "shared-full"


class ConfigError(ValueError):
    """One or more config values are unusable; the message lists each with its key."""


def needs_shared_qk(spec: str) -> bool:
    """Whether attention ``spec`` needs shared Q/K (LSH hashes queries and keys together);
    ValueError (from ``build_attention``) for an unknown spec."""
    return bool(build_attention(spec).requires_shared_qk)


def train_member(spec: str) -> tuple[str, bool]:
    """``(attention spec, shared_qk)`` a train spec stands for: the shared-Q/K rule.

    ``shared-full`` → ``("full", True)``; an attention that needs shared Q/K (LSH) → that
    attention with shared Q/K; any other spec → that attention, separate Q/K. Raises ValueError
    (from ``build_attention``) for an unknown spec.
    """
    if spec == SHARED_FULL:
        return "full", True
    return spec, needs_shared_qk(spec)


def native_bf16(device_type: str) -> bool:
    """Whether ``device_type`` (``"cuda"`` or ``"cpu"``) multiplies bfloat16 in hardware.

    CUDA: compute capability 8.0 or newer (``torch.cuda.is_bf16_supported(including_emulation=False)``).
    CPU: the AVX512-BF16 or AMX instructions (AMD Zen 4 and newer, Intel Cooper Lake and Sapphire
    Rapids and newer), which oneDNN's bfloat16 matrix products use; without them bfloat16 is
    emulated and slower than float32.
    """
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device_type == "cpu":
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return False


def auto_workers(cores: int | None = None) -> int:
    """``data.num_workers: auto``: ``cores`` (default: those this process may use) less one for
    the training process, at least 2 (a 2-core machine keeps its two feature workers) and at most
    8 (past that, feature extraction outruns one GPU's training step and only costs memory)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(2, min(8, cores - 1))


def auto_precision(accelerator: Any, on_cpu: bool = True) -> str:
    """``trainer.precision: auto``: ``"bf16-mixed"`` where the training device has native bfloat16
    (:func:`native_bf16`), else ``"32-true"``.

    Mixed precision keeps float32 weights, optimiser state and CTC (the model's log-probabilities
    are float32, ``fastasr.model.CTCModel``); under autocast the matrix products and convolutions
    run in bfloat16, the attention variants in their own documented precision. ``accelerator`` is
    ``trainer.accelerator``: ``auto`` trains on the GPU when one is visible, as Lightning does.
    ``on_cpu=False`` (``bf16-on-gpu``): ``"32-true"`` on a CPU, whatever it multiplies natively.
    """
    name = str(accelerator or "auto").lower()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device_type = {"gpu": "cuda", "cuda": "cuda", "cpu": "cpu"}.get(name)
    if device_type == "cpu" and not on_cpu:
        return "32-true"
    return "bf16-mixed" if device_type is not None and native_bf16(device_type) else "32-true"


def _missing(node: Any, key: str) -> bool:
    """Whether ``node`` (a DictConfig section or None) has ``key`` and it is ``???``."""
    return isinstance(node, DictConfig) and OmegaConf.is_missing(node, key)  # (`key in node` is False for ???)


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def resolve_train_config(cfg: DictConfig) -> DictConfig:
    """Fill in the derived values of a composed ``train.yaml`` config (in place; returns ``cfg``).

    Raises:
        ConfigError: ``member`` is not a train spec (the message names it). Other bad values
            (an unknown attention, tokenizer kind) leave what follows from them ``auto``, for
            :func:`fastasr.training.config_check.check_train_config` to report with its key.
    """
    data = cfg.get("data")
    if cfg.get("tokenizer") is not None and isinstance(data, DictConfig):
        data.tokenizer = cfg.tokenizer

    model = cfg.get("model")
    qk_unset = isinstance(model, DictConfig) and "shared_qk" in model and model.shared_qk is None
    if cfg.get("member") is not None and (_missing(cfg, "attention") or qk_unset):
        try:
            attention, shared_qk = train_member(str(cfg.member))
        except ValueError as err:
            raise ConfigError(f"invalid config:\n  member={cfg.member!r}: {err}") from None
        if _missing(cfg, "attention"):
            cfg.attention = attention
        if qk_unset:
            model.shared_qk = shared_qk

    if isinstance(data, DictConfig) and data.get("length_cost") == AUTO:
        spec = _plain(OmegaConf.select(cfg, "model.attention", default=None,
                                        throw_on_missing=False, throw_on_resolution_failure=False))
        try:
            data.length_cost = length_cost(spec)
        except (ValueError, KeyError, TypeError):
            pass  # an unknown attention: check_train_config names it

    checkpoint = OmegaConf.select(cfg, "callbacks.model_checkpoint", default=None)
    if (isinstance(checkpoint, DictConfig) and checkpoint.get("monitor") == AUTO and isinstance(data, DictConfig)
            and not _missing(data, "tokenizer")):
        try:
            checkpoint.monitor = f"val/{unit_metric(str(data.tokenizer))}"
        except ValueError:
            pass  # an unknown tokenizer kind: check_train_config names it

    trainer = cfg.get("trainer")
    if isinstance(trainer, DictConfig) and trainer.get("precision") in DERIVED_PRECISIONS:
        trainer.precision = auto_precision(trainer.get("accelerator"),
                                           on_cpu=trainer.get("precision") == AUTO_PRECISION)
    if isinstance(data, DictConfig) and data.get("num_workers") == AUTO_WORKERS:
        data.num_workers = auto_workers()
    if cfg.get("capture_steps") == AUTO and isinstance(trainer, DictConfig):
        cfg.capture_steps = capture_wanted(AUTO, trainer.get("accelerator"), trainer.get("devices", 1),
                                           trainer.get("strategy", "auto"),
                                           OmegaConf.select(cfg, "model.streaming", default=None))
    if isinstance(data, DictConfig) and data.get("batch_shapes") == AUTO:
        data.batch_shapes = cfg.get("capture_steps") is True
    return cfg


def _input_and_loss(features: Any, model: Any) -> str:
    """The run summary's line of what the encoder reads and what it is trained on: filterbanks,
    subsampling, input scaling, per-utterance CMVN, SpecAugment and the CTC losses."""
    rate = features.get("sample_rate")
    parts = [f"{features.get('num_mel_bins')} filterbanks at {f'{rate} Hz' if rate else 'the audio rate'}",
             f"subsampling {model.get('subsampling')}x"]
    if model.get("xscaling"):
        parts.append("input x sqrt(d_model)")
    if model.get("utterance_cmvn"):
        parts.append("per-utterance CMVN")
    masks = model.get("spec_augment")
    if masks:  # the keys a config leaves out take SpecAugment's defaults, as the model builds it
        masks = {name: p.default for name, p in inspect.signature(SpecAugment).parameters.items()} | dict(masks)
    parts.append(f"SpecAugment {masks['freq_masks']} x {masks['freq_width']} bins, "
                 f"{masks['time_masks']} x {masks['time_width']} frames" if masks else "no SpecAugment")
    layers = list(model.get("inter_ctc_layers") or [])
    loss = (f"CTC + intermediate CTC on layers {layers} (weight {model.get('inter_ctc_weight')})" if layers
            else "CTC")
    return "input: " + ", ".join(parts) + f"; loss {loss}"


def run_summary(cfg: DictConfig, choices: dict[str, Any] | None = None) -> str:
    """What a resolved config trains, in the lines a run starts with: the recipe (and the
    experiment preset, from Hydra's ``choices`` when given), the data, the model, its attention and
    dropout, its input (features, subsampling, scaling, CMVN, SpecAugment) and losses, the
    optimiser and schedule, the budget, the precision and the batches."""
    choices = choices or {}
    recipe = cfg.get("recipe") or "none"
    experiment = choices.get("experiment")
    model, trainer, data = cfg.get("model") or {}, cfg.get("trainer") or {}, cfg.get("data") or {}
    spec = _plain(model.get("attention"))
    try:
        attention = build_attention(spec).spec
    except (ValueError, KeyError, TypeError):
        attention = str(spec)
    scheduler = str((cfg.get("scheduler") or {}).get("_target_", "none")).rsplit(".", 1)[-1]
    optimiser = str((cfg.get("optim") or {}).get("_target_", "?")).rsplit(".", 1)[-1]
    streaming = model.get("streaming") or {}
    chunks = list(streaming.get("chunk_sizes") or [])
    context = (f"streaming: chunks of {chunks} frames, left {streaming.get('left_frames')}, full context "
               f"{streaming.get('full_context')}" if chunks else "full context")
    budget = ", ".join(f"{k} {trainer.get(k)}" for k in ("max_time", "max_epochs", "max_steps")
                       if trainer.get(k) not in (None, -1))
    dropout = f"dropout {model.get('dropout')}"
    by_budget = (cfg.get("callbacks") or {}).get("budget_dropout")
    if by_budget:
        dropout += f" (raised up to {by_budget.get('p')} by the epochs the budget affords: callbacks.budget_dropout)"
    lines = [
        f"recipe {recipe} (conf/recipe/{recipe}.yaml)" + (f", experiment {experiment}" if experiment else "")
        + f"; data {choices.get('data', '')}".rstrip() + f": train {data.get('train_manifest')}",
        f"model: depth {model.get('layers')}, {model.get('heads')} heads x "
        f"{int(model.get('d_model', 0)) // max(int(model.get('heads', 1)), 1)}, feed-forward {model.get('ff_dim')}, "
        f"conv kernel {model.get('conv_kernel')}, positions {model.get('positions')}, {dropout}, "
        f"attention {attention}, {context}",
        _input_and_loss(cfg.get("features") or {}, model),
        f"training: {optimiser} lr {(cfg.get('optim') or {}).get('lr')}, {scheduler}; {budget or 'no budget'}; "
        f"precision {trainer.get('precision')}; {data.get('tokenizer')} units; batches of "
        f"{data.get('max_frames_per_batch')} frames ({data.get('length_cost')} price)",
    ]
    if cfg.get("capture_steps") is True:
        lines.append(f"steps: captured as CUDA graphs per batch shape (capture_steps); batches padded to "
                     f"{data.get('shape_buckets')} shapes: {bool(data.get('batch_shapes'))} (data.batch_shapes)")
    return "\n".join(lines)
