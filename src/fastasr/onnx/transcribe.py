"""``python -m fastasr.onnx.transcribe model_dir=DIR audio=PATH [key=value ...]``: transcription with an
exported recogniser, without PyTorch, under the name docs/DEPLOY.md gives it; the command is
:mod:`fastasr.cli.onnx_transcribe` (usage there)."""

from fastasr.cli.onnx_transcribe import main

if __name__ == "__main__":
    raise SystemExit(main())
