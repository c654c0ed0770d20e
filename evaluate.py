"""Decode a manifest with a checkpoint: ``python evaluate.py ckpt_path=PATH [overrides]``
(conf/evaluate.yaml). The command is :mod:`fastasr.cli.evaluate`, installed as ``fastasr-evaluate``;
this file keeps the name the README and Hydra users run."""

from fastasr.cli.evaluate import main

if __name__ == "__main__":
    main()
