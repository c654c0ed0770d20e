"""Attention spec strings and parameter validation.

A spec names a variant and, optionally, its main number: ``full``,
``lsh-<rounds>``, ``clustered-<clusters>``, ``i-clustered-<clusters>``,
``topk-<k>``, and the alias ``oracle-top`` (= ``topk-32``). Underscores are read
as hyphens (``i_clustered-100``), so config group names work too.

This module knows nothing about the variants themselves: each variant's
constructor signature holds its parameters and their defaults, its ``params``
declare the accepted values of each as :class:`Param` objects, and this module
parses spec strings and checks values against them.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Param", "SpecName", "parse_spec_string", "check_names", "check_params"]

# A spec string: a name made of letters and hyphens, then an optional "-<digits>".
_SPEC_RE = re.compile(r"^(?P<name>[a-z]+(?:-[a-z]+)*)(?:-(?P<number>\d+))?$")


@dataclass(frozen=True)
class Param:
    """The accepted values of one integer parameter of an attention variant.

    The default is not here: it is the default of the variant's constructor argument.

    Attributes:
        name: the keyword (``clusters``).
        low, high: inclusive bounds (``None`` = unbounded).
        optional: whether ``None`` is a valid value.
        even: whether the value must be even.
        doc: one line, shown in errors.
    """

    name: str
    low: int | None = None
    high: int | None = None
    optional: bool = False
    even: bool = False
    doc: str = ""

    def expected(self) -> str:
        """Human description of the accepted values."""
        if self.low is not None and self.high is not None:
            rng = f"an integer in [{self.low}, {self.high}]"
        elif self.low is not None:
            rng = f"an integer >= {self.low}"
        elif self.high is not None:
            rng = f"an integer <= {self.high}"
        else:
            rng = "an integer"
        if self.even:
            rng = "an even " + rng[len("an ") :]
        if self.optional:
            rng += " or null"
        return rng

    def check(self, variant: str, value: Any) -> int | None:
        """Return ``value`` as an int (or None), or raise ``ValueError`` naming it."""
        if value is None:
            if self.optional:
                return None
            raise ValueError(f"attention {variant!r}: {self.name}=None; expected {self.expected()}")
        if isinstance(value, bool) or not isinstance(value, int):
            # Accept integral values from configs (e.g. numpy ints) but not bools, floats, strings.
            try:
                if isinstance(value, bool):
                    raise TypeError
                value = operator.index(value)
            except TypeError:
                raise ValueError(
                    f"attention {variant!r}: {self.name}={value!r} ({type(value).__name__}); "
                    f"expected {self.expected()}"
                ) from None
        if (self.low is not None and value < self.low) or (
            self.high is not None and value > self.high
        ):
            raise ValueError(
                f"attention {variant!r}: {self.name}={value} is out of range; expected {self.expected()}"
            )
        if self.even and value % 2:
            raise ValueError(
                f"attention {variant!r}: {self.name}={value} is odd; expected {self.expected()}"
            )
        return int(value)


@dataclass(frozen=True)
class SpecName:
    """A parsed spec string: the variant name and the number that followed it, if any."""

    name: str
    number: int | None


def parse_spec_string(
    spec: str, known: Mapping[str, str | None], aliases: Mapping[str, str]
) -> SpecName:
    """Split ``"i-clustered-100"`` into ``SpecName("i-clustered", 100)``.

    Args:
        spec: the spec string.
        known: variant name -> the parameter its number sets (None if it takes none).
        aliases: alias -> the spec string it stands for (``"oracle-top": "topk-32"``).

    Raises:
        ValueError: the string is not ``<name>`` or ``<name>-<number>`` for a known name.
    """
    if not isinstance(spec, str):
        raise ValueError(f"attention spec {spec!r}: expected a string such as 'clustered-100'")
    text = spec.strip().lower().replace("_", "-")
    if text in aliases:
        text = aliases[text]
    m = _SPEC_RE.match(text)
    forms = ", ".join([n if p is None else f"{n}-<{p}>" for n, p in known.items()] + list(aliases))
    if m is None or m.group("name") not in known:
        raise ValueError(f"unknown attention spec {spec!r}; expected one of: {forms}")
    name, number = m.group("name"), m.group("number")
    if number is not None and known[name] is None:
        raise ValueError(f"attention spec {spec!r}: {name!r} takes no number; expected {name!r}")
    return SpecName(name, None if number is None else int(number))


def check_names(variant: str, params: tuple[Param, ...], given: Iterable[str]) -> None:
    """Raise ``ValueError`` naming the first key of ``given`` that is not in ``params``
    (and the accepted ones)."""
    accepted = {p.name for p in params}
    for key in given:
        if key not in accepted:
            names = ", ".join(sorted(accepted)) or "none"
            raise ValueError(
                f"attention {variant!r}: unknown parameter {key!r}; accepted parameters: {names}"
            )


def check_params(
    variant: str, params: tuple[Param, ...], given: Mapping[str, Any]
) -> dict[str, int | None]:
    """Validate the values in ``given``; return them as ints (or None) in ``params`` order.

    Keys missing from ``given`` are left out (no defaults are filled in here).

    Raises:
        ValueError: an unknown key (naming the accepted ones) or a bad value.
    """
    check_names(variant, params, given)
    return {p.name: p.check(variant, given[p.name]) for p in params if p.name in given}
