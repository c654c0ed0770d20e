"""The model's layers with kernels of their own, outside attention: ``Dropout`` and
``GeluDropout`` (:mod:`~fastasr.kernels.layers.dropout`), ``LayerNorm``
(:mod:`~fastasr.kernels.layers.layer_norm`) and ``Linear`` (:mod:`~fastasr.kernels.layers.linear`),
each torch's module with the same parameters, numbers and state dict, its work sent by
:mod:`fastasr.kernels.dispatch`'s rules to the C++ or Triton kernels where they run.
"""
