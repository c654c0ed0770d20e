"""``fastasr-report DIRECTORY [--out FILE]`` (or ``python -m fastasr.cli.report``): one self-contained HTML page of a run
directory (curves, summary, attention maps) or a matrix directory (the table, per-cell curves):
:func:`fastasr.studies.report.build_report`. Prints the page's path.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fastasr.studies.report import build_report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fastasr-report", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="a run directory (outputs/runs/NAME) or a matrix directory (outputs/matrix/NAME)")
    parser.add_argument("--out", help="HTML file to write (default: DIRECTORY/report.html)")
    args = parser.parse_args(argv)
    try:
        path = build_report(args.directory, args.out)
    except FileNotFoundError as err:
        print(f"report: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
