"""Clustering kernels for the attention modules, and their PyTorch references.

``ops`` is what callers use (it picks the implementation for the tensors' device);
``reference`` is the ground truth every other implementation is tested against.
``dropout`` is the one kernel outside attention: dropout whose CPU mask is drawn on
all of torch's threads.
"""

from fastasr.kernels import ops, reference

__all__ = ["ops", "reference"]
