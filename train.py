"""Train a CTC recogniser: ``python train.py [hydra overrides]`` (conf/train.yaml). The command is
:mod:`fastasr.cli.train`, installed as ``fastasr-train``; this file keeps the name the README and
Hydra users run."""

from fastasr.cli.train import main

if __name__ == "__main__":
    main()
