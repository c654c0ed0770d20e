"""``fastasr-redecode RUN_DIR [KEY=VALUE ...]``: a finished run's final decoding again."""

from __future__ import annotations

import json
from types import SimpleNamespace

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import fastasr.cli.redecode as redecode
import fastasr.training.fit as fit
from fastasr.config import CONFIG_DIR
from fastasr.training.derived_config import resolve_train_config


def _finished_run(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "lm").mkdir()
    (run / "lm" / "words-3gram-en50000.arpa").write_text("\\data\\\n")
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["data=manifest", "tokenizer=char", "data.train_manifest=c/train.jsonl",
                                          "data.dev_manifest=c/dev.jsonl", "data.test_manifest=c/test.jsonl",
                                          "trainer.accelerator=cpu"])
    resolve_train_config(cfg)  # as training saves it
    del cfg.final_tuning.extend_edges  # a run from before the option
    OmegaConf.save(cfg, run / "config.yaml", resolve=True)
    averaged = run / "checkpoints" / "averaged.ckpt"
    averaged.write_bytes(b"")
    (run / "results.json").write_text(json.dumps({"ckpt_path": str(averaged), "averaged_checkpoints": ["e1", "e2"]}))
    return run, averaged


def test_redecode_decodes_the_runs_checkpoint_with_its_config_and_the_overrides(tmp_path, monkeypatch, capsys):
    run, averaged = _finished_run(tmp_path)
    calls = []

    def fake_final_decoding(request, ckpt, out, averaged_from=None):
        calls.append((request, ckpt, out, averaged_from))
        out.write_results({"wer": 12.5})
        return SimpleNamespace(decoding={"name": "beam"}, words="real", unit_metric="cer", unit_error_rate=5.25,
                               wer=12.5)

    monkeypatch.setattr(fit, "final_decoding", fake_final_decoding)  # what decode_run hands the request to
    assert redecode.main([str(run), "final_tuning.extend_edges=3", "final_decoding.beam_size=64"]) == 0
    request, ckpt, out, averaged_from = calls[-1]
    assert ckpt == str(averaged) and averaged_from == ["e1", "e2"]  # the checkpoint the run's decoding read
    assert request.tuning["extend_edges"] == 3 and request.decoding["beam_size"] == 64  # the overrides
    assert request.test_manifest == "c/test.jsonl" and request.tuning["frequent_words"] == [0, 50000]  # the run's own
    assert out.path == run / "redecoded" and (out.path / "lm" / "words-3gram-en50000.arpa").is_file()  # LMs copied
    assert "CER=5.25 WER=12.50" in capsys.readouterr().out
    # the run's own results.json is left as it was; a second decoding into the same place is refused
    assert json.loads((run / "results.json").read_text())["ckpt_path"] == str(averaged)
    assert redecode.main([str(run)]) == 2 and "pass another --out" in capsys.readouterr().err
    assert redecode.main([str(run), "--out", str(tmp_path / "again")]) == 0 and calls[-1][2].path == tmp_path / "again"


def test_redecode_of_a_directory_without_a_run_is_a_clear_error(tmp_path, capsys):
    assert redecode.main([str(tmp_path)]) == 2
    assert "config.yaml does not exist" in capsys.readouterr().err
