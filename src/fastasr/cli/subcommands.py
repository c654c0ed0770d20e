"""A command made of subcommands, each the ``main(argv)`` of a library module
(``fastasr-corpus <builder>``, ``fastasr-kernels build|check|compile-check``).

The module is imported only once its subcommand is chosen, so ``--help`` and a mistyped
subcommand answer without loading torch.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Subcommand:
    """``module``'s ``main(argv)`` runs the subcommand; ``argv`` starts with ``prefix`` (the
    words the module's own parser expects before the rest of the command line)."""

    module: str
    help: str
    prefix: tuple[str, ...] = ()


def dispatch(prog: str, description: str, table: Mapping[str, Subcommand],
             argv: Sequence[str] | None = None) -> int:
    """Run the subcommand named by ``argv[0]`` with the rest of ``argv`` (``sys.argv[1:]`` when
    None). ``-h``/``--help`` or nothing: the list of subcommands (exit status 0 and 2); an unknown
    name: one line on stderr and exit status 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    width = max(map(len, table))
    usage = (f"usage: {prog} {{{','.join(table)}}} [arguments]  ({prog} SUBCOMMAND -h: its arguments)\n\n"
             f"{description}\n\n" + "\n".join(f"  {name:<{width}}  {sub.help}" for name, sub in table.items()))
    if not args or args[0] in ("-h", "--help"):
        print(usage, file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in table:
        print(f"{prog}: unknown subcommand {name!r}; expected one of {', '.join(table)}", file=sys.stderr)
        return 2
    sub = table[name]
    return int(importlib.import_module(sub.module).main([*sub.prefix, *rest]) or 0)
