"""The approximation matrix: spec rules, tables, configs, and the smoke matrix end to end."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib.image
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fastasr import cross_eval as ce
from fastasr.config import CONFIG_DIR

DEFAULT_TRAIN = ["full", "shared-full", "lsh-1", "lsh-4", "clustered-100", "i-clustered-100"]
DEFAULT_EVAL = ["full", "shared-full", "lsh-1", "lsh-4", "clustered-100", "clustered-200",
                "i-clustered-100", "i-clustered-200", "oracle-top"]


def compose_cfg(name: str, *overrides: str):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose(name, overrides=list(overrides))


# ----------------------------------------------------------------------------- rules
def test_train_specs_map_to_attention_and_qk_sharing():
    assert ce.train_member("full") == ("full", False)
    assert ce.train_member("shared-full") == ("full", True)
    assert ce.train_member("lsh-1") == ("lsh-1", True)
    assert ce.train_member("lsh-4") == ("lsh-4", True)
    assert ce.train_member("clustered-100") == ("clustered-100", False)
    assert ce.train_member("i-clustered-100") == ("i-clustered-100", False)
    with pytest.raises(ValueError, match="unknown attention spec"):
        ce.train_member("fulll")


def test_eval_pairs_that_cannot_run_have_a_reason():
    assert ce.eval_attention("full", False) == ("full", "")
    assert ce.eval_attention("full", True) == ("full", "")
    assert ce.eval_attention("shared-full", True) == ("full", "")
    assert ce.eval_attention("oracle-top", False) == ("oracle-top", "")
    attention, reason = ce.eval_attention("shared-full", False)
    assert attention is None and "shared Q/K" in reason
    for lsh in ("lsh-1", "lsh-4"):
        attention, reason = ce.eval_attention(lsh, False)
        assert attention is None and "LSH" in reason
        assert ce.eval_attention(lsh, True) == (lsh, "")


def _cells(train, evals):
    cells = {}
    for i, t in enumerate(train):
        shared = ce.train_member(t)[1]
        for j, e in enumerate(evals):
            attention, reason = ce.eval_attention(e, shared)
            if attention is None:
                cells[(t, e)] = ce.Cell(t, e, ce.NA, reason=reason)
            else:
                cells[(t, e)] = ce.Cell(t, e, ce.OK, per=10.0 + i + j / 10, wer=30.0 + i, utterances=300,
                                        decode_seconds=1.5, checkpoint=f"runs/{t}/best.ckpt", train_step=99)
    return cells


def test_csv_round_trip(tmp_path):
    cells = _cells(DEFAULT_TRAIN, DEFAULT_EVAL)
    cells[("full", "clustered-200")] = ce.Cell("full", "clustered-200", ce.FAILED, reason="RuntimeError: boom, bang")
    path = tmp_path / "matrix.csv"
    ce.write_cells(path, ce.ordered(cells, DEFAULT_TRAIN, DEFAULT_EVAL))
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(ce.CSV_COLUMNS)
    assert len(rows) == len(DEFAULT_TRAIN) * len(DEFAULT_EVAL)
    back = ce.read_cells(path)
    assert back[("full", "full")].per == pytest.approx(10.0)
    assert back[("full", "full")].train_step == 99 and back[("full", "full")].utterances == 300
    assert back[("full", "clustered-200")].reason == "RuntimeError: boom, bang"
    na = [c for c in back.values() if c.status == ce.NA]
    # full, clustered-100, i-clustered-100 lack shared Q/K: shared-full, lsh-1, lsh-4 are n/a on them
    assert len(na) == 9 and all(c.reason for c in na)


def test_markdown_is_table_1(tmp_path):
    train, evals = DEFAULT_TRAIN, DEFAULT_EVAL
    cells = _cells(train, evals)
    del cells[("i-clustered-100", "oracle-top")]  # not computed yet
    text = ce.write_markdown(tmp_path / "matrix.md", cells, train, evals, "T", commands=["python -m x"])
    table = [line for line in text.splitlines() if line.startswith("|")]
    per_table = table[: len(evals) + 2]
    assert [c.strip() for c in per_table[0].split("|")[2:-1]] == train
    for line in per_table:
        assert line.count("|") == len(train) + 2, line
    assert per_table[1].startswith("|---|")
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in per_table[2:]}
    assert list(rows) == evals
    assert rows["full"][0] == "**10.00**"  # diagonal marked
    assert rows["lsh-4"][train.index("lsh-4")].startswith("**")
    assert rows["lsh-1"][0] == "n/a" and rows["shared-full"][0] == "n/a"
    assert rows["oracle-top"][train.index("i-clustered-100")] == "—"
    assert "LSH hashes queries and keys together" in text and "not computed yet" in text
    assert "WER (%)" in text and "python -m x" in text


def test_heatmap_is_written(tmp_path):
    cells = _cells(DEFAULT_TRAIN, DEFAULT_EVAL)
    path = ce.plot_heatmap(tmp_path / "matrix.png", cells, DEFAULT_TRAIN, DEFAULT_EVAL, "t")
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 400


# ----------------------------------------------------------------------------- configs
def test_default_matrix_config_is_table_1():
    cfg = compose_cfg("cross_eval")
    assert list(cfg.matrix.train) == DEFAULT_TRAIN
    assert list(cfg.matrix.eval) == DEFAULT_EVAL
    assert cfg.matrix.split == "dev"
    assert cfg.matrix_dir.endswith("matrix/default")


def test_members_get_predictable_run_dirs_same_as_multirun(tmp_path):
    """cross_eval composes each member exactly as `python train.py [-m] experiment=matrix_member
    member=<spec>` would, and a multirun job writes to the same directory."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("cross_eval", overrides=[f"paths.output_dir={tmp_path}"])
        for spec in DEFAULT_TRAIN:
            member = ce.compose_member(cfg, spec)
            attention, shared = ce.train_member(spec)
            assert member.run_dir == tmp_path / "matrix" / "default" / "runs" / spec
            assert member.cfg.model.attention == attention and member.cfg.model.shared_qk is shared
            assert member.cfg.test is False
            job = compose("train", overrides=member.overrides, return_hydra_config=True)
            sweep = Path(job.hydra.sweep.dir) / str(job.hydra.sweep.subdir)
            assert sweep == member.run_dir == Path(job.hydra.run.dir)
        # an LSH spec outside the experiment's table still gets shared Q/K
        assert ce.compose_member(cfg, "lsh-3").cfg.model.shared_qk is True


