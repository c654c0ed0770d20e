"""What each train spec and eval spec of the matrix stands for, and which pairs cannot run.

A *train spec* names a model, by the shared-Q/K rule of training's configuration
(:func:`fastasr.training.derived_config.train_member`) —

* ``shared-full``: full attention on a model with one projection for queries and keys
  (``model.shared_qk=true``);
* an attention that needs shared Q/K (LSH: Reformer hashes queries and keys together):
  that attention, with shared Q/K;
* any other attention spec (``full``, ``clustered-100``, …): that attention, separate Q/K.

An *eval spec* is the attention swapped in at decoding time; ``shared-full`` is ``full``
on a shared-Q/K model. A pair whose eval spec needs shared Q/K on a model trained without
it is ``n/a``, with the reason.

``conf/experiment/matrix_member_base.yaml`` leaves ``attention`` and ``model.shared_qk`` to this
rule (``???``): :func:`fastasr.training.derived_config.resolve_train_config` fills them in from ``member``
where training starts, so ``python train.py experiment=matrix_member member=lsh-4`` and
multirun jobs build the model the matrix expects.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastasr.training.derived_config import SHARED_FULL, needs_shared_qk, train_member

REASON_SHARED_FULL = (
    "shared-full is full attention with one Q/K projection: needs a model trained with "
    "shared Q/K (model.shared_qk=true)"
)
REASON_LSH = (
    "LSH hashes queries and keys together: needs a model trained with shared Q/K "
    "(model.shared_qk=true)"
)


__all__ = ["SHARED_FULL", "MatrixError", "check_spec_lists", "eval_attention", "train_member"]


class MatrixError(RuntimeError):
    """A matrix configuration that cannot be run as asked."""


def eval_attention(eval_spec: str, shared_qk: bool) -> tuple[str | None, str]:
    """The attention to decode with for ``eval_spec`` on a model with/without shared Q/K,
    or ``(None, reason)`` when the pair cannot run."""
    if eval_spec == SHARED_FULL:
        return ("full", "") if shared_qk else (None, REASON_SHARED_FULL)
    if needs_shared_qk(eval_spec) and not shared_qk:
        return None, REASON_LSH
    return eval_spec, ""


def check_spec_lists(train: Sequence[str], evals: Sequence[str]) -> None:
    """Raise :class:`MatrixError` unless both lists are non-empty, without repeats, and
    every entry is ``shared-full`` or a valid attention spec."""
    for kind, specs in (("matrix.train", train), ("matrix.eval", evals)):
        if not specs:
            raise MatrixError(f"{kind} is empty; expected a list of attention specs")
        if len(set(specs)) != len(specs):
            raise MatrixError(f"{kind} lists a spec twice: {list(specs)}")
        for spec in specs:
            if spec != SHARED_FULL:
                try:
                    needs_shared_qk(spec)
                except ValueError as err:
                    raise MatrixError(f"{kind}: {err}") from None
