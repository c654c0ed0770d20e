"""The approximation matrix (fastasr.studies.matrix): spec rules, cells and tables, member configs.

The smoke matrix end to end is in test_matrix_run.py (slow)."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib.image
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fastasr.config import CONFIG_DIR
from fastasr.studies import matrix as mx
from fastasr.studies.matrix.cells import ordered
from fastasr.training.derived_config import resolve_train_config

DEFAULT_TRAIN = ["full", "shared-full", "lsh-1", "lsh-4", "clustered-100", "i-clustered-100"]
DEFAULT_EVAL = ["full", "shared-full", "lsh-1", "lsh-4", "clustered-100", "clustered-200",
                "i-clustered-100", "i-clustered-200", "oracle-top"]


def compose_cfg(name: str, *overrides: str):
    """A composed config; train.yaml as training runs it, its derived values filled in."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(name, overrides=list(overrides))
    return resolve_train_config(cfg) if name == "train" else cfg


# ----------------------------------------------------------------------------- rules
def test_train_specs_map_to_attention_and_qk_sharing():
    assert mx.train_member("full") == ("full", False)
    assert mx.train_member("shared-full") == ("full", True)
    assert mx.train_member("lsh-1") == ("lsh-1", True)
    assert mx.train_member("lsh-4") == ("lsh-4", True)
    assert mx.train_member("clustered-100") == ("clustered-100", False)
    assert mx.train_member("i-clustered-100") == ("i-clustered-100", False)
    with pytest.raises(ValueError, match="unknown attention spec"):
        mx.train_member("fulll")


def test_eval_pairs_that_cannot_run_have_a_reason():
    assert mx.eval_attention("full", False) == ("full", "")
    assert mx.eval_attention("full", True) == ("full", "")
    assert mx.eval_attention("shared-full", True) == ("full", "")
    assert mx.eval_attention("oracle-top", False) == ("oracle-top", "")
    attention, reason = mx.eval_attention("shared-full", False)
    assert attention is None and "shared Q/K" in reason
    for lsh in ("lsh-1", "lsh-4"):
        attention, reason = mx.eval_attention(lsh, False)
        assert attention is None and "LSH" in reason
        assert mx.eval_attention(lsh, True) == (lsh, "")



def test_spec_lists_are_checked_before_anything_runs():
    mx.rules.check_spec_lists(["full", "shared-full"], ["oracle-top", "shared-full"])
    with pytest.raises(mx.MatrixError, match="matrix.train is empty"):
        mx.rules.check_spec_lists([], ["full"])
    with pytest.raises(mx.MatrixError, match="matrix.eval lists a spec twice"):
        mx.rules.check_spec_lists(["full"], ["full", "full"])
    with pytest.raises(mx.MatrixError, match="matrix.eval: .*fulll"):
        mx.rules.check_spec_lists(["full"], ["fulll"])


@pytest.mark.parametrize("member", ["full", "shared-full", "lsh-1", "lsh-3", "lsh-8", "clustered-100",
                                    "i-clustered-25", "oracle-top"])
def test_train_py_member_gets_the_rules_attention_and_qk_sharing(member):
    """`python train.py experiment=matrix_member member=X` (and every multirun job, which
    composes the same config) builds the model the matrix rule says, for any spec."""
    cfg = compose_cfg("train", "experiment=matrix_member", f"member={member}")
    attention, shared = mx.train_member(member)
    assert cfg.model.attention == attention and cfg.model.shared_qk is shared
    wsj = compose_cfg("train", "experiment=matrix_member_wsj", f"member={member}")
    assert wsj.model.attention == attention and wsj.model.shared_qk is shared


def test_unknown_member_is_a_clear_config_error():
    with pytest.raises(Exception, match="unknown attention spec.*fulll"):
        compose_cfg("train", "experiment=matrix_member", "member=fulll")


def _cells(train, evals):
    cells = {}
    for i, t in enumerate(train):
        shared = mx.train_member(t)[1]
        for j, e in enumerate(evals):
            attention, reason = mx.eval_attention(e, shared)
            if attention is None:
                cells[(t, e)] = mx.Cell(t, e, mx.NA, reason=reason)
            else:
                cells[(t, e)] = mx.Cell(t, e, mx.OK, per=10.0 + i + j / 10, wer=30.0 + i, utterances=300,
                                        decode_seconds=1.5, checkpoint=f"runs/{t}/best.ckpt", train_step=99)
    return cells


def test_csv_round_trip(tmp_path):
    cells = _cells(DEFAULT_TRAIN, DEFAULT_EVAL)
    cells[("full", "clustered-200")] = mx.Cell("full", "clustered-200", mx.FAILED, reason="RuntimeError: boom, bang")
    path = tmp_path / "matrix.csv"
    mx.write_cells(path, ordered(cells, DEFAULT_TRAIN, DEFAULT_EVAL))
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(mx.CSV_COLUMNS)
    assert len(rows) == len(DEFAULT_TRAIN) * len(DEFAULT_EVAL)
    back = mx.read_cells(path)
    assert back[("full", "full")].per == pytest.approx(10.0)
    assert back[("full", "full")].train_step == 99 and back[("full", "full")].utterances == 300
    assert back[("full", "clustered-200")].reason == "RuntimeError: boom, bang"
    na = [c for c in back.values() if c.status == mx.NA]
    # full, clustered-100, i-clustered-100 lack shared Q/K: shared-full, lsh-1, lsh-4 are n/a on them
    assert len(na) == 9 and all(c.reason for c in na)


