"""Training steps captured as CUDA graphs, one set a batch shape, replayed by Lightning's loop
(``capture_steps``).

An eager step on a GPU waits for its host: ~1,000 kernel launches a step of the paper's model,
18-40 ms of host time at N = 800 on a Hopper GPU (benchmarks/gpu/notes.md "The host"). Replayed as
CUDA graphs the same step took 0.56-0.79 of its eager time (``benchmarks.step.gpu``'s graphed
columns, which time this class). :class:`CapturedSteps` is that step inside training:

* a batch's step is three graphs of its shape, replayed in turn: the model's **forward**
  (under the run's autocast, its cast cache off), its **backward** from the log-probabilities'
  gradient, and the **update**: gradient clipping (the trainer's ``gradient_clip_val`` and
  algorithm) and the optimiser's step (``capturable``, its learning rate a device tensor that
  the schedules fill), around one norm of the gradients that the clipping, the non-finite guard
  and the ``train/grad_norm`` log share (:attr:`CapturedSteps.grad_norm`). All three share one
  memory pool: each step replays one shape's three graphs in order, so a later capture may reuse
  what an earlier one freed. The pool stays reserved beside the eager steps' memory, so a
  captured run needs two steps' memory (``callbacks.largest_batches`` sizes its batches so).
* Between forward and backward, eagerly: CTC on the forward's log-probabilities (detached
  leaves), Lightning's ``backward`` of that loss into them, and the hooks Lightning runs there
  (``on_before_backward``, ``on_after_backward``); between backward and update, Lightning's
  ``on_before_optimizer_step`` hooks (``callbacks.nonfinite_loss``, which hands the loss's
  verdict to the update graph's guard).
* A shape is captured at its ``warmup + 1``-th step (its first ``warmup`` run eagerly; the
  optimiser's state exists by then), at most ``max_shapes`` shapes; every other step runs
  eagerly, as without capture. Batch shapes (``data.batch_shapes``) keep the shapes few.
* A capture that fails (an op no graph holds, memory) leaves that shape eager for the rest of
  the run, with one warning naming the shape and the reason; the step it failed in completes
  eagerly. Settings a graph bakes in (the dropout probabilities, which ``callbacks.budget_dropout``
  raises between epochs) are part of a graph's key: a change drops the graphs and captures again.

Under DDP the gradients' all-reduce moves out of DDP's backward hooks, which a replayed graph
never calls: DDP's own synchronisation is off for the run and :meth:`CapturedSteps.reduce_gradients`
averages the gradients after each backward, captured or eager, in one eager all-reduce before
the hooks and the clipping read them. DDP's buckets overlap theirs with the backward, so
``capture_steps=auto`` leaves DDP eager until a multi-GPU table shows the captured step faster;
``capture_steps=true`` captures under DDP.

Lightning stays the loop, in automatic optimisation: the module routes its hooks here
(:class:`fastasr.training.lit.ASRLitModule`: ``training_step``, ``backward``,
``configure_gradient_clipping``, ``optimizer_step``), so checkpoints, schedules, callbacks,
logging, validation and resume are Lightning's as before. Where capture cannot run
(:meth:`CapturedSteps.start`: not CUDA, several processes without a DDP wrapper, gradients
accumulated over batches, chunked streaming training, whose contexts are drawn on the host)
every step is eager, with one warning when capture was asked for explicitly. ``backend`` is what
captures (:mod:`fastasr.training.graph_backends`): :class:`CudaGraphs` on a GPU; the tests give
:class:`EagerGraphs`, which records a function and runs it at each replay, to run the plumbing on
the CPU.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from fastasr.distributed import average_gradients
from fastasr.training.graph_backends import CudaGraphs, EagerGraphs, Graph
from fastasr.training.update_guard import DeviceUpdateGuard

log = logging.getLogger(__name__)

#: ``capture_steps`` values: ``auto`` (on where it can run: one CUDA device), true, false.
CAPTURE_SETTINGS = ("auto", True, False)


def capture_wanted(setting: Any, accelerator: Any, devices: Any = 1, strategy: Any = "auto",
                   streaming: Any = None) -> bool:
    """The resolved ``capture_steps`` of a config: ``auto`` is on where a captured step can run
    and the tables show it faster (one CUDA device, no DDP, no chunked streaming training);
    ``true`` and ``false`` as given (``true`` captures under DDP too; where it cannot run it falls
    back to eager at the start of training, with a warning)."""
    if setting in (True, False):
        return bool(setting)
    if str(setting).lower() != "auto":
        raise ValueError(f"capture_steps={setting!r}; expected auto, true or false")
    name = str(accelerator or "auto").lower()
    cuda = torch.cuda.is_available() and name in ("auto", "gpu", "cuda")
    one_device = str(devices) in ("1", "auto") and (torch.cuda.device_count() <= 1 or str(devices) == "1")
    ddp = "ddp" in str(strategy or "").lower()
    return bool(cuda and one_device and not ddp and not streaming)


@dataclass
class ShapeGraphs:
    """The three graphs of one batch shape, their static inputs and outputs."""

    features: torch.Tensor
    lengths: torch.Tensor
    forward: Graph | None = None
    backward: Graph | None = None
    update: Graph | None = None
    outputs: tuple[list[torch.Tensor], torch.Tensor] | None = None
    leaves: list[torch.Tensor] = field(default_factory=list)
    grads_in: list[torch.Tensor] = field(default_factory=list)
    grads: list[torch.Tensor | None] = field(default_factory=list)


def make_capturable(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Ready ``optimizer`` for a captured update, in place (after a checkpoint's state is loaded
    into it): ``capturable`` on, each group's learning rate a float32 tensor on ``device`` (the
    schedules fill it, ``torch.optim.lr_scheduler``; a float would be baked into the graph), and
    the state's step counts on ``device``."""
    for group in optimizer.param_groups:
        if "capturable" in group:
            group["capturable"] = True
        lr = group["lr"]
        if not (isinstance(lr, torch.Tensor) and lr.device == device):
            group["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=device)
    for state in optimizer.state.values():
        step = state.get("step")
        if isinstance(step, torch.Tensor) and step.device != device:
            state["step"] = step.to(device=device, dtype=torch.float32)


def _dropout_probabilities(model: nn.Module) -> tuple[float, ...]:
    return tuple(float(m.p) for m in model.modules() if isinstance(m, nn.Dropout))


class CapturedSteps:
    """The captured steps of one training run (module docstring).

    Args:
        model: the :class:`fastasr.model.CTCModel` trained.
        setting: ``capture_steps`` (resolved: True / False; ``auto`` is read as on).
        warmup: eager steps of a shape before it is captured (≥ 1: the optimiser's state must
            exist before its update is captured).
        max_shapes: shapes captured at most; others run eagerly (their graphs' memory is held).
        backend: what captures (:class:`CudaGraphs` on CUDA when None).
    """

    def __init__(self, model: nn.Module, setting: bool | str = True, warmup: int = 1, max_shapes: int = 16,
                 backend: CudaGraphs | EagerGraphs | None = None) -> None:
        if warmup < 1:
            raise ValueError(f"captured steps: warmup {warmup}; expected ≥ 1")
        self.model = model
        self.setting = setting
        self.warmup, self.max_shapes = int(warmup), int(max_shapes)
        self.backend = backend
        self.active = False
        self.graphs: dict[tuple, ShapeGraphs] = {}
        self.seen: dict[tuple, int] = {}
        self.failed: dict[tuple, str] = {}
        self.current: ShapeGraphs | None = None  # the graphs of the step in progress (None: eager)
        #: the gradients' L2 norm before clipping of the captured step just updated (None otherwise)
        self.grad_norm: torch.Tensor | None = None
        self.clip: tuple[float | None, str | None] = (None, None)
        self._signature: tuple | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._eager_forward: Callable[[], list[torch.Tensor]] | None = None
        self._ddp: DistributedDataParallel | None = None  # under DDP: its gradients reduced here
        self.guard: DeviceUpdateGuard | None = None  # a non-finite step's update undone on the device
        self._world_size = 1

    # ---------------------------------------------------------------- the run
    def start(self, device: torch.device, optimizer: torch.optim.Optimizer | None, world_size: int = 1,
              ddp: DistributedDataParallel | None = None, accumulate: int = 1) -> bool:
        """Decide at the start of training whether steps are captured (``self.active``); when
        they are, make ``optimizer`` capturable (:func:`make_capturable`) and under DDP (``ddp``
        the model's wrapper) switch its gradient synchronisation off for :meth:`reduce_gradients`.
        ``accumulate``: ``accumulate_grad_batches``. Where steps cannot be captured, one warning
        says why (``capture_steps=true``) or one info line (``auto``)."""
        self.active = False
        if self.setting is False:
            return False
        reason = self.eager_reason(device, optimizer, world_size, ddp, accumulate)
        if reason is not None:
            (log.warning if self.setting is True else log.info)(
                "capture_steps=%s: every training step runs eagerly (%s)", self.setting, reason)
            return False
        if self.backend is None:
            self.backend = CudaGraphs()
        if isinstance(self.backend, CudaGraphs):
            make_capturable(optimizer, device)
        self._optimizer = optimizer
        if world_size > 1:
            ddp.require_backward_grad_sync = False  # DDP's no_sync() for the run; reduce_gradients instead
            self._ddp, self._world_size = ddp, int(world_size)
        self.active = True
        log.info("capture_steps: training steps captured as CUDA graphs, a set per batch shape after %d eager "
                 "step(s) of it, at most %d shapes%s", self.warmup, self.max_shapes,
                 f"; the gradients' all-reduce over {world_size} processes after each backward" if self._ddp else "")
        return True

    def eager_reason(self, device: torch.device, optimizer: torch.optim.Optimizer | None, world_size: int = 1,
                     ddp: DistributedDataParallel | None = None, accumulate: int = 1) -> str | None:
        """Why :meth:`start` would leave every step eager (arguments as there); None: the steps
        are captured, unless ``capture_steps`` is false."""
        if self.backend is None and device.type != "cuda":
            return f"CUDA graphs need a CUDA device; this run trains on {device.type}"
        if world_size > 1 and not isinstance(ddp, DistributedDataParallel):
            return (f"{world_size} processes without a DistributedDataParallel wrapper "
                    f"({type(ddp).__name__}): no all-reduce of the gradients to move into the step")
        if accumulate > 1:
            return (f"gradients accumulated over {accumulate} batches (trainer.accumulate_grad_batches): "
                    "a captured backward writes each batch's gradients afresh")
        if getattr(self.model, "chunk_training", None) is not None:
            return "chunked streaming training draws each batch's chunk context on the host"
        if optimizer is None:
            return "no optimiser"
        return None

    def reduce_gradients(self) -> None:
        """Under DDP with captured steps (:meth:`start`): every trainable parameter's gradient
        averaged over the processes (:func:`fastasr.distributed.average_gradients`). Called
        after each backward, captured or eager, so that every process joins every all-reduce.
        Otherwise nothing."""
        if self._ddp is not None and self.active:
            average_gradients([p for p in self.model.parameters() if p.requires_grad], self._world_size,
                              getattr(self._ddp, "process_group", None))

    def summary(self) -> dict[str, Any]:
        """Shapes captured, seen and failed (for logs and tests)."""
        return {"captured": sorted(k[0] for k in self.graphs), "seen": {k[0]: n for k, n in self.seen.items()},
                "failed": {k[0]: why for k, why in self.failed.items()}}

    # ---------------------------------------------------------------- a step
    def _key(self, features: torch.Tensor) -> tuple:
        signature = (_dropout_probabilities(self.model), torch.is_autocast_enabled(features.device.type),
                     torch.get_autocast_dtype(features.device.type))
        if signature != self._signature:
            if self.graphs:
                log.info("capture_steps: the model's dropout or autocast changed; its %d captured shape(s) "
                         "are captured again", len(self.graphs))
            self.graphs.clear()
            self._signature = signature
        return (tuple(features.shape), features.dtype)

    def forward(self, batch: Mapping[str, Any], run: Callable[[torch.Tensor, torch.Tensor], tuple]) -> tuple | None:
        """The step's forward by its shape's graph: ``(log_probs, out_lengths, [intermediate
        log_probs])`` as detached leaves that require grad (CTC and Lightning's backward go on
        from them), or None: this step runs eagerly. ``run(features, lengths)`` is the model's
        forward, returning ``([log_probs, *intermediate], out_lengths)``."""
        self.current = self.grad_norm = None
        if not self.active or not torch.is_grad_enabled():
            return None
        features, lengths = batch["features"], batch["feature_lengths"]
        cast = self._cast(features.device.type)

        def eager() -> list[torch.Tensor]:  # this batch's forward, should its backward capture fail
            with self._cast(features.device.type, cast):
                return list(run(features, lengths)[0])

        self._eager_forward = eager
        key = self._key(features)
        graphs = self.graphs.get(key)
        if graphs is None:
            if key in self.failed:
                return None
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] <= self.warmup or len(self.graphs) >= self.max_shapes:
                return None
            try:
                graphs = self._capture_forward(key, features, lengths, run)
            except Exception as err:  # noqa: BLE001 (any failure: this shape stays eager)
                self._fail(key, "forward", err)
                return None
        graphs.features.copy_(features, non_blocking=True)
        graphs.lengths.copy_(lengths, non_blocking=True)
        log_probs, out_lengths = graphs.forward.replay()
        graphs.outputs = (log_probs, out_lengths)
        graphs.leaves = [lp.detach().requires_grad_() for lp in log_probs]
        self.current = graphs
        return graphs.leaves[0], out_lengths, graphs.leaves[1:]

    @staticmethod
    def _cast(device: str, settings: tuple | None = None):
        """The autocast of the step (``settings``: one taken earlier), its cast cache off: a
        graph keeps no cache between replays. Returns ``(enabled, dtype)`` without ``settings``."""
        if settings is None:
            return torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
        enabled, dtype = settings
        return torch.autocast(device, dtype=dtype, cache_enabled=False) if enabled else contextlib.nullcontext()

    def _capture_forward(self, key: tuple, features: torch.Tensor, lengths: torch.Tensor, run) -> ShapeGraphs:
        graphs = ShapeGraphs(features=features.clone(), lengths=lengths.clone())
        device = features.device.type
        settings = self._cast(device)

        def forward():
            with self._cast(device, settings):
                log_probs, out_lengths = run(graphs.features, graphs.lengths)
            return list(log_probs), out_lengths

        def warm():
            outs, _ = forward()
            torch.autograd.backward(outs, [torch.zeros_like(o) for o in outs])

        params = [p for p in self.model.parameters() if p.requires_grad]
        saved = [p.grad for p in params]
        for p in params:
            p.grad = None  # the warm-up's gradients are thrown away
        self.backend.warm_up(warm)
        for p, g in zip(params, saved):
            p.grad = g
        graphs.forward = self.backend.capture(forward)
        self.graphs[key] = graphs
        return graphs

    def backward(self) -> None:
        """After Lightning's backward of the CTC loss into the leaves: the shape's backward graph
        (captured at its first call) from the leaves' gradients; the parameters' ``.grad`` are
        then the graph's."""
        graphs = self.current
        if graphs is None:
            return
        params = [p for p in self.model.parameters() if p.requires_grad]
        grads = [leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for leaf in graphs.leaves]
        if graphs.backward is None:
            try:
                graphs.grads_in = [torch.empty_like(g) for g in grads]

                def backward():
                    for p in params:
                        p.grad = None  # the graph allocates them (in its pool) and writes them at each replay
                    # a CUDA graph's outputs are the same tensors at every replay; the stand-in's are new
                    torch.autograd.backward(graphs.outputs[0], graphs.grads_in)
                    return [p.grad for p in params]

                graphs.backward = self.backend.capture(backward)
            except Exception as err:  # noqa: BLE001
                self._fail_current("backward", err)
                self._eager_backward(grads)
                return
        for dst, src in zip(graphs.grads_in, grads):
            dst.copy_(src)
        graphs.grads = graphs.backward.replay()
        for p, g in zip(params, graphs.grads):
            p.grad = g

    def _eager_backward(self, grads: Sequence[torch.Tensor]) -> None:
        """The step whose backward capture failed: its forward again, eagerly, and the backward
        from the same log-probability gradients; the update then runs eagerly too."""
        self.current = None
        for p in self.model.parameters():
            p.grad = None
        torch.autograd.backward(self._eager_forward(), list(grads))

    def update(self, eager_step: Callable[[], Any]) -> None:
        """The optimiser's step of a captured step: the shape's update graph (clipping and the
        optimiser's step; captured at its first call), unless a hook dropped the gradients: then
        nothing. With :attr:`guard` (``callbacks.nonfinite_loss`` sets it) the graph also undoes
        an update whose loss or gradients are not finite, on the device
        (:class:`fastasr.training.update_guard.DeviceUpdateGuard`). ``eager_step``: the
        optimiser's own step, for a shape whose update capture fails."""
        graphs = self.current
        params = [p for p in self.model.parameters() if p.requires_grad]
        if any(p.grad is not g for p, g in zip(params, graphs.grads)):
            return  # gradients dropped (or replaced) by a hook: no update this step
        with_grad = [p for p in params if p.grad is not None]
        val, algorithm = self.clip
        guard, optimizer = self.guard, self._optimizer

        def update():  # one norm: the guard's verdict, the clipping and the log share it
            if guard is not None:
                norm = guard.before(with_grad, optimizer)
                clip_norm = torch.nan_to_num(norm, nan=0.0, posinf=0.0, neginf=0.0)  # a skip's gradients are 0
            else:
                norm = clip_norm = torch.nn.utils.get_total_norm([p.grad for p in with_grad], norm_type=2.0)
            if val:
                if algorithm == "value":
                    torch.nn.utils.clip_grad_value_(with_grad, val)
                else:
                    torch.nn.utils.clip_grads_with_norm_(with_grad, val, clip_norm)
            eager_step()
            if guard is not None:
                guard.after(with_grad, optimizer)
            return norm

        if graphs.update is None:
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*capturable=True.*")
                    graphs.update = self.backend.capture(update)
            except Exception as err:  # noqa: BLE001
                self._fail_current("update", err)
                self.grad_norm = update()
                return
        self.grad_norm = graphs.update.replay()

    # ---------------------------------------------------------------- failures
    def _fail(self, key: tuple, part: str, err: BaseException) -> None:
        self.graphs.pop(key, None)
        self.failed[key] = f"{part}: {type(err).__name__}: {err}"
        warnings.warn(f"capture_steps: the training step of batch shape {key[0]} runs eagerly from now on; "
                      f"capturing its {part} failed ({type(err).__name__}: {err})", RuntimeWarning, stacklevel=2)

    def _fail_current(self, part: str, err: BaseException) -> None:
        for key, graphs in list(self.graphs.items()):
            if graphs is self.current:
                self._fail(key, part, err)

    @contextlib.contextmanager
    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        """While Lightning's optimiser step runs: ``optimizer.step`` replays the update graph of
        a captured step (after running Lightning's closure, as a torch optimiser does), and is
        the optimiser's own step otherwise."""
        own = optimizer.__dict__.get("step")
        original = own if own is not None else type(optimizer).step.__get__(optimizer)

        def step(closure=None, **kwargs):
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            if self.current is None:
                original(**kwargs)
            else:
                self.update(original)
                if hasattr(optimizer, "_opt_called"):
                    optimizer._opt_called = True  # what the schedules' step counter records
            return loss

        optimizer.step = step
        try:
            yield
        finally:
            if own is None:
                del optimizer.step
            else:
                optimizer.step = own
            self.current = None
