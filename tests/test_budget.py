"""The budget study (``python -m fastasr.cli.budget``, ``make budget``): member specs and configs,
curves read back from resumed runs, the Pareto front, failures retried, and the smoke study end
to end (slow: trains two tiny models for 15 s each, reuses them, resumes one)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.image
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_train_eval import corpus_overrides

from fastasr.config import CONFIG_DIR, PROJECT_ROOT
from fastasr.rundir import RunDir
from fastasr.studies import budget as bd
from fastasr.studies.budget import running


def _smoke_overrides(corpus: Path, out: Path, *extra: str) -> list[str]:
    """The budget overrides of the smoke study on ``corpus``, writing under ``out``."""
    return [
        "budget=smoke",
        f"paths.output_dir={out}",
        "budget.data=manifest",
        "budget.extra_overrides=[" + ",".join(f'"{o}"' for o in corpus_overrides(corpus)) + "]",
        *extra,
    ]


def _compose(*overrides: str):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("budget", overrides=list(overrides))


# ----------------------------------------------------------------------------- specs and configs
@pytest.mark.parametrize("value, seconds", [
    ("00:00:20:00", 1200.0), ("00:01:00:30", 3630.0), ("01:00:00:00", 86400.0), ("00:00:00:15", 15.0),
    ({"minutes": 2, "seconds": 5}, 125.0),
])
def test_max_time_seconds(value, seconds):
    assert bd.max_time_seconds(value) == seconds


@pytest.mark.parametrize("value", ["20:00", "00:00:00:00", 1200, None, {"weeks": 1}])
def test_max_time_seconds_refuses(value):
    with pytest.raises(bd.BudgetError, match="DD:HH:MM:SS"):
        bd.max_time_seconds(value)


def test_member_specs():
    specs = bd.member_specs([{"attention": "full", "layers": 2},
                             {"attention": "i-clustered-100", "layers": 4, "overrides": ["optim.lr=1e-3"]}])
    assert [s.name for s in specs] == ["full-L2", "i-clustered-100-L4"]
    assert specs[1].overrides == ("optim.lr=1e-3",)
    for members, message in [
        ([], "empty"),
        ([{"attention": "full"}], "expected {attention"),
        ([{"attention": "fast", "layers": 2}], "members\\[0\\]"),
        ([{"attention": "full", "layers": 0}], "integer ≥ 1"),
        ([{"attention": "full", "layers": 2, "depth": 3}], "unknown key"),
        ([{"attention": "full", "layers": 2}, {"attention": "full", "layers": 2}], "full-L2 twice"),
    ]:
        with pytest.raises(bd.BudgetError, match=message):
            bd.member_specs(members)


def _flat(node, prefix=""):
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def _differing_keys(*cfgs) -> set[str]:
    """The dotted keys whose resolved values are not the same in every config."""
    flats = [_flat(OmegaConf.to_container(c, resolve=True)) for c in cfgs]
    return {k for k in set().union(*flats) if len({repr(f.get(k)) for f in flats}) > 1}


def test_default_members_differ_only_in_attention_and_depth(tmp_path):
    """The default study: the paper's model (2x subsampling) on the long corpus, one budget and
    one schedule for all; between members only the attention, the depth and the names differ."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("budget", overrides=[f"paths.output_dir={tmp_path}"])
        members = [bd.compose_budget_member(cfg, s) for s in bd.member_specs(cfg.budget.members)]
    assert [m.spec for m in members] == [
        "full-L2", "full-L4", "full-L6", "i-clustered-100-L4", "i-clustered-100-L6",
        "i-clustered-200-L4", "i-clustered-200-L6", "clustered-100-L6"]
    for m in members:
        c = m.cfg
        assert m.run_dir == tmp_path / "budget" / "default" / "runs" / m.spec
        assert (c.model.d_model, c.model.heads, c.model.ff_dim, c.model.subsampling) == (192, 6, 768, 2)
        assert c.model.layers == m.layers and c.model.attention == m.attention and not c.model.shared_qk
        assert c.trainer.max_time == "00:00:20:00" and c.trainer.max_epochs == -1 and m.max_time_s == 1200
        assert c.scheduler._target_.endswith("BudgetSchedule") and c.scheduler.warmup_steps == 100
        assert c.data.train_manifest.endswith("synthetic_long/train.jsonl") and c.data.length_cost == "linear"
        assert c.callbacks.training_clock._target_ == "fastasr.studies.budget.clock.TrainingClock"
        assert c.test is False
    assert _differing_keys(*(m.cfg for m in members)) == {
        "member", "name", "attention", "model.attention", "model.layers", "paths.run_dir", "logger.wandb.name"}


