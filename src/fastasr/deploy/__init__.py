"""Deployment: a trained recogniser exported to ONNX (:mod:`fastasr.deploy.export`), which the
PyTorch-free runtime :mod:`fastasr.onnx` and sherpa-onnx run."""
