"""SIGTERM (a scheduler preempting the job) between two step checkpoints: the run writes a
checkpoint at the step it reached, exits with status 143, and the same command resumes at
exactly that step, with the batch after it, and finishes.

Built as the SIGKILL tests of ``tests/test_survival.py``: ``python train.py`` in a subprocess on
the tiny model and corpus (5 batches an epoch on each process), ``tests/run_probe.py`` recording
each batch and the state each run starts from. :class:`PauseForSignal` (in this file, loaded by
the subprocess from ``tests/`` on PYTHONPATH) holds the run at the end of a given step; this
test then sends the real SIGTERM, as a scheduler would, to the training process (under DDP to
rank 0, whose Lightning launcher passes it on to rank 1).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from run_probe import read_records, run_env, train_command

EPOCHS = 2
BATCHES = 5  # an epoch, on each process
STEP = 3  # the end of epoch 0's 3rd batch, between step checkpoints (every 200 steps)


class PauseForSignal(L.Callback):
    """At the end of training step ``step`` of the command's first run, write ``<marker>.rank<r>``
    and wait up to ``seconds`` for a SIGTERM (not again once that file exists)."""

    def __init__(self, marker: str, step: int, seconds: float = 60.0) -> None:
        self.marker, self.step, self.seconds = marker, step, seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        marker = Path(f"{self.marker}.rank{trainer.global_rank}")
        if trainer.global_step != self.step or marker.exists():
            return
        marker.write_text(f"{trainer.global_step}\n")
        deadline = time.monotonic() + self.seconds
        while not trainer.received_sigterm and time.monotonic() < deadline:
            time.sleep(0.05)  # the signal handler runs in this (main) thread, between two sleeps


def command(corpus: Path, tmp_path: Path, processes: int) -> list[str]:
    if processes == 1:  # 2 utterances a batch, 2 data-loader workers (they prefetch: the harder case)
        setup = ["data.max_batch_size=2", "data.num_workers=2"]
    else:  # 1 utterance a batch on each of 2 processes (gloo), Lightning's launcher
        setup = ["trainer=ddp", "trainer.accelerator=cpu", f"trainer.devices={processes}", "data.max_batch_size=1"]
    return train_command(
        corpus, tmp_path / "outputs", tmp_path / "probe", "name=preempt", f"trainer.max_epochs={EPOCHS}",
        "data.min_batches_per_epoch=null", "test=false", "trainer.num_sanity_val_steps=0", *setup,
        # step checkpoints keep the default, every 200 steps: none is due in this 10-step run
        "+callbacks.pause._target_=test_preemption.PauseForSignal",
        f"+callbacks.pause.marker={tmp_path / 'paused'}", f"+callbacks.pause.step={STEP}",
    )


def batches_by_run(records: list[dict]) -> list[list[dict]]:
    runs: list[list[dict]] = []
    for r in records:
        if r["event"] == "start":
            runs.append([])
        elif r["event"] == "batch":
            runs[-1].append(r)
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("processes, whole_group", [(1, False), (1, True), (2, False)],
                         ids=["one-process", "one-process-and-its-workers", "ddp"])
def test_sigterm_mid_epoch_writes_a_checkpoint_at_that_step_and_resumes_there(tiny_corpus, tmp_path, processes,
                                                                            whole_group):
    """``whole_group``: the signal goes to the training process *and* its data-loader workers, as
    SLURM sends it to every process of a job step."""
    ckpt_dir = tmp_path / "outputs" / "runs" / "preempt" / "checkpoints"
    cmd = command(tiny_corpus, tmp_path, processes)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=run_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=whole_group)
    try:
        deadline = time.monotonic() + 150
        while not all((tmp_path / f"paused.rank{r}").exists() for r in range(processes)):
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "training never reached the step"
            time.sleep(0.1)
        if whole_group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, out[-3000:]
    assert f"SIGTERM: training stopped at step {STEP}" in out and "step-last.ckpt" in out, out[-3000:]

    # only the SIGTERM checkpoint: no step, epoch or last checkpoint was due before step 3
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["step-last.ckpt"]
    ckpt = torch.load(ckpt_dir / "step-last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == STEP and ckpt["epoch"] == 0
    assert ckpt["optimizer_states"] and ckpt["lr_schedulers"]  # a full trainer checkpoint
    (loader,) = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert loader == {"epoch": 0, "batches_done": STEP, "batches_per_epoch": BATCHES, "num_replicas": processes}
    saves = [r for rank in range(processes) for r in read_records(tmp_path / "probe", rank) if r["event"] == "save"]
    assert [s["global_step"] for s in saves] == [STEP]  # written once, by rank 0

    # the same command resumes at that step, with the next batch of the same epoch, and finishes
    again = subprocess.run(cmd, cwd=tmp_path, env=run_env(), capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    kept = sorted(read_records(tmp_path / "probe")[0]["kept_train_ids"])
    trained: dict[int, list[str]] = {epoch: [] for epoch in range(EPOCHS)}
    for rank in range(processes):
        records = read_records(tmp_path / "probe", rank)
        starts = [r for r in records if r["event"] == "start"]
        assert [(s["global_step"], s["epoch"]) for s in starts] == [(0, 0), (STEP, 0)]
        first, second = batches_by_run(records)
        assert [b["global_step"] for b in first] == list(range(STEP))  # stopped after the batch it was in
        assert (second[0]["epoch"], second[0]["batch_idx"], second[0]["global_step"]) == (0, STEP, STEP)
        assert [b["global_step"] for b in first + second] == list(range(BATCHES * EPOCHS))  # none lost or redone
        for b in first + second:
            trained[b["epoch"]] += b["ids"]
        if rank == 0:  # the resumed run starts with the optimiser and scheduler state of the checkpoint
            resumed = torch.load(starts[1]["optimizer"], map_location="cpu", weights_only=True)
            assert resumed["optimizer"]["param_groups"] == ckpt["optimizer_states"][0]["param_groups"]
            for key, state in ckpt["optimizer_states"][0]["state"].items():
                for name, value in state.items():
                    assert torch.equal(torch.as_tensor(resumed["optimizer"]["state"][key][name]),
                                       torch.as_tensor(value)), (key, name)
            assert resumed["scheduler"] == ckpt["lr_schedulers"][0]
    assert all(sorted(ids) == kept for ids in trained.values())  # each utterance once an epoch
    done = (tmp_path / "outputs" / "runs" / "preempt" / "fit_done.json").read_text()
    assert f'"global_step": {BATCHES * EPOCHS}' in done