def test_table2_frames_is_table2_at_every_frame(tmp_path):
    """budget=table2_frames trains table2's members with no subsampling (the paper's frame rate)
    for 10 min and no test; everything else of each member's config is table2's."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        configs = {}
        for preset in ("table2", "table2_frames"):
            cfg = compose("budget", overrides=[f"budget={preset}", f"paths.output_dir={tmp_path}"])
            configs[preset] = {s.name: bd.compose_budget_member(cfg, s) for s in bd.member_specs(cfg.budget.members)}
    frames = configs["table2_frames"]
    assert list(frames) == ["full-L6", "clustered-100-L6", "i-clustered-100-L6"]
    for spec, member in frames.items():
        c = member.cfg
        assert member.run_dir == tmp_path / "budget" / "table2-frames" / "runs" / spec
        assert (c.model.subsampling, c.trainer.max_time, member.max_time_s, c.test) == (1, "00:00:10:00", 600, False)
        assert _differing_keys(c, configs["table2"][spec].cfg) == {
            "model.subsampling", "trainer.max_time", "test", "name", "paths.run_dir", "logger.wandb.name",
            "logger.wandb.group"}


def test_changed_member_config_is_refused(tmp_path):
    cfg = _compose(f"paths.output_dir={tmp_path}")
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        member = bd.compose_budget_member(cfg, bd.member_specs(cfg.budget.members)[0])
    member.run_dir.mkdir(parents=True)
    saved = OmegaConf.to_container(member.cfg, resolve=True)
    saved["model"]["d_model"] = 96
    OmegaConf.save(OmegaConf.create(saved), member.run_dir / "config.yaml")
    with pytest.raises(bd.BudgetError, match="model.d_model.*budget.name"):
        member.check_saved_config()


# ----------------------------------------------------------------------------- curves and table
def _metrics(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = ["epoch", "step", "train/loss", "val/per", "budget/train_seconds", "budget/epochs", "budget/updates",
               "perf/peak_memory_mb", "test/per"]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: r.get(k, "") for k in columns})


def _val(step, seconds, per):
    return {"step": step, "val/per": per, "budget/train_seconds": seconds, "budget/epochs": step / 10,
            "budget/updates": step}


def test_read_curve_drops_what_a_resume_rolled_back(tmp_path):
    """Version 0 validated at 10, 20 and 30 updates, then was killed; version 1 resumed from
    update 20 (its last checkpoint): the point at 30 never happened in the run's history."""
    _metrics(tmp_path / "csv/version_0/metrics.csv",
             [{"step": 0, "train/loss": 5.0}, _val(10, 11.0, 90.0), _val(20, 21.0, 80.0), _val(30, 31.0, 50.0)])
    _metrics(tmp_path / "csv/version_1/metrics.csv",
             [{"step": 20, "train/loss": 3.0}, _val(30, 33.0, 70.0), _val(40, 43.0, 60.0)])
    curve = bd.read_curve(tmp_path, "per")
    assert [(p.updates, p.train_seconds, p.dev) for p in curve] == [
        (10, 11.0, 90.0), (20, 21.0, 80.0), (30, 33.0, 70.0), (40, 43.0, 60.0)]
    assert bd.best_point(curve).dev == 60.0
    assert bd.read_curve(tmp_path / "nothing") == [] and bd.best_point([]) is None


