"""train.py / evaluate.py end to end on the tiny corpus: fast-dev-run, resume, evaluation."""

import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fastasr.attention import build_attention
from fastasr.cli.tune import tune
from fastasr.config import CONFIG_DIR, PROJECT_ROOT
from fastasr.lm.build import build as lm_build
from fastasr.recognition.evaluation import evaluate
from fastasr.recognition.loading import load_recogniser
from fastasr.recognition.scoring import decode_manifest
from fastasr.rundir import RunDir
from fastasr.training.fit import train

TINY_MODEL = ["model.layers=1", "model.d_model=32", "model.heads=2", "model.ff_dim=64"]


# The pipeline tests train with the built-in recipe's schedule and no speed perturbation, whatever
# data=manifest's recipe (conf/recipe/real_speech.yaml, tested in test_recipe.py) is.
BUILTIN_RECIPE = ["recipe=builtin", "data.augment.speed_perturb=false"]


def corpus_overrides(corpus: Path, cache: Path | None = None) -> list[str]:
    """The data keys of a run on ``corpus``: its three manifests, no worker processes, and the
    feature cache (which data=manifest builds) in ``cache``, by default beside the corpus rather
    than in the repository."""
    return [
        f"data.train_manifest={corpus / 'train.jsonl'}",
        f"data.dev_manifest={corpus / 'dev.jsonl'}",
        f"data.test_manifest={corpus / 'test.jsonl'}",
        "data.num_workers=0",
        f"data.cache.dir={cache or corpus / 'feature_cache'}",
    ]


def data_overrides(corpus: Path) -> list[str]:
    return ["data=manifest", *BUILTIN_RECIPE, *corpus_overrides(corpus)]


def eval_overrides(corpus: Path) -> list[str]:
    """evaluate.py / the tuner: only the manifests to decode (no training data config)."""
    return [f"data.test_manifest={corpus / 'test.jsonl'}", f"data.dev_manifest={corpus / 'dev.jsonl'}",
            "data.num_workers=0"]


def compose_train(corpus: Path, out: Path, *overrides: str):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose(
            "train",
            overrides=[*data_overrides(corpus), *TINY_MODEL, "logger=csv", "trainer.accelerator=cpu",
                       "trainer.enable_progress_bar=false", f"paths.output_dir={out}", *overrides],
        )


def test_fast_dev_run(tiny_corpus, tmp_path, monkeypatch, caplog):
    """debug=fast: one training step and one validation batch, with the configured attention,
    in the run directory given to ``train`` (not ``paths.run_dir``), and no test pass. The config
    is resolved once and checked once, and the run's first lines say what it trains."""
    import fastasr.training.fit

    calls = []
    for name in ("resolve_train_config", "check_train_config"):
        real = getattr(fastasr.training.fit, name)
        monkeypatch.setattr(fastasr.training.fit, name, lambda cfg, real=real, name=name: (calls.append(name), real(cfg))[1])
    cfg = compose_train(tiny_corpus, tmp_path, "debug=fast", "attention=i_clustered", "attention.clusters=4")
    with caplog.at_level(logging.INFO, logger="fastasr.training.fit"):
        result = train(cfg, run_dir=tmp_path / "given")
    assert calls == ["resolve_train_config", "check_train_config"]
    started = [r.getMessage() for r in caplog.records if r.name == "fastasr.training.fit"][:4]
    assert started[0].startswith("recipe builtin (conf/recipe/builtin.yaml)")
    assert "depth 1, 2 heads x 16" in started[1] and started[1].endswith("attention i-clustered-4, full context")
    assert started[2].startswith("input: ") and started[2].endswith("; loss CTC")
    assert "linear price" in started[3]  # the batch price the resolving chose for clustered attention
    assert result.run_dir == str(tmp_path / "given")
    assert not Path(cfg.paths.run_dir).exists()
    assert OmegaConf.load(tmp_path / "given" / "config.yaml").model.attention.clusters == 4
    state = torch.load(result.last_ckpt, map_location="cpu", weights_only=True)
    assert Path(result.last_ckpt).parent == tmp_path / "given" / "checkpoints"
    assert state["global_step"] == 1  # exactly one optimiser step
    assert build_attention(state["recogniser"]["attention"]).spec == "i-clustered-4"
    # what word decoding needs travels too: the training lexicon and the corpus's word LM (embedded)
    assert state["recogniser"]["lexicon"]["source"] == f"train: {tiny_corpus / 'train.jsonl'}"
    assert state["recogniser"]["lexicon"]["entries"] and state["recogniser"]["lm"]["arpa"].startswith("\\data\\")
    assert state["recogniser"]["lm"]["path"] == str(tiny_corpus / "lm" / "words-3gram.arpa")
    assert set(result.val) >= {"val/loss", "val/per", "val/wer"}
    assert all(math.isfinite(v) for v in result.val.values()) and result.val["val/loss"] > 0
    assert result.test is None  # debug=fast skips testing


