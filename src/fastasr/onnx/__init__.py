"""The ONNX runtime of an exported recogniser: transcription with onnxruntime, numpy and
kaldi-native-fbank, without PyTorch (:mod:`fastasr.onnx.recogniser`; the command is
``python -m fastasr.onnx.transcribe``, docs/DEPLOY.md)."""