def test_table2_columns_peak_memory_test_error_and_time_to_the_common_target(tmp_path):
    """Peak memory and test error come from the CSV logs; the common target is the worst member's
    best dev error, and each member's time to target is its first validation at or below it."""
    from fastasr.studies.budget.table import mark_time_to_target

    _metrics(tmp_path / "csv/version_0/metrics.csv",
             [{"step": 5, "perf/peak_memory_mb": 900.0}, {"step": 10, "perf/peak_memory_mb": 1200.0}, _val(10, 11.0, 50.0)])
    _metrics(tmp_path / "csv/version_1/metrics.csv", [{"step": 20, "perf/peak_memory_mb": 1000.0}, {"step": 20, "test/per": 31.5}])
    assert max(bd.curves.logged_values(tmp_path, "perf/peak_memory_mb")) == 1200.0
    assert bd.curves.logged_values(tmp_path, "test/per") == [31.5] and bd.curves.logged_values(tmp_path, "nothing") == []

    def row(member, best, status=bd.OK):
        return bd.BudgetRow(member, member, 4, status=status, best_dev=best)

    rows = [row("full", 20.0), row("clustered-100", 30.0), row("i-clustered-100", 22.0), row("lsh-1", None, bd.FAILED)]
    curves = {
        "full": [bd.CurvePoint(100.0, 1, 10, 40.0), bd.CurvePoint(200.0, 2, 20, 28.0), bd.CurvePoint(300.0, 3, 30, 20.0)],
        "clustered-100": [bd.CurvePoint(60.0, 1, 10, 45.0), bd.CurvePoint(120.0, 2, 20, 30.0)],
        "i-clustered-100": [bd.CurvePoint(80.0, 1, 10, 29.0), bd.CurvePoint(160.0, 2, 20, 22.0)],
    }
    assert mark_time_to_target(rows, curves) == 30.0  # clustered-100's best: every finished member reached it
    assert [r.to_target_seconds for r in rows] == [200.0, 120.0, 80.0, None]
    assert mark_time_to_target([rows[3]], curves) is None
    rows[0].seconds_per_epoch, rows[1].seconds_per_epoch = 250.0, 80.0  # Table 2's s / epoch against full's
    rows[0].seconds_per_later_epoch, rows[1].seconds_per_later_epoch = 200.0, 110.0  # the first epoch left out
    text = bd.render.markdown(rows, [], "T", "d", ["n"], ["c"])
    assert "| time to target | test PER |" in text and "| 3 min 20 s |" in text
    assert "| s / epoch | s / epoch after the first | forward s / epoch |" in text
    assert "| 250.0 | 200.0 |" in text and "| 80.0 (0.32× full) | 110.0 (0.55× full) |" in text
    failed = next(line for line in text.splitlines() if line.startswith("| lsh-1 |"))
    assert failed.count("|") == text.splitlines()[4].count("|")  # as many cells as the header


def test_seconds_an_epoch_after_the_first_leave_its_start_up_out():
    """From the validation that ends the first epoch to the last, over the epochs between; none
    where less than half an epoch followed the first (or it never ended)."""
    from fastasr.studies.budget.curves import later_epoch_seconds

    point = lambda seconds, epochs: bd.CurvePoint(seconds, epochs, int(100 * epochs), 50.0)  # noqa: E731
    # a first epoch of 26 s (start-up), then 6 s an epoch: 9 s an epoch over all, 6 after the first
    curve = [point(16.0, 0.5), point(26.0, 1.0), point(29.0, 1.5), point(32.0, 2.0), point(44.0, 4.0)]
    assert later_epoch_seconds(curve) == pytest.approx(6.0)
    assert later_epoch_seconds(curve[:3]) == pytest.approx(6.0)  # half an epoch after it: enough
    assert later_epoch_seconds(curve[:2]) is None and later_epoch_seconds(curve[:1]) is None
    assert later_epoch_seconds([point(30.0, 0.9), point(40.0, 1.2)]) is None  # 0.2 of an epoch after the first
    assert later_epoch_seconds([]) is None


