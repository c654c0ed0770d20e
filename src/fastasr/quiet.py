"""Third-party messages that are not the user's to act on, silenced in one place.

The commands (``train.py``, ``evaluate.py``, ``fastasr-transcribe``, ``python -m
fastasr.cross_eval``, ``python -m fastasr.cli.budget``) call :func:`quiet_known_noise`
first. Each entry below matches one exact message of a library, with the reason it says nothing
the user can act on; everything else, the warnings about the user's config and data above all,
still shows. wandb's banner and offline summary are off by its own setting
(``conf/logger/default.yaml``: ``settings.silent``), and :func:`fastasr.training.loggers.finish_wandb`
says in one line where the run went.

Lightning's own messages ("GPU available: ...", the model summary) go through the handlers the
command's logging set up (Hydra's console and the run's log file), once: see
:func:`lightning_logs_through_root`.
"""

from __future__ import annotations

import logging
import re
import sys
import warnings

# (message regex, category, why it is not the user's to act on): Python warnings, matched at the
# start of the message as warnings.filterwarnings does.
WARNINGS: list[tuple[str, type[Warning], str]] = [
    (r"The '\w+' does not have many workers which may be a bottleneck", Warning,
     "Lightning counts the cores; data.num_workers is already chosen per machine (auto: the cores less one)"),
    (r"Precision \S+ is not supported by the model summary", UserWarning,
     "Lightning's model summary cannot size a mixed-precision (bf16-mixed) model; training is unaffected"),
    (r"The PyTorch API of nested tensors is in prototype stage", UserWarning,
     "full attention packs a padded batch into jagged nested tensors (fastasr.attention.full) on purpose"),
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning,
     "Lightning's own use of a torch API that torch 2.11 deprecates"),
    (r"This instance was constructed with capturable=True", UserWarning,
     "captured steps make RAdam capturable on purpose (fastasr.training.captured_step); a shape's first "
     "steps run it eagerly before their capture"),
]

# (logger name, message regex, why): log records of libraries, dropped by a logging filter.
LOG_RECORDS: list[tuple[str, str, str]] = [
    *((name, r"💡 Tip: For seamless cloud logging", "an advertisement for a hosted logger")
      for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")),
    *((name, r"You are using a CUDA device .* that has Tensor Cores",
       "the float32 matmul precision is a choice of the code, not of a run (bf16-mixed trains on a GPU)")
      for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")),
    ("torch.fx._symbolic_trace", r"is_fx_tracing will return true for both fx.symbolic_trace and torch.export",
     "torch's note to code that calls is_fx_tracing, printed when FlashAttention's varlen op (full attention "
     "on a GPU) first runs"),
]


class _DropMatching(logging.Filter):
    """A logging filter that drops the records whose message matches one of its patterns."""

    def __init__(self) -> None:
        super().__init__("fastasr.quiet")
        self.patterns: list[re.Pattern[str]] = []

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(p.match(message) for p in self.patterns)


# The loggers to which Lightning attaches a handler of its own when it is imported: `lightning`
# always (a stderr handler printing "INFO: <message>"), `lightning.pytorch` / `lightning.fabric`
# (and the standalone packages') when the root logger has no handler yet.
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric")


def lightning_logs_through_root() -> None:
    """Hand Lightning's log records to the root logger's handlers alone.

    Importing ``lightning`` adds a stderr handler to the ``lightning`` logger while its children
    propagate to the root too, so under a command's logging (Hydra's console and its job log file)
    each message of Lightning's printed twice: ``INFO: GPU available: ...`` from Lightning's
    handler, then ``[time][lightning...][INFO] - GPU available: ...`` from Hydra's, and only the
    second reached the run's log file. Imported before the root had a handler, Lightning instead
    stops its children propagating, and its messages miss the log file. Here Lightning's handlers
    go and its loggers propagate, so each message shows once, in the command's format, on the
    console and in the log file. Nothing changes while the root logger has no handler (Lightning
    used as a library without logging set up: its own handlers are then the only ones) or before
    Lightning is imported: the commands call this after importing their modules.
    """
    if not logging.getLogger().handlers:
        return
    for name in LIGHTNING_LOGGERS:
        if name not in sys.modules:
            continue
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if type(h) is logging.StreamHandler]:  # Lightning's, no other
            logger.removeHandler(handler)
        logger.propagate = True


def quiet_known_noise() -> None:
    """Install the filters of :data:`WARNINGS` and :data:`LOG_RECORDS` and route Lightning's
    messages through the root logger's handlers (:func:`lightning_logs_through_root`);
    idempotent: a second call adds nothing."""
    lightning_logs_through_root()
    for message, category, _ in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)  # an equal filter is not added twice
    for name, message, _ in LOG_RECORDS:
        logger = logging.getLogger(name)
        drop = next((f for f in logger.filters if isinstance(f, _DropMatching)), None)
        if drop is None:
            drop = _DropMatching()
            logger.addFilter(drop)
        if all(p.pattern != message for p in drop.patterns):
            drop.patterns.append(re.compile(message))
