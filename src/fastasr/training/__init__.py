"""Training: fit a recogniser and hand over to its final decoding.

Modules: :mod:`~fastasr.training.fit` (``train``: check → derive → instantiate → fit → test →
final decoding), :mod:`~fastasr.training.lit` (the LightningModule),
:mod:`~fastasr.training.lr_schedules`, :mod:`~fastasr.training.loggers`,
:mod:`~fastasr.training.checkpoint_io` (atomic checkpoint writes),
:mod:`~fastasr.training.config_check` and :mod:`~fastasr.training.derived_config` (the
training configuration's checks and derived values), :mod:`~fastasr.training.callbacks`.
Imports ``recognition`` and the layers below it; never the studies or the commands.
"""