def test_a_cell_is_current_for_one_model_and_one_decoder():
    from fastasr.studies.matrix.cells import decoding_label, is_current

    greedy = decoding_label(None)
    assert greedy.startswith("greedy-") and decoding_label({"name": "greedy"}) == greedy
    beam = {"name": "beam", "lm": {"path": "/data/a/lm/words-3gram.arpa"}, "lm_weight": 2.0}
    assert decoding_label(beam).startswith("beam-")
    assert decoding_label(dict(beam, lm_weight=1.0)) != decoding_label(beam)  # any setting counts
    # files by their names: the same LM in a moved data directory keeps the cells
    assert decoding_label(dict(beam, lm={"path": "/moved/lm/words-3gram.arpa"})) == decoding_label(beam)
    cell = mx.Cell("full", "full", mx.OK, per=1.0, checkpoint="runs/full/best.ckpt", train_step=9, decoding=greedy)
    assert is_current(cell, "runs/full/best.ckpt", 9, greedy)
    assert not is_current(cell, "runs/full/best.ckpt", 9, decoding_label(beam))
    assert not is_current(cell, "runs/full/best.ckpt", 10, greedy)
    old = mx.Cell("full", "full", mx.OK, per=1.0, checkpoint="runs/full/best.ckpt", train_step=9)
    assert not is_current(old, "runs/full/best.ckpt", 9, greedy)  # matrix.csv from before the column


def test_markdown_is_table_1(tmp_path):
    train, evals = DEFAULT_TRAIN, DEFAULT_EVAL
    cells = _cells(train, evals)
    del cells[("i-clustered-100", "oracle-top")]  # not computed yet
    text = mx.write_markdown(tmp_path / "matrix.md", cells, train, evals, "T", commands=["python -m x"])
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
    path = mx.plot_heatmap(tmp_path / "matrix.png", cells, DEFAULT_TRAIN, DEFAULT_EVAL, "t")
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
            member = mx.compose_member(cfg, spec)
            attention, shared = mx.train_member(spec)
            assert member.run_dir == tmp_path / "matrix" / "default" / "runs" / spec
            assert member.cfg.model.attention == attention and member.cfg.model.shared_qk is shared
            assert member.cfg.test is False
            job = compose("train", overrides=member.overrides, return_hydra_config=True)
            sweep = Path(job.hydra.sweep.dir) / str(job.hydra.sweep.subdir)
            assert sweep == member.run_dir == Path(job.hydra.run.dir)
        # an LSH spec outside the experiment's table still gets shared Q/K
        assert mx.compose_member(cfg, "lsh-3").cfg.model.shared_qk is True
        # a member whose overrides contradict the rule is refused, naming the key
        bad = compose("cross_eval", overrides=[f"paths.output_dir={tmp_path}",
                                               'matrix.extra_overrides=["model.shared_qk=true"]'])
        with pytest.raises(mx.MatrixError, match="model.shared_qk=True, expected False"):
            mx.compose_member(bad, "full")


def test_paper_presets():
    wsj = compose_cfg("train", "experiment=paper_wsj")
    assert wsj.model.layers == 9 and wsj.model.d_model == 192 and wsj.model.heads == 6
    assert wsj.model.ff_dim == 768 and wsj.model.subsampling == 1
    assert wsj.data.features.num_mel_bins == 40
    assert wsj.optim.lr == 1e-4 and wsj.optim.weight_decay == 0.01
    assert wsj.trainer.gradient_clip_val == 10.0
    swbd = compose_cfg("train", "experiment=paper_swbd")
    assert swbd.model.layers == 12 and swbd.data.features.num_mel_bins == 80 and swbd.optim.lr == 1e-4
    assert swbd.data.features.sample_rate == 8000  # telephone speech: not up-sampled
    shared = compose_cfg("train", "experiment=shared_full")
    assert shared.model.shared_qk is True and shared.model.attention.name == "full"


def test_long_matrix_trains_the_budget_studys_model_on_the_long_corpus(tmp_path):
    """matrix=long (Table 1 in the long regime) and the budget study train the same model,
    experiment=matrix_member_long: the paper's width, 2x subsampling, on data=synthetic_long."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("cross_eval", overrides=["matrix=long", f"paths.output_dir={tmp_path}"])
        assert list(cfg.matrix.train) == DEFAULT_TRAIN and list(cfg.matrix.eval) == DEFAULT_EVAL
        member = mx.compose_member(cfg, "i-clustered-100")
        budget = compose("budget", overrides=[f"paths.output_dir={tmp_path}"])
    assert member.run_dir == tmp_path / "matrix" / "long" / "runs" / "i-clustered-100"
    m = member.cfg
    assert m.data.train_manifest.endswith("synthetic_long/train.jsonl") and m.trainer.max_epochs == 8
    assert m.trainer.max_time is None  # the 8 epochs end every member, not trainer/default's 18 minutes
    assert (m.model.layers, m.model.d_model, m.model.heads, m.model.ff_dim, m.model.subsampling) == (6, 192, 6, 768, 2)
    assert m.model.attention == "i-clustered-100" and m.model.positions == "absolute" and m.model.conv_kernel is None
    assert budget.budget.experiment == "matrix_member_long" and budget.budget.data is None


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
