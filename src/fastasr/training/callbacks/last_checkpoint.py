"""``last.ckpt``: the resumable checkpoint of the end of every epoch.

Lightning 2.6's ``ModelCheckpoint(save_last=True)`` writes ``last.ckpt`` only at an epoch whose
validation score also saved a best checkpoint: after the best epoch, a killed run would resume
from the best epoch and lose every epoch since. :class:`LastCheckpoint` writes it after every
epoch (after the epoch's validation), and where ``trainer.max_time`` stops training in the
middle of an epoch, so ``ckpt_path=auto`` resumes from the newest epoch end (or from the newer
``step-last.ckpt`` of the step checkpoint or the preemption checkpoint). When training ends at a
step no epoch end saved (``debug=fast``, which turns Lightning's checkpointing off, or
``max_steps`` inside an epoch) it is written there too.
"""

from __future__ import annotations

import os

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from fastasr.rundir import RESUME_NAMES


class LastCheckpoint(ModelCheckpoint):
    """A full trainer checkpoint named ``filename`` + ``.ckpt``, replaced at every epoch end.

    Args:
        filename: without ``.ckpt``; one of the names ``ckpt_path=auto`` resumes from
            (``fastasr.rundir.RESUME_NAMES``).
        every_n_epochs: write at every N-th epoch end.
        dirpath: the checkpoint directory (``fastasr.training.fit`` passes the run's ``checkpoints/``).
    """

    def __init__(self, filename: str = "last", every_n_epochs: int = 1, dirpath: str | None = None) -> None:
        if f"{filename}.ckpt" not in RESUME_NAMES:
            raise ValueError(f"LastCheckpoint filename={filename!r}: ckpt_path=auto would not resume from "
                             f"{filename}.ckpt; expected one of {', '.join(n.removesuffix('.ckpt') for n in RESUME_NAMES)}")
        super().__init__(dirpath=dirpath, filename=filename, monitor=None, save_top_k=1, every_n_epochs=every_n_epochs,
                         enable_version_counter=False)

    @property
    def state_key(self) -> str:
        # the epoch-weights checkpoint has the same monitor and interval: the filename tells them apart
        return self._generate_state_key(filename=self.filename, every_n_epochs=self._every_n_epochs)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._last_global_step_saved != trainer.global_step and self.dirpath is not None:
            trainer.save_checkpoint(os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION))
            self._last_global_step_saved = trainer.global_step
