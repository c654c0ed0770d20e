"""``python -m fastasr.cross_eval [overrides]`` (what ``make matrix`` runs): the approximation
matrix under the name the project's outside contract gives it; the command is
:mod:`fastasr.cli.matrix` (conf/cross_eval.yaml, docs/MATRIX.md)."""

from fastasr.cli.matrix import main

if __name__ == "__main__":
    main()