def test_paper_presets():
    wsj = compose_cfg("train", "experiment=paper_wsj")
    assert wsj.model.layers == 9 and wsj.model.d_model == 192 and wsj.model.heads == 6
    assert wsj.model.ff_dim == 768 and wsj.model.subsampling == 1
    assert wsj.data.features.num_mel_bins == 40
    assert wsj.optim.lr == 1e-4 and wsj.optim.weight_decay == 0.01
    assert wsj.trainer.gradient_clip_val == 10.0
    swbd = compose_cfg("train", "experiment=paper_swbd")
    assert swbd.model.layers == 12 and swbd.data.features.num_mel_bins == 80 and swbd.optim.lr == 1e-4
    shared = compose_cfg("train", "experiment=shared_full")
    assert shared.model.shared_qk is True and shared.model.attention.name == "full"


def test_paper_sized_member_takes_nothing_from_the_cpu_sizing():
    paper = compose_cfg("train", "experiment=paper_wsj")
    member = compose_cfg("train", "experiment=matrix_member_wsj", "member=clustered-100", "matrix_name=paper_wsj")
    for section in ("data", "optim", "scheduler", "trainer"):
        mine, theirs = (OmegaConf.to_container(c[section], resolve=True) for c in (member, paper))
        if section == "data":  # batches priced by each one's attention: clustered linear, full quadratic
            assert (mine.pop("length_cost"), theirs.pop("length_cost")) == ("linear", "quadratic")
        assert mine == theirs, section
    m, p = (OmegaConf.to_container(c.model, resolve=True) for c in (member, paper))
    assert m.pop("attention") == "clustered-100"
    p.pop("attention")
    assert m == p


# ----------------------------------------------------------------------------- the smoke matrix
def _smoke_cfg(corpus: Path, out: Path, *extra: str):
    return compose_cfg(
        "cross_eval",
        "matrix=smoke",
        f"paths.output_dir={out}",
        "matrix.data=manifest",
        "matrix.extra_overrides=[" + ",".join(
            f'"{o}"' for o in (
                f"data.train_manifest={corpus / 'train.jsonl'}",
                f"data.dev_manifest={corpus / 'dev.jsonl'}",
                f"data.test_manifest={corpus / 'test.jsonl'}",
                "data.num_workers=0",
                *extra,
            )) + "]",
    )


def _wandb_file_has(run_root: Path, key: bytes) -> bool:
    files = list(run_root.glob("wandb/offline-run-*/run-*.wandb"))
    return bool(files) and any(key in f.read_bytes() for f in files)


def test_smoke_matrix_is_complete_and_resumable(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))
    cfg = _smoke_cfg(tiny_corpus, tmp_path)
    train, evals = list(cfg.matrix.train), list(cfg.matrix.eval)
    assert len(train) == 2 and len(evals) == 3

    first = ce.run_matrix(cfg)
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
    second = ce.run_matrix(cfg)
    assert second.trained == [] and second.decoded == []
    assert {p: p.stat().st_mtime_ns for p in mdir.glob("runs/*/checkpoints/*.ckpt")} == ckpts
    assert (mdir / "matrix.csv").read_text() == csv_before
    assert json.loads((mdir / "last_invocation.json").read_text())["decoded"] == 0

    # Killed half-way: the missing cell alone is decoded; no model is retrained
    kept = [r for r in rows if (r["train"], r["eval"]) != ("lsh-1", "i-clustered-8")]
    with (mdir / "matrix.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(kept)
    third = ce.run_matrix(cfg)
    assert third.trained == [] and third.decoded == [("lsh-1", "i-clustered-8")]
    assert third.cells[("lsh-1", "i-clustered-8")].status == ce.OK

    # The same matrix name with another model config is refused, not silently mixed
    with pytest.raises(ce.MatrixError, match="model.layers"):
        ce.run_matrix(_smoke_cfg(tiny_corpus, tmp_path, "model.layers=1"))
