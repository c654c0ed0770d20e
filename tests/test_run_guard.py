"""A run directory is never damaged by a later command (issue #38): resuming checks the
checkpoint's config against the command's, a finished run is kept unless the command continues
it, and a rejected config writes nothing into any run directory."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from run_probe import imported_modules
from test_train_eval import TINY_MODEL, compose_train, data_overrides

from fastasr.config import PROJECT_ROOT
from fastasr.rundir import RunDir
from fastasr.training.derived_config import resolve_train_config
from fastasr.training.run_guard import RunRefused, check_run_dir

# (no sanity validation: the one validation prints each decoded dev example once)
FINISHED = ["trainer.max_epochs=1", "+trainer.limit_train_batches=1", "test=false", "callbacks.attention_maps=null",
            "trainer.num_sanity_val_steps=0"]


@pytest.fixture(scope="module")
def finished_train_py(tiny_corpus, tmp_path_factory):
    """``python train.py`` to a finished run named ``default``: the process (its output) and its
    outputs directory."""
    out = tmp_path_factory.mktemp("outputs")
    done = train_py(tiny_corpus, out)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, out


@pytest.fixture(scope="module")
def finished_run(finished_train_py):
    """A finished run named ``default`` (fit_done.json written), as ``make train`` leaves one."""
    _, out = finished_train_py
    run = RunDir(out / "runs" / "default")
    assert run.read_fit_done() is not None and run.name == "default"
    return out, run


def snapshot(path: Path) -> dict[str, str]:
    """Every file under ``path`` (hidden ones included) with its content's hash."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def train_py(tiny_corpus: Path, out: Path, *args: str, python: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``python [python] train.py <the finished run's settings> <args>``: what a newcomer types next."""
    command = [sys.executable, *python, "train.py", *data_overrides(tiny_corpus), *TINY_MODEL, "logger=csv",
               "trainer.accelerator=cpu", "trainer.enable_progress_bar=false", f"paths.output_dir={out}",
               *FINISHED, *args]
    return subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)


HYDRA_PREFIX = re.compile(r"\[[^]]+\]\[[^]]+\]\[[A-Z]+\] - ")  # [time][logger][LEVEL] - : Hydra's job logging
LEVEL_PREFIX = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL): ")  # Lightning's own stderr handler's format


def log_records(console: str) -> list[str]:
    """The records of a command's console output, each without its logging prefix (Hydra's or
    Lightning's): a record starts at a line with a prefix and holds the lines up to the next one (the
    model summary's table, a decoded example's HYP line); every other line before the first prefix
    is a record of its own."""
    records: list[str] = []
    continues = False
    for line in console.splitlines():
        prefix = HYDRA_PREFIX.match(line) or LEVEL_PREFIX.match(line)
        if prefix:
            records.append(line[prefix.end():])
            continues = True
        elif continues and records:
            records[-1] += "\n" + line
        else:
            records.append(line)
    return records


def test_a_run_prints_each_log_line_once(finished_train_py):
    """Each message of a ``train.py`` run, Lightning's included, shows once on the console, in
    Hydra's format, and is in the run's log file (Lightning's own handler printed each of its
    messages a second time, as ``INFO: <message>``). Records are compared without their prefix, so
    one message in two formats counts twice; a record's continuation lines count with it, not alone
    (the model summary's table draws the same rule twice); blank records are left out. With no
    sanity validation, the dev examples are decoded once (a sanity pass would print them again)."""
    done, out = finished_train_py
    console = done.stdout + done.stderr
    assert not [line for line in console.splitlines() if LEVEL_PREFIX.match(line)], console
    records = [r for r in log_records(done.stdout) + log_records(done.stderr) if r.strip()]
    assert [r for r, n in Counter(records).items() if n > 1] == [], console
    log_file = (out / "runs" / "default" / "train.log").read_text()
    for message in ("Seed set to", "GPU available:", "Total params", "`Trainer.fit` stopped"):  # Lightning's
        assert console.count(message) == 1 and log_file.count(message) == 1, (message, console)


def test_the_readme_example_after_a_finished_run_is_refused_and_the_run_kept(tiny_corpus, finished_run):
    out, run = finished_run
    before = snapshot(run.path)
    done = train_py(tiny_corpus, out, "model.layers=9", "attention=i_clustered")
    assert done.returncode == 2, done.stderr
    message = done.stderr.strip().splitlines()
    assert len(message) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "model.layers=9 (the run has 1)" in message[0] and "attention=" in message[0]
    assert "name=<new name>" in message[0]
    assert snapshot(run.path) == before
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["default"]


def test_rerunning_a_finished_run_is_refused(tiny_corpus, finished_run):
    """The same command again would only re-test the old model and overwrite its results."""
    out, run = finished_run
    before = snapshot(run.path)
    done = train_py(tiny_corpus, out)
    assert done.returncode == 2 and "has finished training" in done.stderr, done.stderr
    assert "ckpt_path=last" in done.stderr and "trainer.max_epochs" in done.stderr
    assert snapshot(run.path) == before


@pytest.mark.parametrize("args, key", [
    (["model.layers=-1"], "model.layers=-1; expected an integer ≥ 1"),
    (["model.layers=four"], "model.layers='four'; expected an integer ≥ 1"),
    (["attention=clustered", "attention.clusters=0"], "attention.clusters=0"),
])
def test_a_rejected_config_leaves_no_trace(tiny_corpus, finished_run, args, key):
    out, run = finished_run
    before = snapshot(run.path)
    for name in ([], ["name=fresh"]):
        done = train_py(tiny_corpus, out, *args, *name)
        assert done.returncode == 2 and key in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert snapshot(run.path) == before
    assert not (out / "runs" / "fresh").exists()


def test_a_refusal_does_not_wait_for_the_training_stack(tiny_corpus, finished_run):
    """A mistyped override is Hydra's refusal, before torch loads; a value the config check refuses
    is refused with torch loaded (the check builds the attention) but not Lightning. Both exit
    before ``train.py`` imports the training modules (the seconds a refusal took)."""
    out, run = finished_run
    before = snapshot(run.path)
    mistyped = train_py(tiny_corpus, out, "attention=clusterd", python=("-X", "importtime"))
    assert mistyped.returncode == 1 and "Could not find 'attention/clusterd'" in mistyped.stderr, mistyped.stderr
    assert "clustered" in mistyped.stderr  # Hydra lists the options
    assert {"hydra", "omegaconf"} <= imported_modules(mistyped.stderr)
    assert "torch" not in imported_modules(mistyped.stderr)
    refused = train_py(tiny_corpus, out, "model.layers=-1", python=("-X", "importtime"))
    assert refused.returncode == 2 and "model.layers=-1; expected an integer ≥ 1" in refused.stderr, refused.stderr
    assert "torch" in imported_modules(refused.stderr) and "lightning" not in imported_modules(refused.stderr)
    assert snapshot(run.path) == before


def test_continuing_a_finished_run_is_explicit(tiny_corpus, finished_run):
    """More epochs (or time), or ckpt_path=last, continue it; a fresh name starts a new run."""
    out, run = finished_run
    last = str(run.checkpoints / "last.ckpt")

    def check(*overrides: str):
        return check_run_dir(resolve_train_config(compose_train(tiny_corpus, out, *FINISHED, *overrides)), run)

    with pytest.raises(RunRefused, match="has finished training"):
        check()
    assert check("trainer.max_epochs=2") == last
    assert check("ckpt_path=last") == last
    assert check("trainer.max_time=00:01:00:00") == last  # the built-in recipe's is shorter
    with pytest.raises(RunRefused, match=r"model.heads=1 \(the run has 2\)"):
        check("trainer.max_epochs=2", "model.heads=1")
    with pytest.raises(RunRefused, match=r"tokenizer=char \(the run has phoneme\)"):
        check("ckpt_path=last", "tokenizer=char")
    with pytest.raises(RunRefused, match=r"features.num_mel_bins=80 \(the run has 40\)"):
        check("ckpt_path=last", "features.num_mel_bins=80")
    with pytest.raises(RunRefused, match=r"features.snip_edges=False \(the run has True\)"):
        check("ckpt_path=last", "features.snip_edges=false")
    with pytest.raises(RunRefused, match=r"ckpt_path=null \(or name=<new name>\)"):  # another run's checkpoint
        check_run_dir(resolve_train_config(compose_train(tiny_corpus, out, "name=other", f"ckpt_path={last}",
                                                        "model.layers=2")), RunDir(out / "runs" / "other"))
    assert check_run_dir(resolve_train_config(compose_train(tiny_corpus, out, "name=new")), RunDir(out / "runs" / "new")) is None


def test_a_checkpoint_older_than_a_features_key_resumes_at_its_default(tiny_corpus, tmp_path):
    """A checkpoint whose features predate ``snip_edges`` and ``high_freq`` was computed with Kaldi's
    defaults: resuming it at those defaults names no difference; at another value, that value."""
    from dataclasses import asdict

    from fastasr.data.features import FeatureConfig
    from fastasr.training.run_guard import resume_differences

    cfg = resolve_train_config(compose_train(tiny_corpus, tmp_path))
    old = asdict(FeatureConfig.from_dict(dict(cfg.data.features)))
    old.pop("snip_edges"), old.pop("high_freq")
    ckpt = {"recogniser": {"features": old}}
    assert [d for d in resume_differences(cfg, ckpt, None) if d.startswith("features")] == []
    cfg.data.features.high_freq = -400.0
    assert [d for d in resume_differences(cfg, ckpt, None) if d.startswith("features")] == [
        "features.high_freq=-400.0 (the run has 0.0)"]
