"""benchmarks/pipeline/long_recordings.py: long recordings joined from test utterances, and the
measurement of one pass vs windows against utterance-by-utterance decoding (smoke-tested
on a 20-second recording of the tiny corpus)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from fastasr.data.manifest import read_manifest, write_manifest

ROOT = Path(__file__).resolve().parents[1]
from benchmarks.pipeline.long_recordings import _attention, build_long_recording, render  # noqa: E402
from fastasr.decoding.long_form import inner_attention_cost  # noqa: E402

RATE = 16000


def utterances(d: Path, seconds=(1.0, 2.0, 1.5)) -> Path:
    """A manifest of short noise utterances with text and phonemes."""
    rows = []
    for i, s in enumerate(seconds):
        path = d / f"u{i}.wav"
        sf.write(path, (0.1 * np.random.default_rng(i).standard_normal(int(s * RATE))).astype(np.float32), RATE,
                 subtype="PCM_16")
        rows.append({"audio_filepath": str(path), "duration": s, "text": f"word{i} more{i}",
                     "phonemes": f"w {i} | m {i}", "id": f"u{i}"})
    write_manifest(d / "test.jsonl", rows)
    return d / "test.jsonl"


def test_a_long_recording_is_its_utterances_joined_by_pauses(tmp_path):
    utts = read_manifest(utterances(tmp_path))
    manifest = build_long_recording(utts, 6.0, tmp_path / "long", "long-6s", pause_s=0.3)
    (ref,) = read_manifest(manifest)
    parts = read_manifest(manifest.with_name("long-6s.parts.jsonl"))
    # 1 + 2 + 1.5, then 1 again: 5.5 s of speech and 3 pauses pass 6 s
    assert [p.id for p in parts] == ["u0#1", "u1#2", "u2#3", "u0#4"]
    assert ref.duration == pytest.approx(5.5 + 3 * 0.3) == sf.info(ref.audio_filepath).duration
    assert ref.text == "word0 more0 word1 more1 word2 more2 word0 more0"
    assert ref.phonemes == "w 0 | m 0 | w 1 | m 1 | w 2 | m 2 | w 0 | m 0"
    line = json.loads(manifest.read_text())
    assert line["utterances"] == 4 and line["cycles"] == 2
    spans = [json.loads(x) for x in manifest.with_name("long-6s.parts.jsonl").read_text().splitlines()]
    assert [(s["start"], s["end"]) for s in spans] == [(0.0, 1.0), (1.3, 3.3), (3.6, 5.1), (5.4, 6.4)]
    joined, _ = sf.read(ref.audio_filepath, dtype="float32")
    first, _ = sf.read(utts[1].audio_filepath, dtype="float32")
    np.testing.assert_array_equal(joined[int(1.3 * RATE):int(3.3 * RATE)], first)  # the samples, where it says
    assert not joined[RATE:int(1.3 * RATE)].any()  # the pause is silence
    stamp = Path(ref.audio_filepath).stat().st_mtime_ns
    assert build_long_recording(utts, 6.0, tmp_path / "long", "long-6s", pause_s=0.3) == manifest
    assert Path(ref.audio_filepath).stat().st_mtime_ns == stamp  # the same settings: reused, not rebuilt


def test_the_page_states_the_target_for_the_60_minute_one_pass():
    run = {"recording": "long-3600s", "attention": "i-clustered-100", "attention_spec": "i-clustered-100",
           "mode": "one_pass", "per": 21.0, "wer": 30.0, "rtf": 0.08, "audio_seconds": 3600.2,
           "peak_rss_mb": 2048.0, "loaded_rss_mb": 600.0, "u2u": {"per": 20.0, "wer": 27.5}}
    report = {"machine": {"cpu": "AMD EPYC", "cores": 2, "torch": "2.11", "torch_threads": 2}, "command": "python x",
              "date": "2026-01-01", "commit": "abc", "load_start": "0.1", "load_end": "0.2", "ckpt": "m.ckpt",
              "trained_attention": "full", "unit_metric": "per", "subsampling": 4, "frame_ms": 40.0,
              "decoding": "greedy", "window_s": 10.0, "overlap_s": 2.0, "device": "cpu",
              "recordings": [{"name": "long-3600s", "duration": 3600.2, "utterances": 900, "cycles": 3, "words": 9000}],
              "runs": [run, {"recording": "long-3600s", "attention": "full", "mode": "one_pass",
                             "skipped": "skipped: quadratic attention in one pass over 3600 s"}]}
    text = render(report)
    assert "| long-3600s | i-clustered-100 | one_pass | 21.00 | 30.00 | 20.00 | 27.50 | 1.00 | 2.50 | 0.080 |" in text
    assert "RTF 0.080 (met); ΔPER 1.00, ΔWER 2.50 (NOT met)" in text
    assert "skipped: quadratic attention in one pass" in text and "ru_maxrss" in text


@pytest.mark.slow
def test_the_benchmark_runs_on_a_20_second_recording_of_the_tiny_corpus(tiny_corpus, tmp_path):
    from test_train_eval import compose_train

    from fastasr.training.fit import train

    ckpt = train(compose_train(tiny_corpus, tmp_path / "model", "name=m", "trainer.max_epochs=1", "test=false",
                               "final_decoding=null")).last_ckpt
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.pipeline.long_recordings", "--ckpt", ckpt,
         "--manifest", str(tiny_corpus / "test.jsonl"), "--seconds", "20", "--attentions", "full", "i_clustered",
         "--modes", "one_pass", "windowed", "--window-s", "6", "--work-dir", str(tmp_path / "work"),
         "--out-dir", str(tmp_path / "out"), "--machine", "test"],
        capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "long_recordings_test.json").read_text())
    assert [r["duration"] >= 20 for r in report["recordings"]] == [True]
    runs = report["runs"]
    assert [(r["attention"], r["mode"]) for r in runs] == [("full", "one_pass"), ("full", "windowed"),
                                                           ("i-clustered-100", "one_pass"),
                                                           ("i-clustered-100", "windowed")]
    for r in runs:
        assert r["mode_used"] == r["mode"] and 0 < r["rtf"] and r["peak_rss_mb"] >= r["loaded_rss_mb"] > 0
        assert 0 <= r["per"] and 0 <= r["wer"] and set(r["u2u"]) >= {"per", "wer"}
    page = (tmp_path / "out" / "long_recordings_test.md").read_text()
    assert "| long-20s | i-clustered-100 | windowed |" in page and "## Target" in page


def test_only_quadratic_attention_is_kept_from_a_long_one_pass():
    """The skip rule reads the attention's own cost: i-clustered (whose config has a ``topk``)
    and clustered are linear, full and top-k quadratic, auto by the length it is given."""
    from fastasr.attention import build_attention

    hour = 90_000  # output frames of an hour at 40 ms
    for name in ("i_clustered", "clustered"):
        assert inner_attention_cost(build_attention(_attention(name)), hour) == "linear", name
    for name in ("full", "topk-32"):
        assert inner_attention_cost(build_attention(_attention(name)), hour) == "quadratic", name
    auto = build_attention(_attention("auto"))
    assert (inner_attention_cost(auto, 10), inner_attention_cost(auto, hour)) == ("quadratic", "linear")
