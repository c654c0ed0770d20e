"""The streaming export in sherpa-onnx's online recogniser against fastasr's PyTorch stream, on a test set.

    python -m benchmarks.pipeline.streaming_export --ckpt outputs/runs/base-mini-librispeech/checkpoints/last.ckpt \\
        --manifest data/mini_librispeech/test.jsonl
    python -m benchmarks.pipeline.streaming_export --ckpt CKPT --manifest M --limit 5 --out-dir /tmp/b  (smoke)

Steps (docs/DEPLOY.md "Streaming in sherpa-onnx"):

1. :func:`fastasr.deploy.streaming_export.export_streaming` (what ``fastasr-export ... streaming=true``
   runs) writes ``model.streaming.onnx`` and ``tokens.txt`` to ``--work-dir``/export, with chunks of
   ``--chunk`` seconds and ``--left`` seconds of left context.
2. Every utterance of ``--manifest`` (the first ``--limit``) is fed in pieces of ``--piece`` seconds,
   as a live source gives them, to three streams, each decoding greedily:

   a. fastasr's PyTorch stream (``Recogniser.stream``, the checkpoint's model with the attention
      the graph holds): training's filterbank as the samples arrive, ``finish()`` at the end;
   b. fastasr's ONNX stream (:class:`fastasr.onnx.streaming.OnnxStream`, onnxruntime, no PyTorch
      in the loop): the runtime's numpy filterbank (training's) of the recording, its frames fed as
      the pieces complete them, ``finish()`` at the end, the units read by the same greedy rules;
   c. sherpa-onnx's ``OnlineRecognizer.from_wenet_ctc`` by its public API, only the rate, the
      feature dimension and the printed chunk arguments given (its default features otherwise):
      ``accept_waveform`` per piece, decoding while it is ready; at the end the tail padding of
      sherpa-onnx's examples (a chunk of silence and two frames, so its last partial chunk is
      decoded), ``input_finished()`` and decoding until it is not ready.

   And the PyTorch stream fed the same padded samples as sherpa-onnx: how many utterances give
   sherpa-onnx's words (the ends apart, the two streams hear the same frames).

   Counted: utterances whose words (exact text) equal the PyTorch stream's, for b and c, and the
   CER of each against the PyTorch stream's words (how far they are); CER and WER of each against
   the references (:class:`fastasr.decoding.metrics.ErrorRates`); the
   real-time factor of each (its wall time, filterbank to words, over the audio,
   :mod:`benchmarks.timing`), on ``--threads`` threads for torch, onnxruntime and sherpa-onnx alike.
   Diagnosis of c: the ONNX stream fed sherpa-onnx's own filterbank of the same padded samples
   (``fastasr.onnx.onnx_recogniser.sherpa_onnx_options`` at the int16 scale sherpa-onnx gives a
   WeNet model), over the chunks sherpa-onnx decodes: equal to sherpa-onnx's words where the graph
   and its caches run in sherpa-onnx as in fastasr, so what differs from the PyTorch stream is the
   filterbank (frame positions and mel range, docs/DEPLOY.md) and the tail. And the ONNX stream on
   training's filterbank with one of sherpa-onnx's two defaults at a time (frames centred on the
   hops; the mel range), to tell which moves the words (left out for a model trained on
   sherpa-onnx's filterbank, ``features.snip_edges=false features.high_freq=-400``).

Writes ``--out-dir``/streaming_export_<``--name``, else the corpus directory>_<machine>.md and .json
(per utterance: the reference and each stream's words). Time it on a quiet machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from benchmarks import timing
from benchmarks.bench_io import command_line, git_commit, load_average, machine_info, result_stem
from fastasr.data.manifest import read_manifest
from fastasr.decoding.metrics import ErrorRates, align
from fastasr.deploy.export import sherpa_onnx_differences
from fastasr.deploy.streaming_export import STREAMING_FILE, export_streaming
from fastasr.onnx.filterbank import log_mel
from fastasr.onnx.onnx_recogniser import (
    INT16_SCALE,
    fbank,
    filterbank_options,
    read_audio,
    sherpa_onnx_options,
)
from fastasr.onnx.streaming import OnnxStream
from fastasr.recognition.loading import load_recogniser

STREAMS = {"pytorch": "fastasr PyTorch stream", "onnx": "fastasr ONNX stream (OnnxStream)",
           "sherpa": "sherpa-onnx OnlineRecognizer"}


def pieces(samples: np.ndarray, step: int):
    """``samples`` in pieces of ``step`` samples, the last shorter (a live source)."""
    for start in range(0, samples.shape[0], step):
        yield start, samples[start:start + step]


def pytorch_words(rec, samples: np.ndarray, args, step: int) -> list[str]:
    stream = rec.stream(chunk=args.chunk, left=args.left, decoding="greedy")
    for _, piece in pieces(samples, step):
        stream.accept(piece)
    return stream.finish().text.split()


def onnx_words(session, decoder, features: dict, samples: np.ndarray, step: int) -> list[str]:
    """OnnxStream over the runtime's filterbank of ``samples``, frames fed as the pieces complete them."""
    frames = fbank(samples, features)
    shift = round(float(features["frame_shift_ms"]) * features["sample_rate"] / 1000)
    window = round(float(features["frame_length_ms"]) * features["sample_rate"] / 1000)
    stream, search, given = OnnxStream(None, session=session), decoder.stream(), 0
    for start, piece in pieces(samples, step):
        heard = start + piece.shape[0]
        complete = frames.shape[0] if heard >= samples.shape[0] else max(0, (heard - window) // shift + 1)
        search.accept(torch.from_numpy(stream.accept(frames[given:complete])))
        given = max(given, complete)
    search.accept(torch.from_numpy(stream.finish()))
    return search.finish().words


def sherpa_words(recognizer, samples: np.ndarray, rate: int, step: int, tail: np.ndarray) -> list[str]:
    stream = recognizer.create_stream()
    for _, piece in pieces(samples, step):
        stream.accept_waveform(rate, piece)
        while recognizer.is_ready(stream):
            recognizer.decode_stream(stream)
    stream.accept_waveform(rate, tail)
    stream.input_finished()
    while recognizer.is_ready(stream):
        recognizer.decode_stream(stream)
    return recognizer.get_result(stream).split()


def onnx_on_sherpa_features(session, decoder, features: dict, padded: np.ndarray, shift: int) -> list[str]:
    """OnnxStream fed sherpa-onnx's default filterbank of a WeNet model (int16-scaled samples) of
    ``padded``, less the frames the graph drops at the stream's start, over the chunks sherpa-onnx
    decodes (``(k + 1) × shift + dropped < frames``)."""
    # at training's sample scale, which OnnxStream takes (the graph reads int16's: OnnxStream adds the offset)
    scale = float(features.get("sample_scale", INT16_SCALE))
    frames = log_mel(padded, replace(sherpa_onnx_options(features), scale=scale)).astype(np.float32)
    stream = OnnxStream(None, session=session)
    chunks = sum(1 for k in range(frames.shape[0]) if (k + 1) * shift + stream.dropped < frames.shape[0])
    log_probs = stream.accept(frames[stream.dropped:stream.dropped + chunks * shift])
    return decoder(torch.from_numpy(log_probs)).words


#: The ONNX stream on training's filterbank with one of sherpa-onnx's two other defaults: which of
#: them moves the words (docs/DEPLOY.md: frames centred on the hops, edges mirrored; the top 400 Hz
#: below the Nyquist frequency).
HALFWAY = {"onnx_sherpa_frames": {"snip_edges": False}, "onnx_sherpa_mel_range": {"high_freq": -400.0}}


def onnx_halfway(session, decoder, features: dict, samples: np.ndarray, change: dict) -> list[str]:
    """OnnxStream over training's filterbank with ``change`` (one of :data:`HALFWAY`), ``finish()`` at
    the end; frames centred on the hops less those the graph drops at the stream's start in sherpa-onnx."""
    frames = log_mel(samples, replace(filterbank_options(features), **change)).astype(np.float32)
    stream = OnnxStream(None, session=session)
    if change.get("snip_edges") is False:
        frames = frames[stream.dropped:]
    return decoder(torch.from_numpy(np.concatenate([stream.accept(frames), stream.finish()]))).words


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--chunk", type=float, default=0.64, help="seconds a chunk")
    ap.add_argument("--left", default="auto", help="seconds of left context, or auto (the export's)")
    ap.add_argument("--piece", type=float, default=0.1, help="seconds of audio a live source gives at a time")
    ap.add_argument("--limit", type=int, default=None, help="the manifest's first N utterances")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work-dir", default="outputs/streaming_export_bench")
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument("--name", default=None, help="the result files' name after streaming_export_ "
                                                 "(default: the manifest's directory, the corpus)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    import onnxruntime
    import sherpa_onnx

    rec = load_recogniser(args.ckpt)
    if rec.tokenizer.kind == "phoneme":
        raise SystemExit("streaming_export: a phoneme model; sherpa-onnx gives its phonemes, not words: "
                         "use a char or subword model")
    trained = rec.model.attention_spec
    exported = export_streaming(rec, Path(args.work_dir) / "export", chunk=args.chunk, left=args.left,
                                source=args.ckpt)
    rec.model.set_attention(exported.attention)  # the PyTorch stream computes the graph's attention
    graph, tokens = exported.out / STREAMING_FILE, exported.out / "tokens.txt"
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    features = rec.to_dict()["features"]
    differences = sherpa_onnx_differences(rec.features)
    halfway = HALFWAY if differences else {}  # a model on sherpa-onnx's filterbank has nothing to tell apart
    rate = int(features["sample_rate"])
    recognizer = sherpa_onnx.OnlineRecognizer.from_wenet_ctc(
        model=str(graph), tokens=str(tokens), num_threads=args.threads, sample_rate=rate,
        feature_dim=int(features["num_mel_bins"]), chunk_size=exported.chunk_size,
        num_left_chunks=exported.left_chunks)
    decoder = rec.decoder("greedy")
    shift = exported.chunk_size * rec.subsampling  # filterbank frames a chunk
    frame_shift = round(float(features["frame_shift_ms"]) * rate / 1000)
    tail = np.zeros((shift + 2) * frame_shift, np.float32)  # sherpa-onnx's examples' tail padding
    step = max(1, round(args.piece * rate))

    utterances = read_manifest(args.manifest)[:args.limit]
    tok = rec.tokenizer
    rows, seconds = [], 0.0
    wall = dict.fromkeys(STREAMS, 0.0)
    runs = {"pytorch": lambda x: pytorch_words(rec, x, args, step),
            "onnx": lambda x: onnx_words(session, decoder, features, x, step),
            "sherpa": lambda x: sherpa_words(recognizer, x, rate, step, tail)}
    for utt in utterances:
        path = Path(utt.audio_filepath)
        samples = read_audio(path if path.is_absolute() else Path(args.manifest).parent / path, rate)
        seconds += samples.shape[0] / rate
        row = {"id": utt.id, "seconds": round(samples.shape[0] / rate, 3), "ref": utt.text}
        for name, run in runs.items():
            clock = timing.Clock()
            row[name] = " ".join(run(samples))
            wall[name] += clock.seconds()
        row["onnx_on_sherpa_features"] = " ".join(
            onnx_on_sherpa_features(session, decoder, features, np.concatenate([samples, tail]), shift))
        row["pytorch_padded"] = " ".join(pytorch_words(rec, np.concatenate([samples, tail]), args, step))
        for name, change in halfway.items():
            row[name] = " ".join(onnx_halfway(session, decoder, features, samples, change))
        rows.append(row)
        print(json.dumps(row), flush=True)

    refs = [r["ref"].split() for r in rows]
    ref_units = [tok.scored_units(tok.units(u)) for u in utterances]
    pytorch_units = [tok.scored_units(tok.units(r["pytorch"])) for r in rows]
    scores = {}
    for name in (*STREAMS, "onnx_on_sherpa_features", "pytorch_padded", *halfway):
        rates = ErrorRates()
        rates.update(ref_units, [tok.scored_units(tok.units(r[name])) for r in rows], refs,
                     [r[name].split() for r in rows])
        hyp_units = [tok.scored_units(tok.units(r[name])) for r in rows]
        scores[name] = {**{"cer" if k == "uer" else k: round(v, 2) for k, v in rates.compute().items()},
                        "same_as_pytorch": sum(r[name] == r["pytorch"] for r in rows),
                        "cer_against_pytorch": round(align(pytorch_units, hyp_units).rate, 2)}
        if name in STREAMS:
            scores[name]["rtf"] = round(wall[name] / seconds, 4)
    sherpa_same_as_diagnosis = sum(r["sherpa"] == r["onnx_on_sherpa_features"] for r in rows)
    sherpa_same_as_padded = sum(r["sherpa"] == r["pytorch_padded"] for r in rows)

    info = machine_info("cpu")
    corpus = Path(args.manifest).resolve().parent.name
    result = {"date": datetime.date.today().isoformat(), "commit": git_commit(Path(__file__).resolve().parents[2]),
              "machine": info, "load": load_average(), "threads": args.threads, "ckpt": args.ckpt,
              "manifest": args.manifest, "utterances": len(rows), "seconds": round(seconds, 1),
              "trained_attention": trained, "exported_attention": exported.attention,
              "sherpa_onnx_differences": differences,
              "chunk_size": exported.chunk_size, "left_chunks": exported.left_chunks, "piece_s": args.piece,
              "onnx_vs_pytorch_max_logprob_diff": exported.max_abs_diff, "sherpa_onnx": sherpa_onnx.__version__,
              "scores": scores, "sherpa_same_as_onnx_on_its_filterbank": sherpa_same_as_diagnosis,
              "sherpa_same_as_pytorch_on_padded_samples": sherpa_same_as_padded, "rows": rows}
    frame = rec.frame_seconds
    n = len(rows)
    lines = [f"# Streaming export in sherpa-onnx: {corpus}", "", command_line("pipeline/streaming_export.py"), "",
             f"{result['date']}, commit {result['commit']}, {info['cpu']}, {info['cores']} cores, {args.threads} "
             f"thread(s) each, load {result['load']}; torch {info['torch']}, sherpa-onnx {sherpa_onnx.__version__}.",
             f"Checkpoint {args.ckpt} (trained with {trained}, streamed with {exported.attention}); chunks of "
             f"{exported.chunk_size} frames ({exported.chunk_size * frame:.2f} s), {exported.left_chunks} chunks of "
             f"left context ({exported.left_chunks * exported.chunk_size * frame:.2f} s); audio fed in "
             f"{args.piece:g}-s pieces; greedy decoding.",
             f"Test set: {args.manifest}, {n} utterances, {seconds:.0f} s. Training's filterbank against "
             f"sherpa-onnx's default: {', '.join(differences) if differences else 'the same'}.", "",
             "| stream | words equal to the PyTorch stream's | CER against them (%) | CER (%) | WER (%) | RTF |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, label in STREAMS.items():
        s = scores[name]
        lines.append(f"| {label} | {s['same_as_pytorch']} / {n} | {s['cer_against_pytorch']:.2f} | {s['cer']:.2f} | "
                     f"{s['wer']:.2f} | {s['rtf']:.4f} |")
    d = scores["onnx_on_sherpa_features"]
    lines += ["", f"fastasr's ONNX stream fed sherpa-onnx's filterbank of the same padded samples, over the chunks "
                  f"sherpa-onnx decodes: words equal to sherpa-onnx's for {sherpa_same_as_diagnosis} / {n} "
                  f"utterances, to the PyTorch stream's for {d['same_as_pytorch']} / {n} (CER against them "
                  f"{d['cer_against_pytorch']:.2f} %); CER {d['cer']:.2f} %, "
                  f"WER {d['wer']:.2f} %. The export's own check (onnxruntime against the PyTorch stream): largest "
                  f"log-probability difference {exported.max_abs_diff:.1e}.", "",
              f"fastasr's PyTorch stream fed the same padded samples (the tail sherpa-onnx's examples add, then "
              f"finish()): words equal to sherpa-onnx's for {sherpa_same_as_padded} / {n} utterances; CER "
              f"{scores['pytorch_padded']['cer']:.2f} %, WER {scores['pytorch_padded']['wer']:.2f} %."]
    if halfway:
        lines += ["", "Which of sherpa-onnx's filterbank defaults moves the words: fastasr's ONNX stream on "
                      "training's filterbank with one of them:", "",
                  "| filterbank | words equal to the PyTorch stream's | CER against them (%) | CER (%) | WER (%) |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for name, label in (("onnx_sherpa_frames", "training's, frames centred on the hops (snip_edges=false, "
                                                   "the first dropped as in sherpa-onnx)"),
                            ("onnx_sherpa_mel_range", "training's, mel bins up to 400 Hz below Nyquist "
                                                      "(high_freq=-400)")):
            s = scores[name]
            lines.append(f"| {label} | {s['same_as_pytorch']} / {n} | {s['cer_against_pytorch']:.2f} | "
                         f"{s['cer']:.2f} | {s['wer']:.2f} |")
    stem = result_stem(args.out_dir, f"streaming_export_{args.name or corpus}", info)
    Path(f"{stem}.md").write_text("\n".join(lines) + "\n")
    Path(f"{stem}.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print("\n".join(lines))
    print(f"wrote {stem}.md")
    return result


if __name__ == "__main__":
    main()