def test_sigterm_stops_training_with_a_failure_status(tiny_corpus, tmp_path, monkeypatch, caplog):
    """A real SIGTERM mid-training (a cluster preempting the job) ends ``train`` with exit
    status 143, not Lightning's 0, and names the checkpoint to resume from."""
    import signal

    import lightning as L

    import fastasr.training.fit

    class SendSigterm(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    build = fastasr.training.fit.build_callbacks
    monkeypatch.setattr(fastasr.training.fit, "build_callbacks",
                        lambda cfg, run_dir: [*build(cfg, run_dir), SendSigterm()])
    # a no-op handler under Lightning's: should Lightning not catch the signal, the test
    # fails instead of pytest dying
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        with pytest.raises(SystemExit) as stop:
            train(compose_train(tiny_corpus, tmp_path, "trainer.max_epochs=50",
                                "callbacks.step_checkpoint.every_n_train_steps=1"))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stop.value.code == fastasr.training.fit.SIGTERM_EXIT_STATUS == 143
    assert "SIGTERM: training stopped at step" in caplog.text and "step-last.ckpt" in caplog.text


def test_last_checkpoint_is_the_newest_epoch_even_without_a_new_best(tiny_corpus, tmp_path, caplog):
    """last.ckpt (what ``ckpt_path=auto`` resumes) holds the last epoch, not the best one: with a
    learning rate of 0 every epoch scores the same, so only the first saves a best checkpoint
    (Lightning's own ``save_last`` would leave last.ckpt there and a killed run would lose the rest).
    Each validation logs its one-line summary (``callbacks.epoch_summary``), the sanity check none."""
    cfg = compose_train(tiny_corpus, tmp_path, "name=flat", "optim.lr=0", "trainer.max_epochs=3",
                        "+trainer.limit_train_batches=1", "test=false", "callbacks.attention_maps=null")
    with caplog.at_level(logging.INFO, logger="fastasr.training.callbacks.epoch_summary"):
        result = train(cfg)
    lines = [r.getMessage() for r in caplog.records if r.name == "fastasr.training.callbacks.epoch_summary"]
    assert [line.split(":")[0] for line in lines] == [f"epoch {e} (step {e + 1}, 0" for e in range(3)], lines
    summary = re.compile(r"epoch \d \(step \d, 0:00:\d\d\): train/loss \d+\.\d{3}, val/loss \d+\.\d{3}, "
                         r"val/per \d+\.\d\d, val/wer \d+\.\d\d; \d+\.\d\d updates/s")
    assert all(summary.fullmatch(line) for line in lines), lines
    run = RunDir(result.run_dir)
    (best,) = run.checkpoints.glob("best-*.ckpt")
    assert best.name.startswith("best-epoch000-")
    last = torch.load(run.checkpoints / "last.ckpt", map_location="cpu", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (2, 3)
    assert result.last_ckpt == run.read_fit_done()["last_ckpt"] == str(run.checkpoints / "last.ckpt")


def test_epoch_summary_names_a_validation_before_the_epoch_end_by_its_batches(tiny_corpus, tmp_path, caplog):
    """A validation before its epoch's last batch (here after every batch of 2; the same as the
    last validation of an epoch cut short by ``trainer.max_time``) is summarised with the
    batches done, not as a whole epoch; the epoch's end has no count."""
    cfg = compose_train(tiny_corpus, tmp_path, "name=partial", "trainer.max_epochs=1", "+trainer.limit_train_batches=2",
                        "+trainer.val_check_interval=1", "test=false", "callbacks.attention_maps=null")
    with caplog.at_level(logging.INFO, logger="fastasr.training.callbacks.epoch_summary"):
        train(cfg)
    lines = [r.getMessage() for r in caplog.records if r.name == "fastasr.training.callbacks.epoch_summary"]
    assert [line.split(", 0:")[0] for line in lines] == ["epoch 0 (1 of 2 batches, step 1", "epoch 0 (step 2"], lines


@pytest.mark.slow
def test_train_resume_and_evaluate(tiny_corpus, tmp_path):
    first = train(compose_train(tiny_corpus, tmp_path, "name=r", "trainer.max_epochs=1", "test=false"))
    last = Path(first.last_ckpt)
    state = torch.load(last, map_location="cpu", weights_only=True)  # tensors and plain data only
    steps_after_one = state["global_step"]
    assert state["epoch"] == 0 and steps_after_one > 0
    # the recogniser bundle is written once, as plain data; CMVN is in the model's weights only
    assert "tokenizer" in state["recogniser"] and "cmvn.mean" in {
        k.removeprefix("model.") for k in state["state_dict"]
    }
    assert json.loads(json.dumps(state["recogniser"])) == state["recogniser"]
    assert "tokenizer" not in state.get("hyper_parameters", {})
    assert not [k for k in state if "DataModule" in k]

    # a fresh start over an existing run is refused, not silently clobbered
    with pytest.raises(FileExistsError, match="ckpt_path=last"):
        train(compose_train(tiny_corpus, tmp_path, "name=r", "ckpt_path=null"))

    # resume continues the optimisation where it stopped
    second = train(compose_train(tiny_corpus, tmp_path, "name=r", "trainer.max_epochs=2", "ckpt_path=last"))
    resumed = torch.load(second.last_ckpt, map_location="cpu", weights_only=True)
    # saved at the end of epoch 1's validation (epoch=1) or at train end (epoch=2, Lightning's on_train_end)
    assert resumed["epoch"] in (1, 2)
    # the optimisation continued from the first run's step instead of starting over
    assert resumed["global_step"] == 2 * steps_after_one
    assert second.test["utterances"] == 2
    assert set(second.test) >= {"per", "wer", "decode_seconds", "attention"}
    # then the test split again by beam search over the training lexicon and the corpus's word
    # 3-gram, which training built beside the manifest and embedded in the checkpoint
    final = second.final_decoding
    corpus_lm = tiny_corpus / "lm" / "words-3gram.arpa"
    assert final.decoding["name"] == "beam" and final.decoding["lm"] == str(corpus_lm) and final.words == "real"
    assert final.decoding["lm_embedded"] and corpus_lm.is_file()
    assert final.utterances == 2 and final.ckpt_path == second.best_ckpt
    run = RunDir(second.run_dir)
    assert run.read_results()["wer"] == pytest.approx(final.wer)
    assert all(p.is_file() for p in run.recognition_files("test-beam").values())

    # the checkpoint alone plus the manifest decodes, and gives the training's own test score
    # (which is over phonetic words: no lexicon)
    alone = decode_manifest(load_recogniser(second.best_ckpt), tiny_corpus / "test.jsonl", accelerator="cpu",
                            decoding={"name": "greedy", "lexicon": {"source": "none"}})
    assert alone.utterances == 2 and alone.attention == second.test["attention"] == "full"
    assert alone.per == pytest.approx(second.test["per"]) and alone.wer == pytest.approx(second.test["wer"])

    # evaluate.py decodes the full-attention model with another attention
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "evaluate.py"), f"ckpt_path={second.last_ckpt}",
         # only the manifest to decode: the vocabulary, CMVN, features and lexicon come from the checkpoint
         f"data.test_manifest={tiny_corpus / 'test.jsonl'}", "data.num_workers=0",
         "attention=i_clustered", "attention.clusters=3", "decoding=greedy",
         f"paths.output_dir={tmp_path}", "hydra.run.dir=" + str(tmp_path / "eval_run")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    last_line = proc.stdout.strip().splitlines()[-1]
    assert last_line.startswith("PER=") and " WER=" in last_line
    results = json.loads((tmp_path / "eval_run" / "results.json").read_text())
    assert results["attention"] == "i-clustered-3"
    assert results["utterances"] == 2
    assert f"PER={results['per']:.2f} WER={results['wer']:.2f} (2 utterances)" == last_line
    # no training manifest given, yet real words: the lexicon is the checkpoint's; per-utterance files beside
    assert results["words"] == "real" and results["wer_breakdown"]["reference"] > 0
    assert (tmp_path / "eval_run" / "errs-test-greedy.txt").is_file()

    # beam search with the checkpoint's lexicon and another word LM, on the average of both epochs
    lm = tmp_path / "words.arpa"
    lm_build([tiny_corpus / "train.jsonl"], lm, order=2)
    ckpt = f"ckpt_path={second.last_ckpt}"
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("evaluate", overrides=[ckpt, *eval_overrides(tiny_corpus), "decoding=beam",
                                             f"decoding.lm.path={lm}", "average.last=2", f"paths.output_dir={tmp_path}"])
        tune_cfg = compose("tune_decoding", overrides=[ckpt, *eval_overrides(tiny_corpus), f"decoding.lm.path={lm}",
                                                       "tune.lm_weight=[0,1]", "tune.word_score=[0]",
                                                       "tune.extend_edges=0", f"paths.output_dir={tmp_path}"])
    beam = evaluate(cfg)
    assert beam.words == "real" and beam.decoding["name"] == "beam" and beam.decoding["lm"] == str(lm)
    assert [Path(p).name[:8] for p in beam.averaged_checkpoints] == ["epoch000", "epoch001"]
    assert (Path(beam.run_dir) / "recogs-test-beam.txt").is_file() and "oov" in beam.to_dict()
    tuned = tune(tune_cfg)
    assert tuned.manifest.endswith("dev.jsonl") and len(tuned.points) == 2 and tuned.ckpt_path == second.last_ckpt
    assert (tmp_path / "tune.json").is_file()


@pytest.mark.slow
def test_a_checkpoint_decodes_the_same_away_from_its_corpus(tiny_corpus, tmp_path):
    """Once the checkpoint is copied away and its corpus (training manifest, word LM) is gone,
    greedy decoding recognises exactly the same, and beam search over the lexicon, and beam + LM,
    search the same lexicon and LM to the same best scores: training wrote the lexicon and the LM
    into the checkpoint. (The words of equally scored hypotheses may differ: the search breaks
    exact ties by memory order, and this barely trained model has many.)"""
    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, corpus, ignore=shutil.ignore_patterns("lm"))
    # the paper's plain encoder: the convolution module's oneDNN depthwise kernel may sum in another
    # order in another process, and this barely trained model's near-ties would turn that into another PER
    trained = train(compose_train(corpus, tmp_path / "out", "name=m", "trainer.max_epochs=1", "test=false",
                                  "model.conv_kernel=null", "model.positions=absolute"))
    assert (corpus / "lm" / "words-3gram.arpa").is_file()  # the corpus LM, built at training start

    def decode(ckpt: Path | str, manifests: Path, decoding: str, out: str) -> dict:
        """``python evaluate.py`` in a fresh process, as on another machine: its results.json."""
        beam = [] if decoding == "greedy" else ["decoding.beam_size=64"]  # wide: no tie at the beam's edge
        proc = subprocess.run(
            [sys.executable, str(PROJECT_ROOT / "evaluate.py"), f"ckpt_path={ckpt}", *eval_overrides(manifests),
             f"decoding={decoding}", *beam, "accelerator=cpu", f"paths.output_dir={tmp_path / out}"],
            capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300,
            env={**os.environ, "OMP_NUM_THREADS": "1"},  # one thread: the same sums in every process
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        (results,) = (tmp_path / out).glob("eval/*/results.json")
        return json.loads(results.read_text())

    decodings = ("greedy", "beam", "beam_lm")
    before = {d: decode(trained.last_ckpt, corpus, d, f"before-{d}") for d in decodings}
    # another machine: the checkpoint alone, and test audio without the training manifest or LM
    ckpt = tmp_path / "elsewhere" / "model.ckpt"
    ckpt.parent.mkdir()
    shutil.copy(trained.last_ckpt, ckpt)
    shutil.rmtree(tmp_path / "out")
    moved = corpus.rename(tmp_path / "moved")
    (moved / "train.jsonl").unlink()
    shutil.rmtree(moved / "lm")
    after = {d: decode(ckpt, moved, d, f"after-{d}") for d in decodings}

    assert (after["greedy"]["wer"], after["greedy"]["per"]) == (before["greedy"]["wer"], before["greedy"]["per"])
    recogs = {d: Path(r["files"]["recogs"]).read_text() for d, r in (("before", before["greedy"]), ("after", after["greedy"]))}
    assert recogs["after"] == recogs["before"] and "search_score" not in before["greedy"]
    for d in ("beam", "beam_lm"):
        assert before[d]["words"] == after[d]["words"] == "real"
        assert before[d]["decoding"]["lexicon_words"] == after[d]["decoding"]["lexicon_words"] > 0
        assert after[d]["search_score"] == pytest.approx(before[d]["search_score"], rel=1e-6, abs=1e-3)
    # the LM changes the search: its scores are not the lexicon-only ones
    assert before["beam_lm"]["search_score"] != pytest.approx(before["beam"]["search_score"], rel=1e-6, abs=1e-3)
    before = {d: SimpleNamespace(**r) for d, r in before.items()}
    after = {d: SimpleNamespace(**r) for d, r in after.items()}
    assert before["beam"].decoding["lm"] is None
    lm = after["beam_lm"].decoding
    assert lm["lm"] == str(corpus / "lm" / "words-3gram.arpa") and lm["lm_embedded"]
    assert lm["lm_sha256"] == before["beam_lm"].decoding["lm_sha256"]


def test_resume_last_without_checkpoint_is_a_clear_error(tiny_corpus, tmp_path):
    with pytest.raises(FileNotFoundError, match="no last.ckpt"):
        train(compose_train(tiny_corpus, tmp_path, "name=none", "ckpt_path=last"))
