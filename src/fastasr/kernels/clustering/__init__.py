"""The clustering ops of the attention modules and their implementations.

:mod:`~fastasr.kernels.clustering.backend` writes each op's signature and shapes once
(:class:`~fastasr.kernels.clustering.backend.ClusteringBackend`);
:mod:`~fastasr.kernels.clustering.reference` (PyTorch, the ground truth),
:mod:`fastasr.kernels.native` (C++, CPU) and the ``triton_*`` modules (CUDA) implement it;
:mod:`~fastasr.kernels.clustering.ops` sends each call to one of them by device.
"""
