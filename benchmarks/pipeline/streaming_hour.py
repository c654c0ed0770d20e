"""Does a chunk cost the same at the end of an hour-long stream as at its start?

    python -m benchmarks.pipeline.streaming_hour ckpt_path=CKPT manifest=data/synthetic/test.jsonl
    python -m benchmarks.pipeline.streaming_hour manifest=TINY/test.jsonl minutes=2 out_dir=/tmp/b  (smoke)

The test utterances of ``manifest`` are joined (0.25 s of silence between them, over and over) into
``minutes`` of audio, which goes through ``Recogniser.stream`` a chunk at a time as live audio would
arrive (``chunk`` seconds, ``left`` of left context: ``auto`` is the bounded default, ``all`` every
earlier frame), once a decoding (``decoding``, comma-separated: greedy, beam_lm). Per chunk: the
wall time of its ``accept`` (features, encoder, search), the process's resident memory, the frames
every layer's cache holds and, for the beam search, the frames its search still holds. The table
compares the chunks of minute 1 with those of the last minute (median and 95th percentile).

``ckpt_path``: a trained checkpoint; without one, a randomly initialised model of
``conf/model/ctc_transformer.yaml`` (``attention``: full by default) with the manifest's phonemes,
lexicon and word LM: its words are nonsense, its costs those of a trained model of that shape.
Time it on a quiet machine. Writes ``out_dir``/streaming_hour_<machine>.md and .json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from benchmarks.bench_io import git_commit, load_average, machine_info, result_stem
from benchmarks.timing import Clock
from fastasr.data.manifest import read_manifest
from fastasr.recognition.streaming import RecognitionStream, chunk_context

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = {"ckpt_path": None, "manifest": "data/synthetic/test.jsonl", "minutes": 60.0, "chunk": 0.64,
            "left": "auto", "decoding": "greedy,beam_lm", "attention": "full", "threads": None,
            "out_dir": "benchmarks/results"}


def parse(argv: list[str]) -> dict:
    args = dict(DEFAULTS)
    for item in argv:
        key, sep, value = item.partition("=")
        if not sep or key not in args:
            raise SystemExit(f"streaming_hour: argument {item!r}; expected key=value with a key of {sorted(args)}")
        args[key] = None if value in ("null", "None") else value
    args["minutes"], args["chunk"] = float(args["minutes"]), float(args["chunk"])
    return args


def recogniser(args: dict):
    if args["ckpt_path"]:
        from fastasr.recognition.loading import load_recogniser

        return load_recogniser(args["ckpt_path"])
    from omegaconf import OmegaConf

    from fastasr.data.features import FeatureConfig
    from fastasr.data.tokenizer import Tokenizer
    from fastasr.recognition.loading import with_decoding_data
    from fastasr.recognition.recogniser import Recogniser

    model = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/model/ctc_transformer.yaml"))
    model["attention"] = args["attention"]
    manifest = Path(args["manifest"])
    tokenizer = Tokenizer.build(read_manifest(manifest), "phoneme")
    rec = Recogniser.from_model_config(model, tokenizer, FeatureConfig(num_mel_bins=40))
    rec = with_decoding_data(rec, manifest)
    torch.manual_seed(0)
    return rec.with_model(rec.build_model().eval())


def hour_of_audio(manifest: Path, seconds: float, rate: int) -> np.ndarray:
    """The manifest's utterances joined, 0.25 s of silence after each, repeated to ``seconds``."""
    pieces, total = [], 0
    utterances = read_manifest(manifest)
    gap = np.zeros(rate // 4, np.float32)
    while total < seconds * rate:
        for u in utterances:
            path = Path(u.audio_filepath)
            audio, sr = sf.read(str(path if path.is_absolute() else manifest.parent / path), dtype="float32")
            if sr != rate:
                raise SystemExit(f"{path}: {sr} Hz; this benchmark joins {rate} Hz audio as it is")
            pieces += [audio, gap]
            total += audio.shape[0] + gap.shape[0]
            if total >= seconds * rate:
                break
    return np.concatenate(pieces)[:int(seconds * rate)]


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run(rec, audio: np.ndarray, args: dict, decoding: str) -> list[dict]:
    stream = RecognitionStream(rec, chunk_context(rec, args["chunk"], args["left"]), decoding)
    rate = rec.features.sample_rate
    step = round(stream.chunk_seconds * rate)
    rows = []
    for start in range(0, audio.shape[0], step):
        partial = stream.accept(audio[start:start + step])
        if partial is None:
            continue
        rows.append({"seconds": partial.seconds, "ms": partial.compute_seconds * 1000, "rss_mib": resident_mib(),
                     "cache_frames": sum(s.frames for s in stream.encoder.layers),
                     "search_frames": getattr(stream.search, "buffered", None), "words": len(partial.words)})
    stream.finish()
    return rows


def summary(rows: list[dict], lo: float, hi: float) -> dict:
    part = [r for r in rows if lo <= r["seconds"] <= hi]
    ms = sorted(r["ms"] for r in part)
    search = [r["search_frames"] for r in part if r["search_frames"] is not None]
    return {"from_s": lo, "to_s": hi, "chunks": len(part), "median_ms": statistics.median(ms),
            "p95_ms": ms[min(len(ms) - 1, int(0.95 * len(ms)))], "rss_mib": max(r["rss_mib"] for r in part),
            "cache_frames": max(r["cache_frames"] for r in part), "search_frames": max(search) if search else None}


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args["threads"]:
        torch.set_num_threads(int(args["threads"]))
    rec = recogniser(args)
    seconds = args["minutes"] * 60
    audio = hour_of_audio(Path(args["manifest"]), seconds, rec.features.sample_rate)
    info = machine_info("cpu")
    load = load_average()
    context = chunk_context(rec, args["chunk"], args["left"]).describe(rec.frame_seconds)
    results = {}
    for decoding in args["decoding"].split(","):
        clock = Clock()
        rows = run(rec, audio, args, decoding)
        first = summary(rows, min(50.0, seconds - 10), min(60.0, seconds))
        last = summary(rows, seconds - 60 if seconds > 120 else seconds - 10, seconds)
        results[decoding] = {"first": first, "last": last, "wall_s": clock.seconds(),
                             "rtf": sum(r["ms"] for r in rows) / 1000 / seconds}
        print(f"{decoding}: minute 1 {first['median_ms']:.1f} ms a chunk, last {last['median_ms']:.1f} ms; "
              f"RSS {first['rss_mib']:.0f} -> {last['rss_mib']:.0f} MiB", flush=True)
    stem = result_stem(ROOT / args["out_dir"], "streaming_hour", info)
    meta = {"commit": git_commit(ROOT), "machine": info, "load_before": load, "args": args, "context": context}
    stem.with_suffix(".json").write_text(json.dumps({**meta, "results": results}, indent=1) + "\n")
    lines = [f"# A chunk at the start and at the end of a {args['minutes']:g}-minute stream", "",
             f"`python -m benchmarks.pipeline.streaming_hour {' '.join(sys.argv[1:] if argv is None else argv)}`",
             "", f"{info['cpu']}, {info['cores']} cores, {info['torch_threads']} torch threads, torch {info['torch']}; "
             f"load before {load}; commit {meta['commit']}; model {args['ckpt_path'] or 'random, default config'}; "
             f"{context}.", "",
             "| decoding | chunks of | median ms a chunk | p95 ms | resident MiB | layer caches (frames) | "
             "search holds (frames) |", "|---|---|---:|---:|---:|---:|---:|"]
    for decoding, r in results.items():
        for label, s in (("minute 1", r["first"]), ("last minute", r["last"])):
            lines.append(f"| {decoding} | {label} | {s['median_ms']:.1f} | {s['p95_ms']:.1f} | {s['rss_mib']:.0f} | "
                         f"{s['cache_frames']} | {'' if s['search_frames'] is None else s['search_frames']} |")
    lines += ["", "Real-time factor (all chunks): " + ", ".join(f"{d} {r['rtf']:.3f}" for d, r in results.items()), ""]
    stem.with_suffix(".md").write_text("\n".join(lines))
    print(f"wrote {stem.with_suffix('.md')}")


if __name__ == "__main__":
    main()
