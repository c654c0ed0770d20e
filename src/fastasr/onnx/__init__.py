"""The ONNX runtime of an exported recogniser: transcription with onnxruntime and numpy (its
filterbank: :mod:`fastasr.onnx.filterbank`), without PyTorch (:mod:`fastasr.onnx.onnx_recogniser`; the command is
``fastasr-onnx-transcribe``, docs/DEPLOY.md)."""
