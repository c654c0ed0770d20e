"""What each chunk size costs: WER of chunked (streaming) decoding, and the latency and speed of a stream.

    python -m benchmarks.pipeline.streaming --ckpt chunked=outputs/runs/builtin-chunked/checkpoints/averaged.ckpt \\
        --ckpt full-context=outputs/runs/default/checkpoints/averaged.ckpt --manifest data/synthetic/test.jsonl
    python -m benchmarks.pipeline.streaming --ckpt m=CKPT --manifest TINY/test.jsonl --latency 2 --out-dir /tmp/b  (smoke)

For each checkpoint (``label=path``), each decoding attention (``--attention``: ``trained`` is the
checkpoint's own) and each context (``--chunks`` in seconds, ``full`` for full context), the test
manifest is scored with ``evaluate.py``'s path (``decode_manifest``) after
``Recogniser.set_chunked_decoding(chunk, --left)``: the chunked context, batched, which is what a
stream gives (tests/test_streaming.py holds them equal). Greedy and beam + LM (``--beam`` wide,
the checkpoint's lexicon and LM, LM weight and word score as ``conf/decoding/beam_lm.yaml``).

Latency (``--latency N`` recordings of the manifest, ``--chunks``, greedy and beam + LM): each recording
goes through ``Recogniser.stream`` a chunk at a time as live audio would arrive; a chunk's words are ready the
compute time of its ``accept`` after its last sample, plus the filterbank window's reach past the
chunk (window − shift: 15 ms at 25/10 ms). Mean and 95th percentile over all chunks, and the real-time
factor (all compute over the audio). Streamed words are checked against the chunked decoding's
(how many recordings agree). Time it on a quiet machine (``--latency 0`` skips it).

Writes ``--out-dir``/streaming_<corpus directory>_<machine>[_<tag>].md and .json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks import timing
from benchmarks.bench_io import machine_info
from fastasr.data.manifest import read_manifest  # noqa: E402
from fastasr.recognition.loading import load_recogniser  # noqa: E402
from fastasr.recognition.scoring import decode_manifest  # noqa: E402
from fastasr.recognition.streaming import stream_recording  # noqa: E402


def context_label(chunk: float | None) -> str:
    return "full" if chunk is None else f"{chunk:.2f} s"


def score_cells(args, label: str, ckpt: str, attention: str, chunks: list[float | None]) -> list[dict]:
    rec = load_recogniser(ckpt, None if attention == "trained" else attention)
    rows = []
    beam = {"name": "beam", "lm": {"source": "auto"}, "beam_size": args.beam}
    for chunk in chunks:
        rec.set_chunked_decoding(chunk, args.left)
        context = rec.model.decoding_context
        row = {"model": label, "attention": rec.model.attention_spec, "context": context_label(chunk),
               "context_detail": "full" if context is None else context.describe(rec.frame_seconds)}
        for name, decoding in (("greedy", {"name": "greedy"}), ("beam_lm", beam)):
            started = timing.Clock()
            result = decode_manifest(rec, args.manifest, accelerator="cpu", decoding=decoding, num_workers=0)
            row[f"{name}_wer"] = round(result.wer, 2)
            row[f"{name}_{result.unit_metric}"] = round(result.unit_error_rate, 2)
            row[f"{name}_seconds"] = round(started.seconds(), 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    rec.set_chunked_decoding(None)
    return rows


def latency_cells(args, label: str, ckpt: str, chunks: list[float]) -> list[dict]:
    rec = load_recogniser(ckpt)
    window_reach = (rec.features.frame_length_ms - rec.features.frame_shift_ms) / 1000
    utterances = read_manifest(args.manifest)[:args.latency]
    rows = []
    decodings = {"greedy": {"name": "greedy"},
                 "beam_lm": {"name": "beam", "lm": {"source": "auto"}, "beam_size": args.beam}}
    for name, spec in decodings.items():
        decoder = rec.decoder(spec)
        for chunk in chunks:
            rec.set_chunked_decoding(chunk, args.left)
            simulated = rec.transcribe([u.audio_filepath for u in utterances], batch_size=8, decoding=decoder,
                                       long_form={"mode": "one_pass"}, seed=0)
            torch.manual_seed(0)
            per_chunk, compute, audio, agree = [], 0.0, 0.0, 0
            for utt, expected in zip(utterances, simulated):
                streamed = stream_recording(rec, utt.audio_filepath, chunk, args.left, decoder)
                per_chunk += [p.compute_seconds for p in streamed.partials]
                compute += streamed.compute_seconds
                audio += streamed.transcription.duration
                agree += streamed.transcription.text == expected.text
            ms = np.array(per_chunk) * 1000 + window_reach * 1000
            row = {"model": label, "attention": rec.model.attention_spec, "decoding": name,
                   "context": context_label(chunk), "recordings": len(utterances), "chunks": len(per_chunk),
                   "latency_mean_ms": round(float(ms.mean()), 1), "latency_p95_ms": round(float(np.percentile(ms, 95)), 1),
                   "rtf": round(compute / audio, 4), "streamed_equal_simulated": f"{agree}/{len(utterances)}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    rec.set_chunked_decoding(None)
    return rows


def markdown(args, machine: dict, scores: list[dict], latencies: list[dict]) -> str:
    when = datetime.date.today().isoformat()
    lines = [f"# Streaming: {Path(args.manifest).parent.name}", "",
             f"`python -m benchmarks.pipeline.streaming {' '.join(sys.argv[1:])}`", "",
             f"Machine: {machine.get('cpu')} ({machine.get('cores')} cores, {machine.get('torch_threads')} torch threads), torch {torch.__version__}; {when}.",
             f"Left context: {args.left if args.left in (None, 'auto') else f'{args.left} s'}; beam + LM: beam {args.beam}, the checkpoint's lexicon and LM.", ""]
    if scores:
        metric = next(k for k in scores[0] if k.startswith("greedy_") and k not in ("greedy_wer", "greedy_seconds"))
        unit = metric.split("_", 1)[1].upper()
        lines += ["| model | attention | context | greedy WER | greedy " + unit + " | beam + LM WER | beam + LM " + unit
                  + " |", "|---|---|---|---:|---:|---:|---:|"]
        lines += [f"| {r['model']} | {r['attention']} | {r['context']} | {r['greedy_wer']:.2f} | {r[metric]:.2f} | "
                  f"{r['beam_lm_wer']:.2f} | {r['beam_lm_' + unit.lower()]:.2f} |" for r in scores]
        lines.append("")
    if latencies:
        lines += ["| model | attention | decoding | chunk | recordings | chunks | latency mean (ms) | latency p95 (ms) | "
                  "RTF | streamed = chunked decoding |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['model']} | {r['attention']} | {r['decoding']} | {r['context']} | {r['recordings']} | {r['chunks']} | "
                  f"{r['latency_mean_ms']} | {r['latency_p95_ms']} | {r['rtf']} | {r['streamed_equal_simulated']} |"
                  for r in latencies]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", action="append", required=True, help="label=path (repeat)")
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--attention", action="append", default=None,
                        help="decoding attention: trained (the checkpoint's) or a spec (repeat); default trained, "
                             "i-clustered-100")
    parser.add_argument("--chunks", default="0.32,0.64,1.28,full")
    parser.add_argument("--left", default="2.56", help="seconds of left context, auto or null (all)")
    parser.add_argument("--beam", type=int, default=50)
    parser.add_argument("--latency", type=int, default=50, help="recordings streamed for latency (0: none)")
    parser.add_argument("--no-scores", action="store_true", help="latency only")
    parser.add_argument("--tag", default="", help="appended to the result files' names")
    parser.add_argument("--out-dir", default="benchmarks/results")
    args = parser.parse_args(argv)
    args.left = None if args.left == "null" else args.left if args.left == "auto" else float(args.left)
    chunks = [None if c == "full" else float(c) for c in args.chunks.split(",")]
    attentions = args.attention or ["trained", "i-clustered-100"]
    machine = machine_info(torch.device("cpu"))
    scores, latencies = [], []
    for item in args.ckpt:
        label, _, path = item.partition("=")
        for attention in attentions if not args.no_scores else ():
            scores += score_cells(args, label, path, attention, chunks)
        if args.latency:
            latencies += latency_cells(args, label, path, [c for c in chunks if c is not None])
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"streaming_{Path(args.manifest).parent.name}_{machine['slug']}" + (f"_{args.tag}" if args.tag else "")
    (out / f"{stem}.json").write_text(json.dumps({"argv": sys.argv[1:], "machine": machine, "scores": scores,
                                                  "latency": latencies}, indent=1))
    (out / f"{stem}.md").write_text(markdown(args, machine, scores, latencies))
    print(f"wrote {out / stem}.md")


if __name__ == "__main__":
    main()
