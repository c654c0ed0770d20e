"""A wiring check of the documented recorded-speech command on a tiny corpus of short utterances.

It is not a guard against CTC's blank plateau, and is named so: it trains on easy synthesised
speech, where settings that stayed on the plateau on a held-out corpus of recorded speech leave it
too, and it changes the command (``+trainer.max_steps=600``, so the learning-rate schedule decays
over 600 updates instead of 30 minutes; the final decoding, tuning and averaging off). What it
checks is that ``train.py data=manifest tokenizer=char`` with only the manifests runs the
recorded-speech recipe end to end on the shape that cut the batch (a few hundred utterances of a
few seconds: ``data.min_batches_per_epoch`` lowers the batch budget and says so) and learns there:
the dev CER falls below 90 % within the 600 updates. Lightning's ``EarlyStopping`` with
``stopping_threshold`` ends the run at the first validation below 90 % (it changes no update
before it). What guards the plateau itself are the recorded runs of docs/results/robustness and
the not-learning warning (``callbacks.not_learning``, tests/test_not_learning.py). A few minutes on
2 CPU cores.
"""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
from test_train_eval import corpus_overrides

from fastasr.config import PROJECT_ROOT

UPDATES = 600  # the recipe's promise: off the plateau within 600 updates
PLATEAU_CER = 90.0


def off_plateau_stop(cer: float) -> list[str]:
    """Overrides adding Lightning's EarlyStopping: stop at the first validation whose dev CER is
    below ``cer`` (never for a lack of improvement)."""
    stop = "+callbacks.off_plateau"
    return [f"{stop}._target_=lightning.pytorch.callbacks.EarlyStopping", f"{stop}.monitor=val/cer",
            f"{stop}.mode=min", f"{stop}.stopping_threshold={cer}", f"{stop}.patience={UPDATES}"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_documented_command_runs_the_recipe_and_learns_on_a_tiny_short_corpus(tmp_path):
    from fastasr.corpora.synthetic import build_corpus

    corpus = tmp_path / "tiny"
    build_corpus(corpus, seed=3, counts={"train": 400, "dev": 40, "test": 10}, workers=2)
    proc = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "train.py"), "data=manifest", "tokenizer=char",
         *corpus_overrides(corpus), f"+trainer.max_steps={UPDATES}",
         "final_decoding=null", "final_tuning=null", "final_average=null", "logger=csv",
         "trainer.enable_progress_bar=false", f"paths.output_dir={tmp_path / 'out'}", "name=smoke",
         *off_plateau_stop(PLATEAU_CER)],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=840,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "min_batches_per_epoch" in proc.stdout + proc.stderr  # the shape: the batch budget was cut
    metrics = next((tmp_path / "out").rglob("metrics.csv"))
    curve = [(int(r["step"]), float(r["val/cer"])) for r in csv.DictReader(metrics.open()) if r.get("val/cer")]
    assert curve and curve[-1][0] <= UPDATES
    assert curve[-1][1] < PLATEAU_CER, f"dev CER by update: {curve}"  # stopped off the plateau
    assert all(cer >= PLATEAU_CER for _, cer in curve[:-1]), curve  # and at the first validation off it
