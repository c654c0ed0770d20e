"""benchmarks/step/precision.py: a recipe's model stepped in float32 and under bf16 autocast."""

from __future__ import annotations

import json
import sys

from benchmarks.step import precision as precision_step


def test_precision_step_times_the_recipes_model_both_ways_and_writes_the_table(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["step/precision.py", "--lengths", "96", "48"])
    built = []
    real_build = precision_step.build_stepper

    def recording(*args):
        built.append(real_build(*args))
        return built[-1]

    monkeypatch.setattr(precision_step, "build_stepper", recording)
    precision_step.main(["--lengths", "96", "48", "--frames", "192", "--rounds", "2",
                         "--overrides", "data=manifest", "--out-dir", str(tmp_path)])
    # the recorded-speech recipe's model, once in each precision per length
    assert len(built) == 4 and [s.bf16 for s in built] == [False, True, False, True]
    assert len(built[0].model.encoder.layers) == 6
    for a, b in zip(built[0].model.state_dict().values(), built[1].model.state_dict().values()):
        assert a.shape == b.shape
    (md,) = tmp_path.glob("precision_step_*.md")
    rows = json.loads(md.with_suffix(".json").read_text())["rows"]
    assert [(r["n"], r["batch"]) for r in rows] == [(96, 2), (48, 4)]
    for r in rows:
        assert len(r["times"]["32-true"]) == len(r["times"]["bf16-mixed"]) == 2
        assert r["ratio"] == r["bf16-mixed_s"] / r["32-true_s"]
    text = md.read_text()
    assert "| 96 (2) |" in text and "| 48 (4) |" in text and "`python train.py data=manifest`'s" in text


def test_precision_step_profile_prints_one_steps_ops_and_writes_no_table(tmp_path, capsys):
    precision_step.main(["--profile", "bf16-mixed", "--lengths", "48", "--frames", "96", "--top", "5",
                         "--overrides", "data=manifest", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "### bf16-mixed, N = 48 (batch 2), one step" in out
    assert "Self CPU" in out and "aten::" in out
    assert not list(tmp_path.iterdir())  # a profile times nothing into the results
