"""The kernels: the clustering ops of the attention modules, and the model's layers' own.

* :mod:`fastasr.kernels.clustering`: hashing, K-means, top-k and the clustered products, one
  interface (:mod:`~fastasr.kernels.clustering.backend`) that the PyTorch reference, the C++
  kernels and the Triton kernels implement; :mod:`~fastasr.kernels.clustering.ops` is what
  callers use (it picks the implementation for the tensors' device).
* :mod:`fastasr.kernels.layers`: the model's layers outside attention: ``dropout`` (a CPU mask
  drawn on all of torch's threads; the feed-forward's GELU and dropout in one Triton pass),
  ``layer_norm`` and ``linear`` (the layer norms and the bias gradients by Triton), the Triton
  ones each behind a switch a GPU's timing decides.
* Here, shared by both: :mod:`~fastasr.kernels.dispatch` (which implementation runs,
  ``FASTASR_KERNELS``), :mod:`~fastasr.kernels.native` (the C++ CPU kernels: build, load,
  ops), :mod:`~fastasr.kernels.availability` (can Triton run, the interpreter), the launch
  helpers ``grid``, ``rows``, ``padding``, ``ranges``, and ``compile_check`` (the Triton
  kernels compiled for a GPU without one).

Neither subpackage imports the other (the C++ ops in ``native`` fall back to the
clustering reference where their kernel does not serve a shape).
"""
