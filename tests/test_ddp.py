"""Real data-parallel training on the CPU: 2 processes (gloo), launched by Lightning or torchrun.

Each run is a subprocess with a time limit, so a hang fails the test instead of the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from run_probe import free_port, read_records, run_env, train_command
from test_bad_audio import bad_corpus

from fastasr.decoding.metrics import ErrorRates


def ddp_command(launcher: str, corpus: Path, out: Path, probe: Path) -> list[str]:
    command = train_command(
        corpus, out, probe,
        "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=1",
        "trainer.num_sanity_val_steps=0", "data.max_batch_size=1", "name=ddp",
        "callbacks.step_checkpoint.every_n_train_steps=2",
    )
    if launcher == "torchrun":  # torchrun starts both ranks; Lightning finds them in the environment
        return [command[0], "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
                f"--master_port={free_port()}", *command[1:]]
    return command  # Lightning's launcher starts rank 1 itself


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["lightning", "torchrun"])
def test_ddp_two_cpu_processes(tiny_corpus, tmp_path, launcher):
    """One utterance a batch. One training file is truncated, so one rank gets an empty batch
    for that step (it must still join the gradient all-reduce); the dev set has 3 utterances,
    so one rank validates on an empty padding batch (scored once, not twice)."""
    corpus = bad_corpus(tiny_corpus, tmp_path / "corpus", n_bad=1, bad_dev=False)
    dev = corpus / "dev.jsonl"
    dev.write_text(dev.read_text() + (corpus / "test.jsonl").read_text().splitlines(keepends=True)[0])
    out, probe = tmp_path / "outputs", tmp_path / "probe"
    proc = subprocess.run(ddp_command(launcher, corpus, out, probe), cwd=tmp_path, env=run_env(),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [read_records(probe, r) for r in (0, 1)]
    run_dir = out / "runs" / "ddp"

    # ranks see disjoint batches that together cover the epoch once (an odd count of batches
    # is padded by repeating one, so that both ranks run the same number of steps)
    kept = set(next(r for r in ranks[0] if r["event"] == "start")["kept_train_ids"])
    seen = [[i for r in recs if r["event"] == "batch" for i in r["ids"]] for recs in ranks]
    steps = [[r for r in recs if r["event"] == "batch"] for recs in ranks]
    (skipped,) = json.loads((run_dir / "bad_audio.json").read_text())["skipped"]  # gathered from its rank
    assert "truncated" in skipped["reason"]
    assert set(seen[0]) | set(seen[1]) | {skipped["id"]} == kept
    assert not set(seen[0]) & set(seen[1]) and len(kept) % 2 == 0
    assert len(steps[0]) == len(steps[1]) == len(kept) // 2
    assert sum(1 for recs in steps for r in recs if not r["ids"]) == 1  # the bad file's empty batch

    # after an optimiser step the two replicas hold identical weights
    weights = [next(r["sha256"] for r in recs if r["event"] == "weights") for recs in ranks]
    assert weights[0] == weights[1]

    # validation PER/WER: corpus-level rates from edit counts summed over the ranks
    counts = [[r for r in recs if r["event"] == "val_counts"][-1] for recs in ranks]
    assert sorted(c["utterances"] for c in counts) == [1, 2]  # each dev utterance scored once, on one rank
    logged = [[r for r in recs if r["event"] == "val_end"][-1]["metrics"] for recs in ranks]
    pooled_per = 100.0 * sum(c["unit_edits"] for c in counts) / sum(c["unit_total"] for c in counts)
    pooled_wer = 100.0 * sum(c["word_edits"] for c in counts) / sum(c["word_total"] for c in counts)
    for metrics in logged:
        assert metrics["val/per"] == pytest.approx(pooled_per, abs=1e-3)
        assert metrics["val/wer"] == pytest.approx(pooled_wer, abs=1e-3)
    per_rank = [100.0 * c["unit_edits"] / c["unit_total"] for c in counts]
    if abs(per_rank[0] - per_rank[1]) > 1e-6 and counts[0]["unit_total"] != counts[1]["unit_total"]:
        assert logged[0]["val/per"] != pytest.approx(sum(per_rank) / 2, abs=1e-6)

    # only rank zero writes checkpoints and logs; one output directory for the run
    assert [r for r in ranks[1] if r["event"] == "save"] == []
    assert any(r["event"] == "save" for r in ranks[0])
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["ddp"]
    assert sorted(p.name for p in (run_dir / "csv").iterdir()) == ["version_0"]
    assert [p.name for p in run_dir.glob("*.log")] == ["train.log"]
    assert not list(tmp_path.glob("lightning_logs")) and not list(tmp_path.glob("outputs/multirun"))
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert "last.ckpt" in ckpts and not [n for n in ckpts if ".tmp" in n]
    # the test split is scored over both ranks as well: every utterance once
    assert "test: PER=" in proc.stdout


def _reduce_worker(rank: int, world: int, init: str, results) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        # rank 0: 10 of 20 units wrong; rank 1: 1 of 80 units wrong
        rates = ErrorRates(unit_edits=[10, 1][rank], unit_total=[20, 80][rank], word_edits=[2, 1][rank],
                           word_total=[4, 16][rank], utterances=[1, 3][rank])

        def all_reduce_sum(t):
            torch.distributed.all_reduce(t)
            return t

        results[rank] = rates.summed_over_processes(all_reduce_sum).compute()
    finally:
        torch.distributed.destroy_process_group()


def test_error_rates_are_summed_over_processes_not_averaged(tmp_path):
    """Two gloo processes with different shares of the dev set: the corpus PER is 11/100 = 11 %,
    not the mean of the per-rank rates (50 % and 1.25 %)."""
    import torch.multiprocessing as mp

    init = f"file://{tmp_path / 'rendezvous'}"
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_reduce_worker, args=(2, init, results), nprocs=2, start_method="fork")
        results = dict(results)
    assert results[0] == results[1] == {"uer": pytest.approx(11.0), "wer": pytest.approx(15.0)}


def test_multi_node_and_slurm_launcher_configs_compose():
    """``trainer.num_nodes`` exists, and ``hydra/launcher=slurm`` reserves one task and one GPU
    per rank on ``trainer.num_nodes`` machines (composed and built; nothing is submitted)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from fastasr.config import CONFIG_DIR

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=slurm", "trainer=ddp", "trainer.devices=4",
                                          "trainer.num_nodes=2", "hydra.launcher.partition=gpu"],
                      return_hydra_config=True)
    assert cfg.trainer.num_nodes == 2 and cfg.trainer.strategy == "ddp"
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    assert launcher["_target_"].endswith("SlurmLauncher")
    resolved = {k: cfg.hydra.launcher[k] for k in ("nodes", "tasks_per_node", "gpus_per_node", "partition")}
    assert resolved == {"nodes": 2, "tasks_per_node": 4, "gpus_per_node": 4, "partition": "gpu"}
    assert cfg.hydra.launcher.max_num_timeout > 0  # a job that hits its time limit is requeued
    built = instantiate(cfg.hydra.launcher)
    assert built.params["nodes"] == 2 and built.params["tasks_per_node"] == 4


