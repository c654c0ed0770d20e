"""A resumable checkpoint at the step where SIGTERM stopped training.

SIGTERM is what SLURM and most schedulers send before they kill a job (preemption, ``scancel``,
a time limit). Lightning notes the signal, finishes the batch it is in and raises
``SIGTERMException``; :class:`PreemptionCheckpoint` then writes a full trainer checkpoint
(model, optimiser, scheduler, loops, the loader's position in the epoch) at that step, as
``checkpoints/step-last.ckpt`` of the run directory, where ``ckpt_path=auto`` finds it. The
same command resumes at that global step, with the batch after it. Without it a preempted run
would lose the updates since the last step checkpoint (up to ``every_n_train_steps``).

The write happens in ``on_exception``, before Lightning tears the trainer down (the loops and
the training dataloader, whose position goes into the checkpoint, still exist), through the
strategy's checkpoint IO (``fastasr.training.checkpoint_io.AtomicCheckpointIO``: a kill during the write
leaves the previous ``step-last.ckpt`` whole).

Several processes (DDP): global rank 0 writes alone, with no collective call.
``Trainer.save_checkpoint`` ends with a barrier that every rank must reach, but Lightning 2.6
raises ``SIGTERMException`` on each rank where that rank notices the signal (after its current
training or validation batch, or at the start of the next one), so the ranks need not be in
``on_exception`` together; a barrier there could hang until the scheduler's SIGKILL. The other
ranks hold the same weights and optimiser state after every step, and the loader position
(batches done on each rank, with the number of ranks) is the same on all, so rank 0's state is
the whole run's. The checkpoint
is built as ``Trainer.save_checkpoint`` builds it (Lightning's ``_checkpoint_connector``: no
public call builds one without the barrier). Strategies that shard the state over the ranks
(FSDP, DeepSpeed) would need every rank in the save: there the callback writes nothing and says so.
"""

from __future__ import annotations

import logging
import time

import lightning as L
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from fastasr.rundir import RESUME_NAMES, RunDir

log = logging.getLogger(__name__)


class PreemptionCheckpoint(L.Callback):
    """On SIGTERM during ``fit``, write a resumable checkpoint of the current step.

    Args:
        filename: the checkpoint's name in ``<run dir>/checkpoints`` (the trainer's
            ``default_root_dir``, set by ``fastasr.training.fit.train``); one of the names
            ``ckpt_path=auto`` resumes from (``fastasr.rundir.RESUME_NAMES``).
    """

    def __init__(self, filename: str = "step-last.ckpt") -> None:
        super().__init__()
        if filename not in RESUME_NAMES:
            raise ValueError(f"PreemptionCheckpoint filename={filename!r}: ckpt_path=auto would not resume "
                             f"from it; expected one of {', '.join(RESUME_NAMES)}")
        self.filename = filename

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        if trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking or trainer.global_step == 0:
            return  # not training, or nothing trained yet
        strategy = trainer.strategy
        if type(strategy) not in (SingleDeviceStrategy, DDPStrategy) and trainer.world_size > 1:
            # exact types: DeepSpeedStrategy is a DDPStrategy whose state is sharded over the ranks
            log.warning("SIGTERM: no checkpoint written at step %d: strategy %s shards the training state, "
                        "and saving it needs every rank", trainer.global_step, type(strategy).__name__)
            return
        if not trainer.is_global_zero:
            return
        path = RunDir(trainer.default_root_dir).checkpoints / self.filename
        try:
            started = time.perf_counter()
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            strategy.save_checkpoint(checkpoint, path)
        except Exception:  # the run still stops with the SIGTERM status; say what is lost
            log.exception("SIGTERM: writing the checkpoint of step %d to %s failed; the same command "
                          "resumes from the previous checkpoint", trainer.global_step, path)
            return
        log.warning("SIGTERM: wrote %s at step %d (epoch %d) in %.1f s", path, trainer.global_step,
                    trainer.current_epoch, time.perf_counter() - started)
        if trainer.validating:
            log.warning("SIGTERM came during validation: the resumed run goes on training without redoing "
                        "it (Lightning resumes as after a finished validation), so epoch %d has no validation "
                        "metrics and no epoch or best checkpoint", trainer.current_epoch)
