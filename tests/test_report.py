"""`python -m fastasr.cli.report DIR`: one static HTML page for a run or a matrix directory."""

from __future__ import annotations

import csv
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from omegaconf import OmegaConf

from fastasr.cli import report as report_command
from fastasr.studies import report
from fastasr.studies.matrix.cells import (
    CSV_FILE,
    FAILED,
    MD_FILE,
    NA,
    OK,
    PNG_FILE,
    Cell,
    ordered,
    write_cells,
)
from fastasr.studies.matrix.render import plot_heatmap, write_markdown
from fastasr.studies.matrix.rules import REASON_LSH


class _Tags(HTMLParser):
    """Counts tags and checks that every opened table/tr/td/th/h2 is closed."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}
        self.stack: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        if tag in ("table", "tr", "td", "th", "h2"):
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in ("table", "tr", "td", "th", "h2"):
            assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1:]}>"
            self.stack.pop()


def parse(page: str) -> _Tags:
    tags = _Tags()
    tags.feed(page)
    assert not tags.stack, f"unclosed: {tags.stack}"
    return tags


def write_metrics(path: Path, epochs: int, steps_per_epoch: int, start_step: int = 0, start_epoch: int = 0) -> None:
    """A CSVLogger metrics.csv as a training run writes it (sparse rows)."""
    cols = ["epoch", "step", "train/loss", "train/grad_norm", "perf/batch_seconds", "perf/data_seconds",
            "perf/frames_per_second", "perf/peak_memory_mb", "lr-RAdam", "val/loss", "val/per", "val/wer"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        step = start_step
        for e in range(start_epoch, start_epoch + epochs):
            w.writerow({"epoch": "", "step": step, "lr-RAdam": 1e-3})
            for _ in range(steps_per_epoch):
                w.writerow({"epoch": e, "step": step, "train/loss": 50.0 / (step + 1), "train/grad_norm": 5.0,
                            "perf/batch_seconds": 0.5, "perf/data_seconds": 0.01,
                            "perf/frames_per_second": 3000.0, "perf/peak_memory_mb": 900.0 + step})
                step += 1
            w.writerow({"epoch": e, "step": step - 1, "val/loss": 30.0 / (e + 1), "val/per": 80.0 - 10 * e,
                        "val/wer": 100.0 - 5 * e})


def make_run_dir(run_dir: Path, attention: str = "i-clustered-100") -> Path:
    write_metrics(run_dir / "csv" / "version_0" / "metrics.csv", epochs=2, steps_per_epoch=5)
    write_metrics(run_dir / "csv" / "version_1" / "metrics.csv", epochs=1, steps_per_epoch=5,
                  start_step=10, start_epoch=2)  # a resumed run adds a version
    OmegaConf.save(OmegaConf.create({
        "name": run_dir.name,
        "model": {"attention": attention, "shared_qk": False, "d_model": 96, "heads": 3, "layers": 3},
        "optim": {"_target_": "torch.optim.RAdam", "lr": 1e-3},
        "trainer": {"max_epochs": 3},
    }), run_dir / "config.yaml")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "best-epoch002-step14.ckpt").write_bytes(b"0" * 2048)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"0" * 2048)
    (run_dir / "fit_done.json").write_text(json.dumps({
        "max_epochs": 3, "epochs": 3, "global_step": 15,
        "best_ckpt": str(run_dir / "checkpoints" / "best-epoch002-step14.ckpt"),
        "last_ckpt": str(run_dir / "checkpoints" / "last.ckpt"), "val": {"val/per": 60.0}}))
    (run_dir / "attention_maps").mkdir()
    for epoch in range(3):
        matplotlib.image.imsave(run_dir / "attention_maps" / f"epoch{epoch:03d}-step{5 * epoch + 4}.png",
                                np.random.default_rng(epoch).random((20, 30, 3)))
    return run_dir


def test_read_metrics_concatenates_resumed_versions(tmp_path):
    run = make_run_dir(tmp_path / "run")
    rows = report.read_metrics(run)
    xs, ys = report.series(rows, "val/per", "epoch")
    assert xs == [0.0, 1.0, 2.0] and ys == [80.0, 70.0, 60.0]
    assert len(report.series(rows, "train/loss")[0]) == 15


def test_run_report_has_curves_tables_maps_and_config(tmp_path):
    run = make_run_dir(tmp_path / "run")
    path = report.build_report(run)
    assert path == run / "report.html"
    page = path.read_text()
    tags = parse(page)
    assert "i-clustered-100" in page and "3 epochs, 15 steps" in page
    assert "best-epoch002-step14.ckpt" in page and "epoch002-step14.png" in page
    assert "60.00 (epoch 2)" in page  # best val/per
    # 7 curves (loss, error rates, lr, grad norm, speed, throughput, memory) + the last 3 maps
    assert tags.counts["img"] == 7 + 3
    assert len(re.findall(r'src="data:image/png;base64,', page)) == 10
    assert "http://" not in page.replace("http://www.w3.org", "") and "<script" not in page


def test_matrix_report_has_table_1(tmp_path):
    mdir = tmp_path / "matrix" / "m"
    mdir.mkdir(parents=True)
    train, evals = ["full", "lsh-1"], ["full", "lsh-1", "clustered-100"]
    cells = {
        ("full", "full"): Cell("full", "full", OK, per=12.34, wer=40.0, utterances=300),
        ("full", "lsh-1"): Cell("full", "lsh-1", NA, reason=REASON_LSH),
        ("full", "clustered-100"): Cell("full", "clustered-100", OK, per=45.6, wer=80.0, utterances=300),
        ("lsh-1", "full"): Cell("lsh-1", "full", OK, per=20.5, wer=50.0, utterances=300),
        ("lsh-1", "lsh-1"): Cell("lsh-1", "lsh-1", OK, per=15.25, wer=45.0, utterances=300),
        ("lsh-1", "clustered-100"): Cell("lsh-1", "clustered-100", FAILED, reason="RuntimeError: <oops>"),
    }
    write_cells(mdir / CSV_FILE, ordered(cells, train, evals))
    write_markdown(mdir / MD_FILE, cells, train, evals, "m")
    plot_heatmap(mdir / PNG_FILE, cells, train, evals)
    OmegaConf.save(OmegaConf.create({"matrix": {"name": "m", "train": train, "eval": evals, "split": "dev"}}),
                   mdir / "cross_eval.yaml")
    for t in train:
        make_run_dir(mdir / "runs" / t, attention=t)

    assert report_command.main([str(mdir)]) == 0
    page = (mdir / "report.html").read_text()
    tags = parse(page)
    assert page.count('<table class="matrix">') == 2  # PER and WER
    assert '<td class="diag">12.34</td>' in page and '<td class="diag">15.25</td>' in page
    assert "45.60" in page and "20.50" in page
    assert 'class="na"' in page and "LSH hashes queries and keys together" in page
    assert "RuntimeError: &lt;oops&gt;" in page  # escaped
    assert tags.counts["img"] >= 1 + 3  # heatmap + member curves
    assert "matrix.csv" in page and "runs/lsh-1" in page


def test_report_refuses_a_directory_it_cannot_read(tmp_path, capsys):
    assert report_command.main([str(tmp_path / "nowhere")]) == 2
    (tmp_path / "empty").mkdir()
    assert report_command.main([str(tmp_path / "empty")]) == 2
    assert "neither a run directory" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["run", "matrix"])
def test_kind_of(tmp_path, kind):
    d = tmp_path / kind
    d.mkdir()
    (d / ("config.yaml" if kind == "run" else "matrix.csv")).write_text("train,eval,status\n")
    assert report.kind_of(d) == kind