def test_pareto_front_and_csv_roundtrip(tmp_path):
    def row(member, forward, best, status=bd.OK):
        return bd.BudgetRow(member, member.rsplit("-L", 1)[0], int(member.rsplit("-L", 1)[1]), status=status,
                            best_dev=best, forward_seconds_epoch=forward)

    rows = [row("full-L2", 10.0, 40.0), row("full-L6", 30.0, 20.0), row("i-clustered-100-L6", 20.0, 25.0),
            row("clustered-100-L6", 22.0, 30.0), row("i-clustered-200-L6", 20.0, 25.0),
            row("full-L4", 5.0, 10.0, status=bd.FAILED)]
    front = bd.mark_pareto(rows)
    assert [r.member for r in front] == ["full-L2", "i-clustered-100-L6", "i-clustered-200-L6", "full-L6"]
    assert not rows[3].pareto and not rows[5].pareto  # dominated; failed rows are never on it
    running.write_rows(tmp_path / bd.CSV_FILE, rows)
    back = bd.read_rows(tmp_path / bd.CSV_FILE)
    assert list(back) == [r.member for r in rows]
    assert back["full-L2"] == rows[0] and back["full-L4"].status == bd.FAILED and back["full-L6"].pareto


def test_failed_training_is_recorded_and_retried(tiny_corpus, tmp_path, monkeypatch):
    """A member whose training raises is a `failed` row with the reason (the study goes on and
    writes every output); the next invocation trains it again."""
    calls = []

    def broken(member):
        calls.append(member.spec)
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(running, "train_budget_member", broken)
    cfg = _compose(*_smoke_overrides(tiny_corpus, tmp_path), "budget.wandb=disabled")
    result = bd.run_budget(cfg)
    bdir = tmp_path / "budget" / "smoke"
    assert calls == ["full-L1", "i-clustered-8-L1"] and result.trained == []
    assert [r.status for r in result.failed] == [bd.FAILED, bd.FAILED]
    rows = bd.read_rows(bdir / bd.CSV_FILE)
    assert "out of memory (simulated)" in rows["full-L1"].reason
    assert "failed: training failed: RuntimeError" in (bdir / bd.MD_FILE).read_text()
    for png in (bd.TIME_PNG, bd.FORWARD_PNG):
        assert (bdir / png).is_file()
    bd.run_budget(cfg)
    assert calls == ["full-L1", "i-clustered-8-L1"] * 2
    # budget.train_missing=false: nothing is trained, the rows say what would train them
    missing = bd.run_budget(_compose(*_smoke_overrides(tiny_corpus, tmp_path), "budget.wandb=disabled",
                                     "budget.train_missing=false"))
    assert len(calls) == 4 and {r.status for r in missing.rows.values()} == {bd.MISSING}
    assert "python train.py experiment=matrix_member_base member=full" in missing.rows["full-L1"].reason


# ----------------------------------------------------------------------------- the smoke study
def _wandb_file_has(run_root: Path, key: bytes, wait_s: float = 30.0) -> bool:
    """Whether an offline wandb run under ``run_root`` holds ``key`` (wandb's service may still be
    writing when ``run.finish()`` returns)."""
    deadline = time.monotonic() + wait_s
    while True:
        if any(key in f.read_bytes() for f in run_root.glob("wandb/offline-run-*/run-*.wandb")):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


