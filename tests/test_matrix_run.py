"""The smoke matrix end to end (``matrix=smoke`` on the tiny corpus): two trainings, every
cell decoded, outputs written, resumed without retraining. Slow: ``make test-full`` / CI."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.image
import pytest
from hydra import compose, initialize_config_dir
from test_train_eval import corpus_overrides

from fastasr.config import CONFIG_DIR, PROJECT_ROOT
from fastasr.studies import matrix as mx

pytestmark = pytest.mark.slow


def _smoke_overrides(corpus: Path, out: Path, *extra: str) -> list[str]:
    """The cross_eval overrides of the smoke matrix on ``corpus``, writing under ``out``."""
    return [
        "matrix=smoke",
        f"paths.output_dir={out}",
        "matrix.data=manifest",
        "matrix.extra_overrides=[" + ",".join(
            f'"{o}"' for o in (
                *corpus_overrides(corpus),
                *extra,
            )) + "]",
    ]


def _smoke_cfg(corpus: Path, out: Path, *extra: str):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("cross_eval", overrides=_smoke_overrides(corpus, out, *extra))


def _wandb_file_has(run_root: Path, key: bytes, wait_s: float = 30.0) -> bool:
    """Whether an offline wandb run under ``run_root`` holds ``key``. wandb's service process
    may still be writing the file when ``run.finish()`` returns, so poll up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        files = list(run_root.glob("wandb/offline-run-*/run-*.wandb"))
        if any(key in f.read_bytes() for f in files):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def test_smoke_matrix_is_complete_and_resumable(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))
    cfg = _smoke_cfg(tiny_corpus, tmp_path)
    train, evals = list(cfg.matrix.train), list(cfg.matrix.eval)
    assert len(train) == 2 and len(evals) == 3

    first = mx.run_matrix(cfg)
    mdir = tmp_path / "matrix" / "smoke"
    assert first.matrix_dir == mdir
    assert first.trained == train

    # CSV complete: one row per pair, every pair ok or n/a with a reason
    with (mdir / "matrix.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {(r["train"], r["eval"]) for r in rows} == {(t, e) for t in train for e in evals}
    for r in rows:
        assert r["status"] in ("ok", "n/a"), r
        if r["status"] == "n/a":
            assert r["reason"] and not r["per"]
        else:
            assert float(r["per"]) >= 0 and float(r["wer"]) >= 0 and int(r["utterances"]) == 2
            assert float(r["decode_seconds"]) > 0 and r["checkpoint"] and int(r["train_step"]) >= 1
            assert r["decoding"].startswith("greedy-")  # the default decoder, by name and settings
    na = [(r["train"], r["eval"]) for r in rows if r["status"] == "n/a"]
    assert na == [("full", "lsh-1")]

    # Markdown well-formed, heatmap written, wandb table logged offline
    md = (mdir / "matrix.md").read_text()
    table = [line for line in md.splitlines() if line.startswith("|")][: len(evals) + 2]
    assert all(line.count("|") == len(train) + 2 for line in table)
    assert "| lsh-1 | n/a | **" in md
    assert matplotlib.image.imread(mdir / "matrix.png").shape[2] in (3, 4)
    assert _wandb_file_has(mdir, b"matrix/table")
    for t in train:
        assert (mdir / "runs" / t / "fit_done.json").is_file()

    # A second run trains nothing and decodes nothing
    ckpts = {p: p.stat().st_mtime_ns for p in mdir.glob("runs/*/checkpoints/*.ckpt")}
    csv_before = (mdir / "matrix.csv").read_text()
    second = mx.run_matrix(cfg)
    assert second.trained == [] and second.decoded == []
    assert {p: p.stat().st_mtime_ns for p in mdir.glob("runs/*/checkpoints/*.ckpt")} == ckpts
    assert (mdir / "matrix.csv").read_text() == csv_before
    assert json.loads((mdir / "last_invocation.json").read_text())["decoded"] == 0

    # The command-line entry point (what `make matrix` runs) reuses the same directory
    proc = subprocess.run(
        [sys.executable, "-m", "fastasr.cli.matrix", *_smoke_overrides(tiny_corpus, tmp_path)],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| lsh-1 | n/a | **" in proc.stdout  # it prints matrix.md, then where it is
    assert proc.stdout.strip().splitlines()[-1] == f"matrix: {mdir / 'matrix.md'} (every cell: {mdir / 'matrix.csv'})"
    assert json.loads((mdir / "last_invocation.json").read_text()) == {
        "trained": [], "decoded": 0, "reused": len(train) * len(evals), "failed": []}
    assert (mdir / "matrix.csv").read_text() == csv_before
    assert (mdir / "cross_eval.log").is_file()  # Hydra's log beside matrix.csv

    # Killed half-way: the missing cell alone is decoded; no model is retrained
    kept = [r for r in rows if (r["train"], r["eval"]) != ("lsh-1", "i-clustered-8")]
    with (mdir / "matrix.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(kept)
    third = mx.run_matrix(cfg)
    assert third.trained == [] and third.decoded == [("lsh-1", "i-clustered-8")]
    assert third.cells[("lsh-1", "i-clustered-8")].status == mx.OK

    # Another decoder (matrix.decoding): every decoded cell is recomputed with it, nothing retrained
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        beam_cfg = compose("cross_eval", overrides=[*_smoke_overrides(tiny_corpus, tmp_path),
                                                    "decoding@matrix.decoding=beam", "matrix.decoding.beam_size=8"])
    beam = mx.run_matrix(beam_cfg)
    ok = [k for k, c in beam.cells.items() if c.status == mx.OK]
    assert beam.trained == [] and sorted(beam.decoded) == sorted(ok) and len(ok) == 5
    assert all(beam.cells[k].decoding.startswith("beam-") for k in ok)
    assert "CTC beam search (beam 8, lexicon auto, no LM)" in (mdir / "matrix.md").read_text()
    assert mx.run_matrix(beam_cfg).decoded == []  # and kept while the decoder is the same

    # The same matrix name with another model config is refused, not silently mixed
    with pytest.raises(mx.MatrixError, match="model.layers"):
        mx.run_matrix(_smoke_cfg(tiny_corpus, tmp_path, "model.layers=1"))
