"""benchmarks/models/learning_curves.py: the learning-curve tables of docs/results/*/RESULTS.md from run CSV logs."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def curves():
    from benchmarks.models import learning_curves

    return learning_curves


def write_run(root: Path, name: str, epochs: list[tuple[int, float, float, float]]) -> Path:
    """A run directory whose CSV log has, per epoch, (step, epoch seconds, val CER, val WER)."""
    path = root / name / "csv" / "version_0" / "metrics.csv"
    path.parent.mkdir(parents=True)
    lines = ["epoch,perf/epoch_seconds,step,train/loss,val/cer,val/wer"]
    for epoch, (step, seconds, cer, wer) in enumerate(epochs):
        lines += [f"{epoch},,{step - 1},2.0,,", f"{epoch},{seconds},{step},,,", f"{epoch},,{step},,{cer},{wer}"]
    path.write_text("\n".join(lines) + "\n")
    return root / name


def test_table_by_updates_and_minutes(curves, tmp_path, capsys):
    fast = write_run(tmp_path, "fast", [(200, 60, 95.0, 100.0), (400, 60, 40.0, 80.0), (600, 60, 10.0, 30.0)])
    slow = write_run(tmp_path, "slow", [(50, 120, 99.0, 100.0), (100, 120, 60.0, 90.0)])
    assert curves.main([str(fast), str(slow), "--at", "300", "600", "--minutes", "2", "3",
                        "--label", "slow=old defaults"]) == 0
    rows = {line.split(" | ")[0].strip("| "): line for line in capsys.readouterr().out.splitlines()}
    # at update 300: the validation at 200; after 2 training minutes: the second epoch's
    assert rows["fast"] == "| fast | 95.0 | 10.0 | 40.0 | 10.0 | 400 | 10.0 / 30.0 @ 600 (ep 2) | 600 |"
    # the slow run stopped before update 300; its epochs end at 2 and 4 minutes, so 2 and 3 min → epoch 0
    assert rows["old defaults"] == "| old defaults | – | – | 99.0 | 99.0 | 100 | 60.0 / 90.0 @ 100 (ep 1) | 100 |"
    assert curves.main([str(tmp_path / "missing")]) == 1
