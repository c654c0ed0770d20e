"""The inner-attention interface every variant implements.

An inner attention is parameter-free: it maps projected queries, keys and values
``(B, H, N, E)`` and valid lengths ``(B,)`` to outputs ``(B, H, N, E)``. Because
it owns no weights, a trained model can swap one variant for another.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from typing import ClassVar

import torch
from torch import nn

from fastasr.attention.masking import check_lengths
from fastasr.attention.spec import Param, check_params
from fastasr.kernels.clustering import ops

__all__ = ["InnerAttention", "compute_dtype", "kernel_dtype"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype the fast variants compute in: float64 stays float64, everything else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def kernel_dtype(x: torch.Tensor) -> torch.dtype:
    """Dtype in which the clustered variants hand ``x`` to their kernels.

    float16/bfloat16 stay as they are when the sparse part runs on Triton (CUDA
    tensors, or ``FASTASR_KERNELS=triton``): its dots multiply them on the tensor cores
    with float32 accumulation, and the softmaxes run in float32. Otherwise as
    :func:`compute_dtype` (a CPU has no faster half-precision path).
    """
    half = x.dtype in (torch.float16, torch.bfloat16)
    if half and ops.kernel_backend(x, "improved_sparse") == "triton":
        return x.dtype
    return compute_dtype(x.dtype)


class InnerAttention(nn.Module):
    """Base class of the attention variants.

    Subclasses set the class attributes, implement :meth:`_forward` and
    :meth:`_dense_weights`, and take their parameters as typed constructor
    arguments whose defaults are the variant's defaults (the only place they are
    written; :meth:`defaults` reads them), handing them to :meth:`_set_hparams`.
    This class validates parameters and inputs, owns the random number generator and
    builds the canonical spec string.

    Class attributes:
        name: variant name in spec strings (``"i-clustered"``).
        number_param: the parameter a spec's trailing number sets (``"clusters"``),
            or None.
        params: the accepted values of each constructor argument (bounds, ``None`` or
            not, a doc line), one :class:`Param` per argument.
        requires_shared_qk: whether ``q`` and ``k`` must be the same tensor.
        length_cost: how time and memory grow with the sequence length, ``"linear"`` or
            ``"quadratic"``; the frame-budget sampler prices batches by it.
    """

    name: ClassVar[str] = ""
    number_param: ClassVar[str | None] = None
    params: ClassVar[tuple[Param, ...]] = ()
    requires_shared_qk: ClassVar[bool] = False
    length_cost: ClassVar[str] = "linear"

    def __init__(self) -> None:
        super().__init__()
        self.hparams: dict[str, int | None] = {}
        self._seeded: dict[tuple, torch.Tensor] = {}  # seeded draws, by (seed, shape, device)

    def _set_hparams(self, **values: int | None) -> None:
        """Check ``values`` against :attr:`params` and store them as attributes and in
        :attr:`hparams` (kept in ``params`` order).

        Raises:
            ValueError: a value out of range or of the wrong type, naming the parameter
                and what is expected.
        """
        values = {**self.hparams, **values}
        self.hparams = check_params(self.name, self.params, values)
        for key, value in self.hparams.items():
            setattr(self, key, value)

    @classmethod
    def defaults(cls) -> dict[str, int | None]:
        """The constructor's defaults, by parameter name (``{"clusters": 100, ...}``)."""
        return {
            name: p.default
            for name, p in inspect.signature(cls).parameters.items()
            if p.default is not p.empty
        }

    # ------------------------------------------------------------------ naming
    @property
    def spec(self) -> str:
        """Canonical spec string (``"i-clustered-100"``)."""
        if self.number_param is None:
            return self.name
        return f"{self.name}-{self.hparams[self.number_param]}"

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.hparams.items())

    # -------------------------------------------------------------- randomness
    def _randn(self, *shape: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Standard normal float32 tensor on ``device``, for reading only.

        With a seed (``hparams["seed"]``) every call returns the same numbers: drawn once a shape
        and device by a generator of that device seeded with it, then kept, so that a call makes no
        draw (and a CUDA graph holds no generator, whose seeding no capture allows). Without one,
        a new draw from torch's global RNG of that device at every call. Drawing on the device of
        the inputs keeps a host-to-device copy (and the wait for the device it implies) out of
        every call; the same seed draws different numbers on a CPU and on a GPU.
        """
        device = torch.device(device)
        seed = self.hparams.get("seed")
        if seed is None:
            return torch.randn(*shape, device=device)
        key = (seed, shape, device)
        drawn = self._seeded.get(key)
        if drawn is None:
            generator = torch.Generator(device=device)
            generator.manual_seed(seed)
            drawn = self._seeded[key] = torch.randn(*shape, generator=generator, device=device)
        return drawn

    # ------------------------------------------------------------------ checks
    def _check(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, lengths
    ) -> torch.Tensor | None:
        for label, t in (("q", q), ("k", k), ("v", v)):
            if t is None:
                continue
            if t.dim() != 4:
                raise ValueError(
                    f"attention {self.spec}: {label} must be (B, H, N, E); got shape {tuple(t.shape)}"
                )
            if not t.dtype.is_floating_point:
                raise ValueError(
                    f"attention {self.spec}: {label} must be floating point; got {t.dtype}"
                )
        if q.shape != k.shape:
            raise ValueError(
                f"attention {self.spec}: q and k shapes differ: {tuple(q.shape)} vs {tuple(k.shape)}"
            )
        if v is not None and v.shape[:3] != q.shape[:3]:
            raise ValueError(
                f"attention {self.spec}: v must be (B, H, N, Ev) with (B, H, N) = {tuple(q.shape[:3])}; "
                f"got {tuple(v.shape)}"
            )
        dtypes = {q.dtype, k.dtype} | ({v.dtype} if v is not None else set())
        if len(dtypes) != 1:
            raise ValueError(
                f"attention {self.spec}: q, k, v dtypes differ: {sorted(map(str, dtypes))}"
            )
        if self.requires_shared_qk and not _same_tensor(q, k):
            raise ValueError(
                f"attention {self.spec} needs shared queries and keys: pass the same tensor as q "
                "and k (a model built with shared Q/K projections, e.g. model.shared_qk=true); "
                "got two different tensors"
            )
        return check_lengths(lengths, q.shape[0], q.shape[2])

    @staticmethod
    def scale(e: int) -> float:
        """Softmax temperature ``1 / sqrt(E)``."""
        return 1.0 / math.sqrt(e)

    # --------------------------------------------------------------- interface
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attend.

        Args:
            q, k: ``(B, H, N, E)``; v: ``(B, H, N, Ev)``; one floating dtype.
            lengths: ``(B,)`` integer valid lengths, or None if nothing is padded.

        Returns:
            ``(B, H, N, Ev)`` in the input dtype; rows of padded queries are 0.
            Autocast is switched off inside: half-precision inputs are computed
            as documented by each variant, whatever the caller's autocast state.
        """
        lengths = self._check(q, k, v, lengths)
        # The variants choose their own precision (float32 softmax and matmuls for
        # half inputs); autocast would silently re-lower them, and make hash codes
        # depend on whether the caller runs under autocast.
        with _autocast_off(q.device.type):
            return self._forward(q, k, v, lengths)

    @torch.no_grad()
    def dense_weights(
        self, q: torch.Tensor, k: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The ``(B, H, N, N)`` attention matrix this variant effectively applies.

        ``forward(q, k, v, lengths) == dense_weights(q, k, lengths) @ v`` (up to
        rounding), for the same random draws (build with ``seed`` to compare).
        Rows sum to 1 for valid queries and are 0 for padded ones; columns of
        padded keys are 0. Float32 (float64 for float64 inputs). O(N^2) memory:
        for tests and attention-map images.
        """
        lengths = self._check(q, k, None, lengths)
        with _autocast_off(q.device.type):
            return self._dense_weights(q, k, lengths)

    def _forward(self, q, k, v, lengths):  # pragma: no cover - abstract
        raise NotImplementedError

    def _dense_weights(self, q, k, lengths):  # pragma: no cover - abstract
        raise NotImplementedError


def _autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """Autocast switched off on ``device_type``; nothing where it has no autocast (the meta
    device, on which a model's step is checked for values read back to the host)."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """O(1) check that ``a`` and ``b`` are the same tensor or identical views of one storage.

    Comparing values would cost a pass over the data (and an allclose can pass by
    accident); sharing memory is what a model with one Q/K projection produces.
    """
    if a is b:
        return True
    return (
        a.device == b.device
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )
