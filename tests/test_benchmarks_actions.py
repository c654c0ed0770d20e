"""benchmarks/step/actions.py: Lightning's SimpleProfiler reports read from a run's log and a
study's, side by side."""

from __future__ import annotations

import lightning as L
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.profilers import SimpleProfiler

from benchmarks.step import actions


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> str:
    """A real report of this Lightning's SimpleProfiler: 3 steps of its demo model."""
    out = tmp_path_factory.mktemp("profile")
    trainer = L.Trainer(max_steps=3, limit_val_batches=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        profiler=SimpleProfiler(dirpath=out, filename="profile"))
    trainer.fit(BoringModel())
    return (out / "fit-profile.txt").read_text()


def test_short_names_drop_classes_and_arguments():
    assert actions.short_name("[LightningModule]CapturingASRLitModule.backward") == "module.backward"
    assert actions.short_name("[Strategy]SingleDeviceStrategy.training_step") == "strategy.training_step"
    assert actions.short_name("[Callback]ModelCheckpoint{'monitor': None, 'mode': 'min'}.on_train_batch_end") \
        == "callback ModelCheckpoint.on_train_batch_end"
    assert actions.short_name("[_TrainingEpochLoop].train_dataloader_next") == "training loop.train_dataloader_next"
    assert actions.short_name("run_training_batch") == "run_training_batch"


def test_a_study_log_gives_each_member_its_report(report, tmp_path):
    log = tmp_path / "budget.log"
    log.write_text("\n".join([
        "[2026-12-03 12:00:00,000][fastasr.studies.matrix.members][INFO] - training full-L6 in outputs/x/full-L6",
        report,
        "[2026-12-03 12:01:00,000][fastasr.studies.budget.running][INFO] - full-L6: timing the forward pass",
        "[2026-12-03 12:02:00,000][fastasr.studies.matrix.members][INFO] - training clustered-100-L6 in outputs/x/c",
        report,
    ]))
    reports = actions.read_reports(log)
    assert list(reports) == ["full-L6", "clustered-100-L6"]
    batch = reports["full-L6"]["run_training_batch"]
    assert batch.calls == 3 and batch.total > 0 and batch.mean == pytest.approx(batch.total / 3, rel=1e-3)
    assert reports["full-L6"][actions.EPOCH_ACTION].calls == 1
    assert "module.optimizer_step" in reports["full-L6"]  # BoringModel's hook, its class dropped
    assert "Total" not in reports["full-L6"] and "Action" not in reports["full-L6"]

    lines = actions.table(reports, top=3)
    assert lines[0] == "| action | full-L6 | clustered-100-L6 |"
    assert lines[2].startswith(f"| {actions.EPOCH_ACTION} | ") and "(1; 100.0 %)" in lines[2]
    assert len(lines) == 2 + 1 + 3


def test_a_run_directory_is_named_by_its_folder_and_written_with_its_tag(report, tmp_path, capsys):
    run = tmp_path / "runs" / "make-train"
    run.mkdir(parents=True)
    (run / "train.log").write_text("[...][lightning.pytorch.profilers.profiler][INFO] - " + report)
    actions.main([str(run), "--machine", "nvidia-h200", "--tag", "make_train", "--out-dir", str(tmp_path / "out")])
    written = (tmp_path / "out" / "actions_nvidia-h200_make_train.md").read_text()
    assert "| action | make-train |" in written and "| run_training_batch | " in written


def test_a_log_without_a_report_says_how_to_get_one(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("[...][fastasr.training.fit][INFO] - training: RAdam lr 0.001\n")
    with pytest.raises(ValueError, match=r"train\.log: no 'FIT Profiler Report' \(train with \+trainer\.profiler=simple"):
        actions.read_reports(log)
