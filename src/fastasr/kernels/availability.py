"""Can the Triton kernels run here, and if not, why not.

The Triton kernels (the ``triton_*`` modules of :mod:`fastasr.kernels.clustering` and
:mod:`fastasr.kernels.layers`) run in one of two ways:

* compiled, on a CUDA device (tensors on ``cuda``, ``torch.cuda.is_available()``);
* interpreted, on the CPU, when ``TRITON_INTERPRET=1`` was set *before* Triton and
  the kernel modules were imported (``triton.jit`` reads the variable when it
  decorates a function — Triton's own library functions included — so setting it
  later has no effect on functions already defined).

Every public kernel entry point calls :func:`require_triton` first, so a kernel
that cannot run fails at its first call with a :class:`TritonUnavailableError`
naming the missing piece, instead of a missing symbol or an obscure pointer error
deep inside Triton. Nothing here falls back silently: choosing the PyTorch
reference instead is the dispatcher's job (:mod:`fastasr.kernels.dispatch`), and it only
does so by rule (CPU tensors) or by request (``FASTASR_KERNELS=reference``).

This module imports neither Triton nor the kernel modules at import time.
"""

from __future__ import annotations

import functools
import importlib
import os

import torch

__all__ = [
    "TritonUnavailableError",
    "interpreter_requested",
    "kernels_interpreted",
    "prepare_interpreter",
    "require_triton",
    "import_kernel_module",
    "triton_import_error",
    "unavailable_reason",
]

_TRUE = {"1", "true", "yes", "on", "y"}


class TritonUnavailableError(RuntimeError):
    """The Triton kernels cannot run for the given tensors; the message says why."""


@functools.lru_cache(maxsize=1)
def triton_import_error() -> str | None:
    """``None`` if ``import triton`` works, else the reason it failed (cached)."""
    try:
        importlib.import_module("triton")
        importlib.import_module("triton.language")
    except Exception as exc:  # ImportError, or a broken install raising anything
        return f"{type(exc).__name__}: {exc}"
    return None


def interpreter_requested() -> bool:
    """True when the environment asks for the Triton interpreter (``TRITON_INTERPRET``)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE


@functools.cache
def _interpreted_type() -> type | None:
    """Triton's interpreted-kernel class, or None without Triton (looked up once: the launchers
    ask at every call)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except Exception:
        return None
    return InterpretedFunction


def kernels_interpreted(kernel) -> bool:
    """True if ``kernel`` (a ``@triton.jit`` object) was built for the interpreter."""
    interpreted = _interpreted_type()
    return interpreted is not None and isinstance(kernel, interpreted)


@functools.cache
def _triton_stdlib_interpreted() -> bool:
    """Whether Triton's own ``@jit`` library (``tl.sum``, ...) was built for the interpreter.

    Interpreted kernels can only call interpreted library functions; ``triton.jit``
    fixes the mode of each when its module is first imported (so once is enough).
    """
    from triton.language import standard

    return kernels_interpreted(standard.sum)


@functools.cache
def _capability_reason(index: int) -> str | None:
    """Why GPU ``index`` is too old for Triton, or None (cached: kernels ask at every call)."""
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) < (7, 5):
        name = torch.cuda.get_device_name(index)
        return f"GPU {name} has compute capability {major}.{minor}; Triton needs >= 7.5"
    return None


def _cuda_available() -> bool:
    return torch.cuda.is_available()


def unavailable_reason(device: torch.device | str, interpreted: bool) -> str | None:
    """Why Triton kernels cannot run on ``device``, or ``None`` if they can.

    Args:
        device: the device of the kernel's input tensors.
        interpreted: whether the kernels were defined under ``TRITON_INTERPRET=1``
            (see :func:`kernels_interpreted`).
    """
    err = triton_import_error()
    if err is not None:
        return (
            f"`import triton` failed ({err}); Triton ships with the CUDA build of "
            "torch (pip install 'torch==2.11.*')"
        )
    device = torch.device(device)
    if interpreted:
        if not _triton_stdlib_interpreted():
            return (
                "the kernels were defined for the Triton interpreter but Triton itself was "
                "imported before TRITON_INTERPRET=1 was set (something, e.g. `import lightning`, "
                "loaded triton.language compiled); set TRITON_INTERPRET=1 before anything "
                "imports triton"
            )
        return None  # the interpreter runs any tensor on the CPU (CUDA ones are copied)
    if device.type == "cuda":
        if not _cuda_available():
            return "tensors are on cuda but torch.cuda.is_available() is False"
        return _capability_reason(device.index if device.index is not None else torch.cuda.current_device())
    cuda = "available" if _cuda_available() else "not available (torch.cuda.is_available() is False)"
    env = "set" if interpreter_requested() else "not set"
    return (
        f"tensors are on {device.type}; compiled Triton kernels need CUDA tensors "
        f"(CUDA is {cuda}), and the Triton interpreter is off (TRITON_INTERPRET is "
        f"{env}; it must be 1 before Triton is first imported)"
    )


