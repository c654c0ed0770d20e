"""Long commands show progress on a terminal and end with where their results are; third-party
noise is silenced while the user's warnings show (issue #38)."""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from test_words_and_counts import words_ckpt  # noqa: F401  (fixture: a tiny checkpoint with a lexicon and LM)

from fastasr.config import PROJECT_ROOT
from fastasr.progress import progress_bar, show_progress
from fastasr.quiet import quiet_known_noise

TQDM_BAR = re.compile(r"\d+/\d+ \[[0-9:]+<")  # tqdm's "2/2 [00:01<00:00, ...]"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------------- progress
class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_auto_follows_the_terminal_and_true_false_force_it():
    assert show_progress("auto", _Stream(True)) and show_progress(None, _Stream(True))
    assert not show_progress("auto", _Stream(False))
    assert not show_progress(False, _Stream(True)) and not show_progress("false", _Stream(True))
    assert show_progress(True, _Stream(False)) and show_progress("true", _Stream(False))
    with pytest.raises(ValueError, match="progress='sometimes'; expected auto, true or false"):
        show_progress("sometimes")


def test_progress_bar_yields_every_item_drawn_or_not(capsys):
    assert list(progress_bar(iter(range(5)), enabled=False, total=5, desc="x")) == list(range(5))
    assert capsys.readouterr().err == ""
    assert list(progress_bar(iter(range(5)), enabled=True, total=5, desc="count", unit="utt")) == list(range(5))
    err = capsys.readouterr().err
    assert "count: 100%" in err and "5/5" in err


def test_evaluate_shows_progress_only_when_asked_and_ends_with_the_results(words_ckpt, tiny_corpus, tmp_path):  # noqa: F811
    common = ("evaluate.py", f"ckpt_path={words_ckpt}", f"data.test_manifest={tiny_corpus / 'test.jsonl'}",
              "data.num_workers=0", "accelerator=cpu", "decoding=greedy", f"paths.output_dir={tmp_path}")
    quiet = run(*common)  # progress=auto, stderr captured: not a terminal
    shown = run(*common, "progress=true")
    for done in (quiet, shown):
        assert done.returncode == 0, done.stderr
        *_, where, last = done.stdout.strip().splitlines()
        assert last.startswith("PER=") and last.endswith("(2 utterances)")
        results = Path(where.split("results: ")[1])
        assert results.is_file() and results.parent.parent == tmp_path / "eval"
    assert not TQDM_BAR.search(quiet.stderr) and "decode test.jsonl" not in quiet.stderr
    assert TQDM_BAR.search(shown.stderr) and "decode test.jsonl: 100%" in shown.stderr and "2/2" in shown.stderr
    assert not TQDM_BAR.search(shown.stdout)  # the bar is on stderr: stdout keeps the result lines only


