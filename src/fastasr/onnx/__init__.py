"""The ONNX runtime of an exported recogniser: transcription with onnxruntime, numpy and
kaldi-native-fbank, without PyTorch (:mod:`fastasr.onnx.onnx_recogniser`; the command is
``fastasr-onnx-transcribe``, docs/DEPLOY.md)."""
