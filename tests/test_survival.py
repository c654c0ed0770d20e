"""SIGKILL at any moment, then the same command again: training continues from the last
checkpoint with the same global step, optimiser, scheduler, sampler position and wandb run.

Each run is ``python train.py`` in a subprocess (tiny model and corpus: 5 batches an epoch,
a checkpoint every step). The probe callback (``tests/run_probe.py``) records every batch each
run trained on and the state the run started from; kills come from the probe (SIGKILL to
itself at the end of a given step, before that step's checkpoint is written) or from this
test while a checkpoint is half-written (``FASTASR_TEST_CHECKPOINT_STALL``).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from run_probe import read_records, run_env, train_command

from fastasr.training.checkpoint_io import STALL_ENV

EPOCHS = 2


def command(corpus: Path, tmp_path: Path, *overrides: str) -> list[str]:
    return train_command(
        corpus, tmp_path / "outputs", tmp_path / "probe", "name=survive", f"trainer.max_epochs={EPOCHS}",
        "data.max_batch_size=2", "data.min_batches_per_epoch=null",  # 5 batches an epoch: the kill steps below
        "callbacks.step_checkpoint.every_n_train_steps=1", "test=false",
        "trainer.num_sanity_val_steps=0", *overrides,
    )


def run(cmd: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=tmp_path, env=run_env(**env), capture_output=True, text=True, timeout=180)


def wandb_env(tmp_path: Path) -> dict[str, str]:
    return {"WANDB_MODE": "offline", "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
            "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"), "WANDB_DATA_DIR": str(tmp_path / "wandb-data")}


def batches_by_run(records: list[dict]) -> list[list[dict]]:
    """The batch records of each run of the command (split at its start records)."""
    runs: list[list[dict]] = []
    for r in records:
        if r["event"] == "start":
            runs.append([])
        elif r["event"] == "batch":
            runs[-1].append(r)
    return runs


def committed_batches(records: list[dict]) -> list[dict]:
    """The batches whose update survived: a run's batches up to the step the next run resumed from."""
    runs = batches_by_run(records)
    starts = [r["global_step"] for r in records if r["event"] == "start"]
    kept = []
    for i, batches in enumerate(runs):
        end = starts[i + 1] if i + 1 < len(runs) else None
        kept += [b for b in batches if end is None or b["global_step"] < end]
    return kept


def assert_same_state(start: dict, ckpt_path: Path) -> None:
    """The optimiser and scheduler a resumed run starts with are those of the checkpoint."""
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == start["global_step"]
    got = torch.load(start["optimizer"], map_location="cpu", weights_only=True)
    want = ckpt["optimizer_states"][0]
    assert got["optimizer"]["param_groups"] == want["param_groups"]
    for key, state in want["state"].items():
        for name, value in state.items():
            other = got["optimizer"]["state"][key][name]
            assert torch.equal(torch.as_tensor(other), torch.as_tensor(value)), (key, name)
    assert got["scheduler"] == ckpt["lr_schedulers"][0]


def assert_every_utterance_once_per_epoch(records: list[dict], epochs: int) -> None:
    kept_ids = next(r for r in records if r["event"] == "start")["kept_train_ids"]
    batches = committed_batches(records)
    for epoch in range(epochs):
        ids = [i for b in batches if b["epoch"] == epoch for i in b["ids"]]
        assert Counter(ids) == Counter(kept_ids), f"epoch {epoch}: {Counter(ids) - Counter(kept_ids)} repeated, " \
                                                  f"{Counter(kept_ids) - Counter(ids)} missed"
    steps = [b["global_step"] for b in batches]
    assert steps == list(range(len(steps)))  # one update per step, none lost, none repeated


@pytest.mark.slow
def test_sigkill_mid_epoch_and_in_the_next_epoch_resumes_where_it_stopped(tiny_corpus, tmp_path):
    """Killed at step 3 (epoch 0) and, after resuming, at step 7 (epoch 1); the third run ends the
    training. Data loader workers prefetch (num_workers=2), the harder case for the position."""
    cmd = command(tiny_corpus, tmp_path, "logger=default", "data.num_workers=2", "+callbacks.probe.kill_at=[3,7]")
    env = wandb_env(tmp_path)
    for expected in (-signal.SIGKILL, -signal.SIGKILL, 0):
        proc = run(cmd, tmp_path, **env)
        assert proc.returncode == expected, proc.stdout[-2000:] + proc.stderr[-3000:]

    records = read_records(tmp_path / "probe")
    starts = [r for r in records if r["event"] == "start"]
    kills = [r["global_step"] for r in records if r["event"] == "kill"]
    assert kills == [3, 7]
    # each run starts from the last checkpoint: the step before the kill (whose checkpoint
    # was not yet written), one step lost per kill
    assert [s["global_step"] for s in starts] == [0, 2, 6]
    assert [s["epoch"] for s in starts] == [0, 0, 1]
    # the resumed epoch goes on with the batch after the checkpoint, from the same shuffle
    runs = batches_by_run(records)
    assert runs[1][0]["epoch"] == 0 and runs[1][0]["batch_idx"] == 2 and runs[1][0]["ids"] == runs[0][2]["ids"]
    assert runs[2][0]["epoch"] == 1 and runs[2][0]["batch_idx"] == 1 and runs[2][0]["ids"] == runs[1][4]["ids"]
    assert_every_utterance_once_per_epoch(records, EPOCHS)
    # same optimiser and scheduler state as the checkpoints the runs resumed from: the
    # checkpoint is step-last.ckpt, rewritten since, so compare with the saves' global steps
    saves = [r for r in records if r["event"] == "save"]
    assert {2, 6} <= {s["global_step"] for s in saves}
    done = (tmp_path / "outputs" / "runs" / "survive" / "fit_done.json").read_text()
    assert '"global_step": 10' in done
    # one wandb run across the three processes
    wandb_ids = {s["wandb_id"] for s in starts}
    assert len(wandb_ids) == 1 and None not in wandb_ids
    offline = sorted((tmp_path / "outputs" / "runs" / "survive" / "wandb").glob("offline-run-*"))
    (wandb_id,) = wandb_ids
    assert len(offline) == 3 and all(p.name.endswith(f"-{wandb_id}") for p in offline)


@pytest.mark.slow
def test_sigkill_while_a_checkpoint_is_written_keeps_the_previous_one(tiny_corpus, tmp_path):
    """The process is killed half-way through writing the step-4 checkpoint: the step-3 one is
    intact under its name, and the same command resumes from it."""
    ckpt_dir = tmp_path / "outputs" / "runs" / "survive" / "checkpoints"
    cmd = command(tiny_corpus, tmp_path)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=run_env(**{STALL_ENV: "4:120"}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(ckpt_dir.glob(".step-last.ckpt.tmp-*")):
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the checkpoint write never started"
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        proc.kill()  # SIGKILL
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    (partial,) = ckpt_dir.glob(".step-last.ckpt.tmp-*")
    with pytest.raises(Exception):  # noqa: B017  (torch raises several types for a cut file)
        torch.load(partial, map_location="cpu", weights_only=True)
    previous = torch.load(ckpt_dir / "step-last.ckpt", map_location="cpu", weights_only=True)
    assert previous["global_step"] == 3

    proc = run(cmd, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_records(tmp_path / "probe")
    starts = [r for r in records if r["event"] == "start"]
    assert [s["global_step"] for s in starts] == [0, 3]
    assert_every_utterance_once_per_epoch(records, EPOCHS)
    assert not list(ckpt_dir.glob(".*.tmp-*"))  # the killed write's leftover is cleaned up
    assert torch.load(ckpt_dir / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 10
