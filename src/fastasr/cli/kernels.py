"""``fastasr-kernels build|check|compile-check [arguments]``: the kernels' build and checks.

    fastasr-kernels build [--verbose]       # the C++ CPU kernels into src/fastasr/kernels/_build (make install)
    fastasr-kernels check                   # whether they load on this machine, and why not
    fastasr-kernels compile-check [--arch 90] [--only NAME] [--loops]   # every Triton kernel compiled for a GPU (no GPU needed)

``build`` and ``check`` are :func:`fastasr.kernels.native.main`; ``compile-check`` is
:func:`fastasr.kernels.compile_check.main` (``fastasr-kernels compile-check -h``: its arguments).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastasr.cli.subcommands import Subcommand, dispatch

SUBCOMMANDS = {
    "build": Subcommand("fastasr.kernels.native", "build the C++ CPU attention kernels, then load them",
                        prefix=("build",)),
    "check": Subcommand("fastasr.kernels.native", "say whether the C++ CPU kernels load here", prefix=("check",)),
    "compile-check": Subcommand("fastasr.kernels.compile_check",
                                "compile every Triton kernel for a CUDA architecture, without a GPU"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """``fastasr-kernels SUBCOMMAND [arguments]``."""
    return dispatch("fastasr-kernels", "The kernels' build and checks.", SUBCOMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
