"""``python -m fastasr.cross_eval [overrides]``: the approximation matrix, what ``make matrix``
runs (conf/cross_eval.yaml). The code lives in :mod:`fastasr.matrix`."""

from fastasr.matrix.__main__ import main

if __name__ == "__main__":
    main()
