"""The training behind the published numbers: each published recipe's first updates, pinned.

The docs publish numbers of runs at named commits (docs/results/*/RESULTS.md, the README): the
built-in corpus's ``make train``, the recorded-speech recipe (FSDD, Mini LibriSpeech, the corpus
shapes), the approximation matrix's members. Those numbers describe today's code while today's
training computes what theirs did. This test trains each recipe's own model (its sizes,
schedule, augmentation, attention) for six updates on the tiny corpus, fp32 on the CPU, and
holds every update's loss and the distance the updates moved the parameters (the L2 norm of
their change) to ``PINNED``.

What the pins were recorded with (2026-11-29, 2-core Intel Xeon) trains as ``0e3d4c6``, the
code of the built-in and FSDD RESULTS rows, did for every run that found its corpus's CMVN
statistics and feature cache already made, as FSDD's did: every case bit for bit. A run that
made them there drew random numbers more before its initial weights (the seed now follows the
data's preparation). Two thread counts give
the same losses to 1e-7 and distances to 1e-6; ``RTOL`` leaves room for another CPU's vector
paths, and catches what changes training materially: doubling the weight decay moves the
distance by 0.8 %, a layer norm's epsilon ten times larger by 0.002 % (not caught).

A change that fails this test changes what training computes. Where that is the point (a
recipe, model, schedule or data change), re-measure the published numbers it touches, then
paste the values the failure prints into ``PINNED`` and say so in the commit.
"""

from __future__ import annotations

import math
import shutil

import lightning.pytorch as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from test_train_eval import TINY_MODEL, corpus_overrides

import fastasr.training.fit as fit
from fastasr.config import CONFIG_DIR
from fastasr.training.fit import build_callbacks

pytestmark = pytest.mark.slow

STEPS = 6
RTOL = 1e-3

#: case -> the overrides of its documented command (the manifests are the tiny corpus's)
CASES = {
    "make train": ["data=synthetic"],
    "recorded speech": ["data=manifest", "tokenizer=char"],
    "matrix full": ["data=synthetic", "experiment=matrix_member", "member=full"],
    "matrix lsh-4": ["data=synthetic", "experiment=matrix_member", "member=lsh-4"],
    "matrix clustered-100": ["data=synthetic", "experiment=matrix_member", "member=clustered-100"],
    "matrix i-clustered-100": ["data=synthetic", "experiment=matrix_member", "member=i-clustered-100"],
}

#: case -> (the loss of each of the first STEPS updates, the L2 norm of the parameters' change over them)
PINNED = {
    "make train": (
        [6.251826763153076, 5.796976566314697, 5.807675361633301, 5.516791820526123, 5.517619609832764, 5.281633377075195],
        0.06718328015998067),
    "recorded speech": (
        [4.046881675720215, 4.166956424713135, 3.8778138160705566, 4.217779159545898, 4.131725311279297, 4.109556198120117],
        0.0018335857738140456),
    "matrix full": (
        [10.981956481933594, 10.878401756286621, 10.012935638427734, 9.993273735046387, 8.993162155151367, 8.981376647949219],
        0.11418425181842638),
    "matrix lsh-4": (
        [11.209199905395508, 11.413676261901855, 10.531943321228027, 10.71966552734375, 9.794781684875488, 9.868623733520508],
        0.11190943166642281),
    "matrix clustered-100": (
        [10.97426700592041, 10.857954978942871, 10.041694641113281, 10.0009183883667, 9.0032320022583, 8.97183895111084],
        0.11424017697491923),
    "matrix i-clustered-100": (
        [10.974394798278809, 10.858001708984375, 10.041793823242188, 10.00096321105957, 9.00344467163086, 8.97196102142334],
        0.11423977396283874),
}


class FirstUpdates(L.Callback):
    """Each training step's loss, and how far the updates moved the parameters."""

    def __init__(self):
        self.losses: list[float] = []
        self.start: list[torch.Tensor] = []
        self.distance = math.nan

    def on_train_start(self, trainer, pl_module):
        self.start = [p.detach().clone() for p in pl_module.parameters()]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))

    def on_train_end(self, trainer, pl_module):
        moved = [(p.detach() - p0).flatten().double() for p, p0 in zip(pl_module.parameters(), self.start, strict=True)]
        self.distance = float(torch.linalg.vector_norm(torch.cat(moved)))


def first_updates(corpus, out, overrides: list[str], monkeypatch, steps: int = STEPS, cache=None) -> FirstUpdates:
    """A run's first ``steps`` updates on ``corpus``, fp32 on the CPU: the run in ``out``, its
    feature cache in ``cache`` (None: ``out``'s own, empty as a first run finds it)."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[
            *overrides, *corpus_overrides(corpus, cache or out / "feature_cache"), "logger=csv",
            "trainer.accelerator=cpu", "trainer.precision=32-true", "trainer.enable_progress_bar=false",
            f"paths.output_dir={out}", f"+trainer.max_steps={steps}", "trainer.num_sanity_val_steps=0",
            "test=false", "final_decoding=null", "final_average=null", "final_tuning=null"])
    recorder = FirstUpdates()
    monkeypatch.setattr(fit, "build_callbacks", lambda cfg, run_dir: [*build_callbacks(cfg, run_dir), recorder])
    fit.train(cfg, run_dir=out / "run")
    assert len(recorder.losses) == steps and all(map(math.isfinite, [*recorder.losses, recorder.distance]))
    return recorder


def test_a_run_trains_alike_whether_its_corpus_caches_were_made_or_found(tiny_corpus, tmp_path, monkeypatch):
    """A first run on a corpus computes its CMVN statistics (written beside the training manifest)
    and builds its feature cache; a second finds both. The same command and seed train the same
    model either way."""
    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, corpus, ignore=shutil.ignore_patterns("train.cmvn-*.json", "feature_cache"))
    cache = tmp_path / "feature_cache"
    overrides = ["data=manifest", "tokenizer=char", *TINY_MODEL, "attention=clustered", "attention.clusters=4"]
    made = first_updates(corpus, tmp_path / "first", overrides, monkeypatch, steps=2, cache=cache)
    assert list(corpus.glob("train.cmvn-*.json")) and any(cache.iterdir())
    found = first_updates(corpus, tmp_path / "second", overrides, monkeypatch, steps=2, cache=cache)
    assert (found.losses, found.distance) == (made.losses, made.distance)


@pytest.mark.parametrize("case", list(CASES))
def test_the_first_updates_of_each_published_recipe_are_as_pinned(case, tiny_corpus, tmp_path, monkeypatch):
    run = first_updates(tiny_corpus, tmp_path, CASES[case], monkeypatch)
    measured = (run.losses, run.distance)
    pin = f"pin them: {case!r}: ({run.losses!r}, {run.distance!r}),"
    assert case in PINNED, f"{case} is not pinned; {pin}"
    losses, distance = PINNED[case]
    close = [math.isclose(v, p, rel_tol=RTOL) for v, p in zip([*run.losses, run.distance], [*losses, distance],
                                                               strict=True)]
    assert all(close), (
        f"{case}: training computes other numbers than the published numbers' training: {measured} against "
        f"{PINNED[case]}. If the change is meant to alter training, re-measure the numbers it touches and {pin}")