@pytest.mark.slow
def test_smoke_budget_is_complete_reused_and_resumed(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))
    cfg = _compose(*_smoke_overrides(tiny_corpus, tmp_path))
    names = ["full-L1", "i-clustered-8-L1"]
    bdir = tmp_path / "budget" / "smoke"

    first = bd.run_budget(cfg)
    assert first.budget_dir == bdir and first.trained == names and first.timed == names
    with (bdir / bd.CSV_FILE).open() as f:
        rows = list(csv.DictReader(f))
    assert [r["member"] for r in rows] == names
    for r in rows:
        assert r["status"] == "ok" and r["metric"] == "per", r
        assert float(r["best_dev"]) >= 0 and float(r["best_dev"]) <= float(r["final_dev"]) + 1e-9
        assert 15 <= float(r["train_seconds"]) < 120  # the 15 s budget, plus the validation at the stop
        assert int(r["updates"]) >= 1 and float(r["epochs"]) > 0 and float(r["seconds_per_epoch"]) > 0
        assert float(r["forward_seconds"]) > 0 and float(r["forward_seconds_epoch"]) > float(r["forward_seconds"])
        assert r["forward_split"] == "dev" and int(r["forward_utterances"]) == 2 and int(r["parameters"]) > 0
        assert r["checkpoint"].startswith(f"runs/{r['member']}/checkpoints/")
        assert (bdir / "runs" / r["member"] / "fit_done.json").is_file()
    assert any(r["pareto"] == "true" for r in rows)
    with (bdir / bd.CURVES_FILE).open() as f:
        curve_rows = list(csv.DictReader(f))
    for name in names:
        seconds = [float(c["train_seconds"]) for c in curve_rows if c["member"] == name]
        assert seconds and seconds == sorted(seconds)
    md = (bdir / bd.MD_FILE).read_text()
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(names) and all(line.count("|") == 17 for line in table)  # 16 columns
    assert "python train.py experiment=matrix_member_base member=i-clustered-8" in md
    for png in (bd.TIME_PNG, bd.FORWARD_PNG):
        assert matplotlib.image.imread(bdir / png).shape[2] in (3, 4)
    assert _wandb_file_has(bdir, b"budget/table")

    # A second invocation trains nothing and times nothing: the same checkpoints, the same table
    ckpts = {p: p.stat().st_mtime_ns for p in bdir.glob("runs/*/checkpoints/*.ckpt")}
    csv_before = (bdir / bd.CSV_FILE).read_text()
    second = bd.run_budget(cfg)
    assert second.trained == [] and second.timed == [] and second.reused == names
    assert {p: p.stat().st_mtime_ns for p in bdir.glob("runs/*/checkpoints/*.ckpt")} == ckpts
    assert (bdir / bd.CSV_FILE).read_text() == csv_before

    # A run without fit_done.json (killed before it could write it) is resumed, not restarted:
    # last.ckpt holds the step where the budget stopped it and the time it had spent, so it
    # trains no further (a restart would train another 15 s), and the others are reused
    run = RunDir(bdir / "runs" / "full-L1")
    step_before = json.loads(run.fit_done_file.read_text())["global_step"]
    assert torch.load(run.checkpoints / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == step_before
    run.clear_fit_done()
    third = bd.run_budget(cfg)
    assert third.trained == ["full-L1"] and third.reused == ["i-clustered-8-L1"]
    assert run.fit_done_file.is_file() and json.loads(run.fit_done_file.read_text())["global_step"] == step_before
    assert len(run.metrics_files()) == 1  # nothing trained, so no second CSV version
    assert float(bd.read_rows(bdir / bd.CSV_FILE)["full-L1"].train_seconds) < 60

    # The command-line entry point (what `make budget` runs) reuses the same directory
    proc = subprocess.run(
        [sys.executable, "-m", "fastasr.cli.budget", *_smoke_overrides(tiny_corpus, tmp_path)],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| full-L1 | full | 1 |" in proc.stdout  # it prints budget.md, then where it is
    assert proc.stdout.strip().splitlines()[-1] == f"budget: {bdir / 'budget.md'} (every member: {bdir / 'budget.csv'})"
    assert json.loads((bdir / "last_invocation.json").read_text()) == {
        "trained": [], "reused": names, "timed": [], "failed": []}
    assert (bdir / "budget.log").is_file()  # Hydra's log beside budget.csv