def run_on_terminal(*args: str, timeout: float = 300) -> str:
    """Run ``python args`` with stdout and stderr on a pseudo-terminal (100 columns), as in a
    user's shell; returns what it printed, carriage returns as newlines."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios
    import time

    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdin, stdout and stderr are the terminal
        os.chdir(PROJECT_ROOT)
        os.execv(sys.executable, [sys.executable, *args])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 1.0)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out.decode(errors="replace")[-3000:]
    return out.decode(errors="replace").replace("\r", "\n")


def test_evaluate_shows_progress_on_a_terminal(words_ckpt, tiny_corpus, tmp_path):  # noqa: F811
    common = ("evaluate.py", f"ckpt_path={words_ckpt}", f"data.test_manifest={tiny_corpus / 'test.jsonl'}",
              "data.num_workers=0", "accelerator=cpu", "decoding=greedy", f"paths.output_dir={tmp_path}")
    shown = run_on_terminal(*common)  # progress=auto on a terminal
    assert TQDM_BAR.search(shown) and "decode test.jsonl: 100%" in shown
    assert [line for line in shown.splitlines() if line.strip()][-1].startswith("PER=")
    hidden = run_on_terminal(*common, "progress=false")
    assert not TQDM_BAR.search(hidden) and "decode test.jsonl" not in hidden


def test_transcribe_shows_progress_when_asked_and_ends_with_its_outputs(words_ckpt, tiny_corpus, tmp_path):  # noqa: F811
    common = ("-m", "fastasr.cli.transcribe", f"ckpt_path={words_ckpt}", f"audio={tiny_corpus / 'test.jsonl'}",
              "device=cpu", "decoding=greedy", f"paths.output_dir={tmp_path}")
    quiet, shown = run(*common), run(*common, "progress=true")
    for done in (quiet, shown):
        assert done.returncode == 0, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("transcribe: outputs in ") and Path(last.split(" in ", 1)[1]).is_dir()
    assert not TQDM_BAR.search(quiet.stderr)
    assert TQDM_BAR.search(shown.stderr) and "transcribe: 100%" in shown.stderr


# ---------------------------------------------------------------------- quiet
def test_known_noise_is_silenced_and_the_users_warnings_show(caplog):
    from lightning.fabric.utilities.warnings import PossibleUserWarning

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_known_noise()
        quiet_known_noise()  # idempotent
        warnings.warn("The 'train_dataloader' does not have many workers which may be a bottleneck. Consider "
                      "increasing the value of the `num_workers` argument` to `num_workers=1`", PossibleUserWarning, stacklevel=1)
        warnings.warn("Precision bf16-mixed is not supported by the model summary.  Estimated model size in MB "
                      "will not be accurate. Using 32 bits instead.", UserWarning, stacklevel=1)
        warnings.warn("The PyTorch API of nested tensors is in prototype stage and will change in the near future.",
                      UserWarning, stacklevel=1)
        warnings.warn("This instance was constructed with capturable=True or some of all the param_groups came with "
                      "capturable=True, but step() is running without CUDA graph capture. If you never intend to "
                      "graph-capture this instance, capturable=True can impair performance, and you should set "
                      "capturable=False.", UserWarning, stacklevel=1)
        # the user's to act on: their config
        warnings.warn("The number of training batches (5) is smaller than the logging interval "
                      "Trainer(log_every_n_steps=10).", PossibleUserWarning, stacklevel=1)
        warnings.warn("manifest train.jsonl line 812: duration 0.0 s; expected > 0", UserWarning, stacklevel=1)
    assert [str(w.message)[:40] for w in seen] == ["The number of training batches (5) is sm",
                                                   "manifest train.jsonl line 812: duration "]
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with caplog.at_level(logging.INFO, logger=logger.name):
        logger.info("💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]")
        logger.info("You are using a CUDA device ('NVIDIA H100 80GB HBM3') that has Tensor Cores. To properly "
                    "utilize them, you should set `torch.set_float32_matmul_precision('medium' | 'high')`")
        logger.info("`Trainer.fit` stopped: `max_epochs=1` reached.")
    assert [r.getMessage() for r in caplog.records] == ["`Trainer.fit` stopped: `max_epochs=1` reached."]
    caplog.clear()
    fx = logging.getLogger("torch.fx._symbolic_trace")  # printed when the GPU's varlen attention first runs
    with caplog.at_level(logging.INFO, logger=fx.name):
        fx.warning("is_fx_tracing will return true for both fx.symbolic_trace and torch.export. Please use "
                   "is_fx_tracing_symbolic_tracing() for specifically fx.symbolic_trace")
        fx.warning("a torch.fx message that is not the known note")
    assert [r.getMessage() for r in caplog.records] == ["a torch.fx message that is not the known note"]


LIGHTNING_PROBE = """
import logging, sys
if sys.argv[1] == "configured":  # as a command's Hydra job logging does before the training modules load
    logging.basicConfig(level=logging.INFO, format="ROOT %(message)s", stream=sys.stdout)
import lightning
from fastasr.quiet import quiet_known_noise
quiet_known_noise()
logging.getLogger("lightning.pytorch.utilities.rank_zero").info("GPU available: False, used: False")
"""


@pytest.mark.parametrize("root", ["configured", "bare"])
def test_lightning_logs_once_through_the_commands_handlers(root):
    """Lightning's messages go through the root logger's handlers alone, once, when logging is set
    up (not a second time as ``INFO: ...`` from the handler Lightning adds at import); without a
    root handler (Lightning as a library) its own handler stays, and its messages still show."""
    done = run("-c", LIGHTNING_PROBE, root)
    assert done.returncode == 0, done.stderr
    if root == "configured":
        assert (done.stdout, done.stderr) == ("ROOT GPU available: False, used: False\n", "")
    else:
        assert done.stdout == "" and "GPU available: False, used: False" in done.stderr


WANDB_PROBE = """
import logging, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from fastasr.config import CONFIG_DIR
from fastasr.training.loggers import build_loggers, finish_wandb
from fastasr.rundir import RunDir

logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(message)s", stream=sys.stdout)
out = sys.argv[1]
with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
    cfg = compose("train", overrides=["logger=default", "name=quiet", f"paths.output_dir={out}",
                                      "callbacks.model_checkpoint.monitor=val/per", "data.length_cost=linear"])
cfg.logger = OmegaConf.create({"wandb": OmegaConf.to_container(cfg.logger.wandb)})  # wandb alone
(logger,) = build_loggers(cfg, RunDir(out + "/run").create())
logger.log_metrics({"train/loss": 1.0}, step=0)
finish_wandb()
"""


def test_wandb_says_in_one_line_where_the_offline_run_is(tmp_path):
    """conf/logger/default.yaml's wandb: no banner, no anonymous warning, no 30-line summary; one
    line at the end (a subprocess: wandb's process-wide state stays out of the test process)."""
    done = run("-c", WANDB_PROBE, str(tmp_path))
    assert done.returncode == 0, done.stderr
    wandb_lines = [line for line in (done.stdout + done.stderr).splitlines() if "wandb" in line.lower()]
    assert len(wandb_lines) == 1, wandb_lines
    match = re.fullmatch(r"LOG fastasr.training.loggers wandb: offline run in (\S+); `wandb sync \1` uploads it", wandb_lines[0])
    assert match, wandb_lines
    assert Path(match.group(1)).is_dir() and Path(match.group(1)).is_relative_to(tmp_path / "run")
