"""Clustering kernels for the attention modules, and their PyTorch references.

``ops`` is what callers use (it picks the implementation for the tensors' device);
``reference`` is the ground truth every other implementation is tested against.
The model's own layers have kernels here too, outside attention: ``dropout`` (a CPU mask
drawn on all of torch's threads; the feed-forward's GELU and dropout in one Triton pass),
``layer_norm`` and ``linear`` (the layer norms and the bias gradients by Triton), the Triton
ones each behind a switch a GPU's timing decides.
"""

from fastasr.kernels import ops, reference

__all__ = ["ops", "reference"]
