"""``python -m fastasr.export ckpt_path=CKPT [out=DIR]``: a checkpoint as a folder that runs without
PyTorch (ONNX, units, features, lexicon, LM); the command is :mod:`fastasr.cli.export` (usage there,
and in docs/DEPLOY.md)."""

from fastasr.cli.export import main

if __name__ == "__main__":
    main()
