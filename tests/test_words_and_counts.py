"""Decoding gives words by default, and every manifest line is either scored or listed as
skipped (issue #38): the commands a newcomer types, on a small checkpoint that carries a
lexicon and a word LM as training writes one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from recogniser_fixtures import phoneme_tokenizer, recogniser, save_checkpoint
from run_probe import imported_modules

from fastasr.config import PROJECT_ROOT
from fastasr.data.manifest import read_manifest
from fastasr.recognition.loading import load_recogniser, with_decoding_data


@pytest.fixture(scope="module")
def words_ckpt(tiny_corpus, tmp_path_factory) -> Path:
    """An (untrained) phoneme model whose checkpoint carries the training lexicon and word LM."""
    out = tmp_path_factory.mktemp("words_ckpt")
    rec = with_decoding_data(recogniser(phoneme_tokenizer(tiny_corpus), bins=40), tiny_corpus / "train.jsonl",
                             lm_dir=out)
    assert rec.lexicon is not None and rec.lm is not None
    path = out / "model.ckpt"
    save_checkpoint(rec, path)
    return path


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)


def test_evaluate_lists_the_manifest_lines_it_could_not_score(words_ckpt, tiny_corpus, tmp_path):
    good = [json.loads(line) for line in (tiny_corpus / "test.jsonl").read_text().splitlines()]
    for record in good:
        record["audio_filepath"] = str(tiny_corpus / record["audio_filepath"])
    text_file = tmp_path / "notes.wav"
    text_file.write_text("not audio\n")
    bad = [
        '{"audio_filepath": "a.wav", "duration": 1.0, "text": "unterminated',
        json.dumps({"audio_filepath": str(tmp_path / "missing.wav"), "duration": 1.0, "text": "gone"}),
        json.dumps({"audio_filepath": str(text_file), "duration": 1.0, "text": "a text file"}),
    ]
    manifest = tmp_path / "test.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in good) + "\n".join(bad) + "\n")
    done = run("evaluate.py", f"ckpt_path={words_ckpt}", f"data.test_manifest={manifest}", "data.num_workers=0",
               f"paths.output_dir={tmp_path / 'outputs'}", "accelerator=cpu")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1].endswith(f"({len(good)} of {len(good) + 3} utterances; 3 skipped, see results.json)"), lines
    assert lines[-1].startswith("PER=") and "nan" not in lines[-1]
    assert lines[-2].startswith("decoding: beam 500 + LM, real words; results: ")  # decoding=auto: words
    results = json.loads(Path(lines[-2].split("results: ")[1]).read_text())
    assert results["skipped_utterances"] == 3 and results["manifest_lines"] == len(good) + 3
    assert results["utterances"] == len(good) and results["words"] == "real"
    skipped = {s["line"]: s["reason"] for s in results["skipped_lines"]}
    n = len(good)
    assert sorted(skipped) == [n + 1, n + 2, n + 3]
    assert "not valid JSON (Unterminated string starting at column" in skipped[n + 1]
    assert "no such file" in skipped[n + 2] and "not readable audio" in skipped[n + 3]
    assert "at at" not in done.stderr


def test_a_failed_evaluate_leaves_no_directory(words_ckpt, tmp_path):
    """A missing checkpoint is refused before the run directory is made, and before torch loads."""
    done = run("-X", "importtime", "evaluate.py", f"ckpt_path={tmp_path / 'nope.ckpt'}",
               f"paths.output_dir={tmp_path / 'outputs'}")
    assert done.returncode == 2 and "ckpt_path=" in done.stderr and "no such file" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "outputs").exists()
    assert "omegaconf" in imported_modules(done.stderr) and "torch" not in imported_modules(done.stderr)


def test_transcribing_with_a_phoneme_model_gives_words(words_ckpt, tiny_corpus, tmp_path):
    """``fastasr-transcribe ckpt_path=CKPT audio=DIR``: beam search with the checkpoint's
    lexicon and LM, every word a lexicon word; greedy decoding marks phonetic words as such."""
    audio = tiny_corpus / "wav"
    done = run("-m", "fastasr.cli.transcribe", f"ckpt_path={words_ckpt}", f"audio={audio}", "device=cpu",
               f"paths.output_dir={tmp_path / 'outputs'}")
    assert done.returncode == 0, done.stderr
    assert "decoding: beam 500 + LM (decoding=auto), real words" in done.stderr
    lexicon = load_recogniser(words_ckpt).lexicon
    (run_dir,) = (tmp_path / "outputs" / "transcribe").iterdir()
    transcripts = [json.loads(line) for line in (run_dir / "transcripts.jsonl").read_text().splitlines()]
    assert transcripts and all(t["real_words"] and all(w in lexicon for w in t["text"].split()) for t in transcripts)
    # the API's greedy decoding: real_words only when every word is in the lexicon
    rec = load_recogniser(words_ckpt)
    paths = [u.audio_filepath for u in read_manifest(tiny_corpus / "test.jsonl")]
    for t in rec.transcribe(paths, decoding="greedy"):
        assert t.real_words == all(w in lexicon for w in t.text.split())
