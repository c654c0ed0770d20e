"""Name -> variant registry and :func:`build_attention`.

The registry maps spec names to classes and holds nothing else: a variant's
parameters and their defaults are its constructor's signature, their accepted
values its ``params``. :func:`build_attention` checks the names a spec gives and
calls the class with them.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from fastasr.attention.base import InnerAttention
from fastasr.attention.spec import check_names, parse_spec_string

__all__ = ["register", "build_attention", "available", "length_cost", "ALIASES"]

_REGISTRY: dict[str, type[InnerAttention]] = {}

#: Spec strings that stand for another spec.
ALIASES: dict[str, str] = {"oracle-top": "topk-32"}


def register(cls: type[InnerAttention]) -> type[InnerAttention]:
    """Class decorator: make ``cls`` buildable under ``cls.name``.

    Raises:
        ValueError: the name is empty or taken, or the constructor's arguments are not
            exactly the names in ``cls.params`` (every one of them keyword-capable, with
            a default, and ``number_param`` among them).
    """
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"cannot register attention {cls.__name__} under name {cls.name!r}")
    args = inspect.signature(cls).parameters
    declared = [p.name for p in cls.params]
    problems = []
    if set(args) != set(declared):
        problems.append(f"constructor arguments {sorted(args)} != params {sorted(declared)}")
    problems += [
        f"argument {a.name!r} is {a.kind.description}"
        for a in args.values()
        if a.kind not in (a.POSITIONAL_OR_KEYWORD, a.KEYWORD_ONLY)
    ]
    problems += [
        f"argument {a.name!r} has no default" for a in args.values() if a.default is a.empty
    ]
    if cls.number_param is not None and cls.number_param not in args:
        problems.append(f"number_param {cls.number_param!r} is not a constructor argument")
    if problems:
        raise ValueError(f"cannot register attention {cls.__name__}: " + "; ".join(problems))
    _REGISTRY[cls.name] = cls
    return cls


def available() -> dict[str, type[InnerAttention]]:
    """The registered variants, by name."""
    return dict(_REGISTRY)


def build_attention(
    spec: str | Mapping[str, Any] | InnerAttention, **overrides: Any
) -> InnerAttention:
    """Build an inner attention from a spec string or a config mapping.

    Args:
        spec: a spec string (``"i-clustered-100"``, ``"lsh-4"``, ``"oracle-top"``);
            or a mapping with a ``name`` (a variant name or a whole spec string)
            and the variant's own parameters (an OmegaConf ``DictConfig`` works);
            or an already built module (returned as is unless overridden).
        **overrides: parameters that replace those of ``spec``
            (``build_attention("i-clustered-100", topk=64, bits=32)``).

    Precedence: defaults (the class's constructor) < the spec string's number <
    mapping keys < overrides.

    Raises:
        ValueError: unknown spec/name, unknown parameter (the message lists the
            accepted ones), or a value out of range (the message says what is
            expected).
    """
    if isinstance(spec, InnerAttention):
        if not overrides:
            return spec
        return _construct(type(spec), {**spec.hparams, **overrides})

    known = {name: cls.number_param for name, cls in _REGISTRY.items()}
    if isinstance(spec, Mapping):
        if "name" not in spec:
            raise ValueError(
                f"attention config {dict(spec)!r} has no 'name'; expected one of: {', '.join(known)}"
            )
        text = spec["name"]
        keys = {str(k): v for k, v in spec.items() if k != "name"}
    else:
        text, keys = spec, {}

    parsed = parse_spec_string(text, known, ALIASES)
    cls = _REGISTRY[parsed.name]
    given = {}
    if parsed.number is not None:
        given[cls.number_param] = parsed.number
    given.update(keys)
    given.update(overrides)
    return _construct(cls, given)


def _construct(cls: type[InnerAttention], given: dict[str, Any]) -> InnerAttention:
    """``cls(**given)``, after checking that ``cls`` takes every key (the constructor
    fills the rest with its defaults and checks the values)."""
    check_names(cls.name, cls.params, given)
    return cls(**given)


def length_cost(spec: str | Mapping[str, Any] | InnerAttention | None) -> str:
    """``"quadratic"`` or ``"linear"``: how the variant's cost grows with the sequence length.

    Args:
        spec: a spec string, a config mapping with a ``name``, a built module, or None
            (no attention configured: ``"linear"``, i.e. batches priced by padded frames).
    """
    if spec is None:
        return "linear"
    if isinstance(spec, InnerAttention):
        return spec.length_cost
    text = spec["name"] if isinstance(spec, Mapping) else spec
    known = {name: cls.number_param for name, cls in _REGISTRY.items()}
    return _REGISTRY[parse_spec_string(text, known, ALIASES).name].length_cost