def require_triton(op: str, device: torch.device | str, interpreted: bool) -> None:
    """Raise :class:`TritonUnavailableError` if the Triton kernel ``op`` cannot run.

    Args:
        op: the kernel's public name, used in the message (``"hash_codes"``).
        device: device of the kernel's inputs.
        interpreted: whether the kernel module was built for the interpreter.
    """
    reason = unavailable_reason(device, interpreted)
    if reason is not None:
        raise TritonUnavailableError(
            f"fastasr.kernels Triton kernel {op!r} cannot run: {reason}. "
            "Move the inputs to a CUDA device, set TRITON_INTERPRET=1 before importing "
            "fastasr, or use the PyTorch reference (FASTASR_KERNELS=reference)."
        )


def import_kernel_module(name: str):
    """Import ``fastasr.kernels.<name>`` (a Triton kernel module, ``name`` as
    ``clustering.triton_topk``), failing clearly.

    Raises :class:`TritonUnavailableError` naming Triton when it cannot be imported,
    so callers never see a bare ``ModuleNotFoundError`` from inside a kernel module.
    """
    err = triton_import_error()
    if err is not None:
        raise TritonUnavailableError(
            f"fastasr.kernels.{name} needs Triton, but `import triton` failed ({err}). "
            "Install the CUDA build of torch, which ships Triton, or use the PyTorch "
            "reference (FASTASR_KERNELS=reference)."
        )
    return importlib.import_module(f"fastasr.kernels.{name}")


_INTERPRETER_PREPARED = False


def prepare_interpreter() -> None:
    """Two changes to Triton 3.6's interpreter (idempotent; compiled kernels are untouched).
    Called by the kernel modules at import.

    * NumPy >= 2.4: the interpreter holds every scalar as a one-element array and converts
      it to a Python int with ``int(array)``, which NumPy 2.4 turned into a ``TypeError``:
      any kernel looping to a run-time bound (``for i in range(0, n, BLOCK)``) then fails
      under ``TRITON_INTERPRET=1`` (triton-lang/triton#9171, fixed upstream by #9172 after
      3.6.0). The same one-line fix is applied, only when Triton still has the bug.
    * Speed: :func:`_patch_language_once_a_launch`.
    """
    global _INTERPRETER_PREPARED
    if _INTERPRETER_PREPARED or triton_import_error() is not None:
        return
    _INTERPRETER_PREPARED = True
    from triton.runtime import interpreter

    _fix_scalar_index(interpreter)
    _patch_language_once_a_launch(interpreter)


def _fix_scalar_index(interpreter) -> None:
    import inspect

    import numpy as np

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        return
    try:
        int(np.zeros(1, dtype=np.int32))
        return  # this NumPy still converts one-element arrays: nothing to fix
    except TypeError:
        pass
    try:
        source = inspect.getsource(original)
    except (OSError, TypeError):
        return
    if "int(self.handle.data)" not in source:
        return  # Triton already fixed

    def _patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = _patch_lang_tensor


def _patch_language_once_a_launch(interpreter) -> None:
    """Patch ``triton.language`` once a module a kernel launch, not at every device call.

    The interpreter maps ``triton.language`` onto its own operations (``_patch_lang``: every
    builtin of four modules, found by ``inspect.getmembers``) when a launch starts and again
    at each call of a ``@triton.jit`` function from the kernel: ``tl.sum``, ``tl.cumsum`` and
    every helper, a bisection step's sum included, about 0.5 ms a call on a CPU core and about
    half the interpreted time of this project's kernel tests. What it patches depends only on
    the called function's module (its globals), and a launch's patches stay until it ends, so
    within one launch a module patched once is skipped. Outside a launch (and wherever
    Triton's interpreter lacks these internals) nothing changes.
    """
    patch_lang = getattr(interpreter, "_patch_lang", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    grid = getattr(interpreter, "GridExecutor", None)
    if patch_lang is None or scope_type is None or grid is None:
        return
    launches: list[set[int]] = []  # the running launch's patched modules (their globals' ids)
    run_grid = grid.__call__

    def launch(self, *args, **kwargs):
        launches.append(set())
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            launches.pop()

    def patch_once(fn):
        if launches:
            module = id(fn.__globals__)
            if module in launches[-1]:
                return scope_type()  # already patched in this launch: an empty scope
            launches[-1].add(module)
        return patch_lang(fn)

    grid.__call__ = functools.wraps(run_grid)(launch)
    interpreter._patch_lang = patch_once
