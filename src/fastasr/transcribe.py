"""``python -m fastasr.transcribe ckpt_path=CKPT audio=PATH [overrides]``: kept only because the
project's outside contract (DESIGN.md's command list) names it. The command is
:mod:`fastasr.cli.transcribe`, installed as ``fastasr-transcribe`` (usage there, docs/TRANSCRIBE.md)."""

from fastasr.cli.transcribe import main

if __name__ == "__main__":
    main()