def test_only_rank_zero_writes_hydra_files(monkeypatch):
    from fastasr.distributed import hydra_overrides_for_rank, is_rank_zero_process

    for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    assert is_rank_zero_process() and hydra_overrides_for_rank(["name=x"]) == []
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert is_rank_zero_process()
    monkeypatch.setenv("LOCAL_RANK", "1")  # Lightning's launcher: rank 1's process
    assert not is_rank_zero_process()
    assert hydra_overrides_for_rank(["name=x"]) == ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    # what the launcher already passes is left as it is
    assert hydra_overrides_for_rank(["hydra.output_subdir=null"]) == ["hydra/job_logging=stdout"]
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("SLURM_PROCID", "3")  # srun: the fourth task
    assert not is_rank_zero_process()


LEAVE_AT_EXIT = """
import atexit, sys, torch
from fastasr.distributed import leave_process_group_at_exit
torch.distributed.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
# atexit runs its handlers last-registered first: this one runs after the process group's handler
atexit.register(lambda: print("in a group at exit:", torch.distributed.is_initialized(), flush=True))
leave_process_group_at_exit()
# and this one before it, unless the second call below registered the handler again
atexit.register(lambda: print("in a group before leaving:", torch.distributed.is_initialized(), flush=True))
leave_process_group_at_exit()  # registered once: the handler keeps its place
torch.distributed.all_reduce(torch.ones(1))
sys.exit({status})
"""


@pytest.mark.parametrize("status", [0, 143])
def test_process_group_is_destroyed_before_the_interpreter_exits(tmp_path, status):
    """A run under DDP leaves its gloo group at exit (a normal end, or the SIGTERM status), so
    gloo's threads do not outlive the interpreter (an abort, status -6, after the work is done)."""
    script = LEAVE_AT_EXIT.format(store=tmp_path / "store", status=status)
    proc = subprocess.run([sys.executable, "-c", script], env=run_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == status, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["in a group before leaving: True", "in a group at exit: False"]


def test_leave_process_group_outside_one_is_a_no_op():
    from fastasr.distributed import leave_process_group

    assert not torch.distributed.is_initialized()
    leave_process_group()
    assert not torch.distributed.is_initialized()
