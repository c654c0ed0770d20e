"""``python -m fastasr.cross_eval [overrides]``: kept only because the project's outside contract
(DESIGN.md's command list) names it. The command is :mod:`fastasr.cli.matrix`, installed as
``fastasr-matrix`` (what ``make matrix`` runs; conf/cross_eval.yaml, docs/MATRIX.md)."""

from fastasr.cli.matrix import main

if __name__ == "__main__":
    main()
