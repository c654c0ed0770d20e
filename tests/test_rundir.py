"""The run-directory layout (fastasr.rundir) and the loggers built in it (fastasr.training.loggers)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir

from fastasr.config import CONFIG_DIR
from fastasr.rundir import RunDir
from fastasr.training.derived_config import resolve_train_config
from fastasr.training.loggers import build_loggers, finish_wandb


def _ckpt(path, step: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": step, "state_dict": {"w": torch.zeros(1)}}, path)


def test_latest_checkpoint_is_the_one_with_the_most_steps(tmp_path):
    run = RunDir(tmp_path / "r")
    assert run.latest_checkpoint() is None
    _ckpt(run.checkpoints / "last.ckpt", 40)
    assert run.latest_checkpoint() == run.checkpoints / "last.ckpt"
    _ckpt(run.checkpoints / "step-last.ckpt", 55)
    assert run.latest_checkpoint() == run.checkpoints / "step-last.ckpt"
    _ckpt(run.checkpoints / "last.ckpt", 60)
    assert run.latest_checkpoint() == run.checkpoints / "last.ckpt"


def test_resolve_ckpt_path(tmp_path):
    run = RunDir(tmp_path / "r")
    assert run.resolve_ckpt_path(None) is None and run.resolve_ckpt_path("auto") is None
    with pytest.raises(FileNotFoundError, match="no last.ckpt"):
        run.resolve_ckpt_path("last")
    with pytest.raises(FileNotFoundError, match="nope.ckpt: no such checkpoint"):
        run.resolve_ckpt_path(str(tmp_path / "nope.ckpt"))
    _ckpt(run.checkpoints / "last.ckpt", 7)
    assert run.resolve_ckpt_path("auto") == run.resolve_ckpt_path("last") == str(run.checkpoints / "last.ckpt")
    with pytest.raises(FileExistsError, match="ckpt_path=last"):
        run.resolve_ckpt_path("null")


def test_fit_done_results_and_metrics_files(tmp_path):
    run = RunDir(tmp_path / "r")
    assert run.read_fit_done() is None
    run.write_fit_done({"global_step": 9, "val": {"val/per": 12.5}})
    assert run.read_fit_done() == {"global_step": 9, "val": {"val/per": 12.5}}
    assert json.loads(run.fit_done_file.read_text())["global_step"] == 9
    run.fit_done_file.write_text('{"global_st')  # torn by a kill
    assert run.read_fit_done() is None
    run.clear_fit_done()
    assert not run.fit_done_file.exists()
    assert run.add_to_results({"learning_warnings": []}) is False and run.read_results() is None  # none to add to
    run.write_results({"per": 1.0})
    assert run.read_results() == {"per": 1.0}
    assert run.add_to_results({"learning_warnings": []}) is True
    assert run.read_results() == {"per": 1.0, "learning_warnings": []}
    for version in (10, 2, 0):
        (run.path / "csv" / f"version_{version}").mkdir(parents=True)
        (run.path / "csv" / f"version_{version}" / "metrics.csv").write_text("step\n")
    assert [p.parent.name for p in run.metrics_files()] == ["version_0", "version_2", "version_10"]


def test_wandb_run_id_is_kept(tmp_path):
    run = RunDir(tmp_path / "r")
    first = run.wandb_run_id()
    assert len(first) == 12 and run.wandb_run_id() == first == run.wandb_run_id_file.read_text().strip()


def test_wandb_run_id_is_written_by_rank_zero_only_and_an_empty_file_is_not_trusted(tmp_path, monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    run = RunDir(tmp_path / "r").create()
    run.wandb_run_id_file.write_text("")  # left by a writer killed before it wrote the id
    first = run.wandb_run_id()
    assert len(first) == 12 and run.wandb_run_id_file.read_text().strip() == first
    assert [p.name for p in run.path.iterdir()] == [run.wandb_run_id_file.name]  # no temporary left
    other = RunDir(tmp_path / "other").create()
    monkeypatch.setenv("LOCAL_RANK", "1")  # a DDP rank > 0: gets an id, writes nothing
    assert len(other.wandb_run_id()) == 12 and not other.wandb_run_id_file.exists()
    assert run.wandb_run_id() == first  # an existing id is read on every rank


def test_rundir_imports_no_torch():
    code = "import sys, fastasr.rundir; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_build_loggers_puts_them_in_the_run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = resolve_train_config(compose("train", overrides=["logger=default", f"paths.output_dir={tmp_path}"]))
    run = RunDir(tmp_path / "r").create()
    csv_logger, tb_logger, wandb_logger = build_loggers(cfg, run)
    assert csv_logger.save_dir == tb_logger.save_dir == str(run.path)
    assert wandb_logger._wandb_init["id"] == run.wandb_run_id()
    assert wandb_logger._wandb_init["config"]["model"]["layers"] == cfg.model.layers


def test_finish_wandb_closes_the_current_run(monkeypatch):
    """finish_wandb finishes wandb's current run when there is one, and never imports wandb.
    (A real wandb module here would leave process-wide wandb state behind for later tests;
    the trainings of test_dashboards and test_cross_eval run it for real.)"""
    import types

    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    finish_wandb()  # wandb never imported: a no-op that does not import it
    assert "wandb" not in sys.modules
    finished = []
    fake = types.SimpleNamespace(run=object(), finish=lambda: finished.append(True))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    finish_wandb()
    assert finished == [True]
    fake.run = None
    finish_wandb()
    assert finished == [True]
