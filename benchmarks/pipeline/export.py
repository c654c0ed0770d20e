"""An exported recogniser against its checkpoint: the same words, the int8 copy's cost, and speed.

    python -m benchmarks.pipeline.export --ckpt outputs/runs/default/checkpoints/averaged.ckpt \\
        --manifest data/synthetic/test.jsonl --minutes 10
    python -m benchmarks.pipeline.export --ckpt CKPT --manifest TINY/test.jsonl --minutes 0.3 --out-dir /tmp/b  (smoke)
    python -m benchmarks.pipeline.export --ckpt CKPT --manifest M --limit 20 --minutes 0.5 --out-dir /tmp/b  (a quick look)

Steps (docs/DEPLOY.md, docs/results/export/RESULTS.md):

1. ``python -m fastasr.export``'s function writes the folder (fp32 and int8) to ``--work-dir``.
2. Every utterance of ``--manifest`` (the first ``--limit``): filterbanks once (training's, ``fastasr.data.features``),
   then the log-probabilities of PyTorch (eager, the checkpoint's model with full attention: the
   exported graph's), onnxruntime fp32 and onnxruntime int8, one utterance a call. Each is
   decoded by the same greedy rules (``fastasr.onnx.onnx_recogniser.OnnxRecogniser.decode``): the
   greedy transcripts of fp32 against PyTorch's (how many identical), the largest
   log-probability difference, and each one's WER (and PER / CER) against the references.
3. A recording of ``--minutes`` made of the manifest's utterances joined with 0.3 s pauses, read
   in the transcription command's windows (10 s, 4 s overlap, 8 a call) by each runtime.
4. sherpa-onnx (where installed) decodes each utterance of the same fp32 folder with its public
   API and default features (``OfflineRecognizer.from_zipformer_ctc``, only the rate and the
   feature dimension given): how many give the runtime's greedy units (a char model's words, a
   phoneme model's phonemes) and PyTorch's, its unit error rate against the runtime's units (how
   far apart they are), and its error rates against the references.
5. Speed of the model alone: its wall time (features → log-probabilities; the same filterbanks for
   all three) over the audio's duration, the real-time factor, on ``--threads`` threads for torch,
   onnxruntime and sherpa-onnx alike; the filterbank's own RTF for training's (torchaudio) and the
   runtime's (numpy, ``fastasr.onnx.filterbank``). Best of ``--repeats`` passes.
6. End to end: waveform → filterbank → model → greedy words, each runtime with its own filterbank
   (PyTorch: training's torchaudio one; onnxruntime fp32 and int8: ``OnnxRecogniser``'s numpy one;
   sherpa-onnx: its own), on the utterances and on the recording (PyTorch and onnxruntime in the
   transcription command's windows; sherpa-onnx, which reads a recording in one pass of full
   attention, in 10-second pieces without overlap, as a voice-activity detector would cut it).

Writes ``--out-dir``/export_<``--name``, else the corpus directory>_<machine>.md and .json. Time it on a quiet machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import jiwer
import numpy as np
import soundfile as sf
import torch

from benchmarks import timing
from benchmarks.bench_io import load_average, machine_info
from fastasr.data.features import Fbank  # noqa: E402
from fastasr.data.manifest import read_manifest  # noqa: E402
from fastasr.decoding.windows import LongFormConfig  # noqa: E402
from fastasr.deploy.export import export_recogniser  # noqa: E402
from fastasr.onnx.onnx_recogniser import SAMPLE_SCALE_LOG, OnnxRecogniser  # noqa: E402
from fastasr.recognition.loading import load_recogniser  # noqa: E402


def best_of(repeats: int, run) -> tuple[float, object]:
    """The shortest wall time of ``repeats`` calls of ``run`` and the last call's result."""
    out = []

    def call():
        out[:] = [run()]

    return timing.measure(call, warmup=0, repeats=repeats).min_ms / 1e3, out[0]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--limit", type=int, default=None, help="the manifest's first N utterances (default: all)")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--work-dir", default="outputs/export_bench")
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument("--name", default=None, help="the result files' name after export_ "
                                                 "(default: the manifest's directory, the corpus)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    work, out_dir = Path(args.work_dir), Path(args.out_dir)
    work.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)

    recogniser = load_recogniser(args.ckpt)
    trained = recogniser.model.attention_spec
    exported = export_recogniser(recogniser, work / "export", source=args.ckpt)  # sets the model's attention to the graph's
    fp32 = OnnxRecogniser.load(work / "export", threads=args.threads)
    int8 = OnnxRecogniser.load(work / "export", int8=True, threads=args.threads)
    model = recogniser.model.eval()

    def torch_run(features: list[np.ndarray]) -> list[np.ndarray]:
        lengths = torch.tensor([f.shape[0] for f in features])
        x = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(f) for f in features], batch_first=True)
        with torch.inference_mode():
            lp, n = model(x, lengths)
        return [lp[i, :k].numpy() for i, k in enumerate(n.tolist())]

    runtimes = {"PyTorch eager": torch_run, "onnxruntime fp32": fp32.run, "onnxruntime int8": int8.run}
    inputs_of = {"PyTorch eager": "training", "onnxruntime fp32": "graph", "onnxruntime int8": "graph"}
    utterances = read_manifest(args.manifest)[:args.limit]
    base = Path(args.manifest).parent
    waves = [sf.read(str(u.audio_filepath if Path(u.audio_filepath).is_absolute() else base / u.audio_filepath),
                     dtype="float32")[0] for u in utterances]
    seconds = sum(w.shape[0] for w in waves) / float(fp32.features["sample_rate"])
    train_fbank = Fbank(recogniser.features)
    fbank_rtf = {
        "training's (torchaudio)": best_of(args.repeats, lambda: [train_fbank(torch.from_numpy(w)) for w in waves])[0] / seconds,
        "the runtime's (numpy)": best_of(args.repeats, lambda: [fp32.graph_features(w) for w in waves])[0] / seconds,
    }
    features = [train_fbank(torch.from_numpy(w)).numpy() for w in waves]
    graph_input = [f - SAMPLE_SCALE_LOG for f in features]  # the graph reads the filterbank of samples in [-1, 1]

    rows, outputs = {}, {}
    refs = [u.text for u in utterances]
    for name, run in runtimes.items():
        inputs = features if inputs_of[name] == "training" else graph_input
        wall, lps = best_of(args.repeats, lambda run=run, inputs=inputs: [run([f])[0] for f in inputs])
        outputs[name] = lps
        decoded = [fp32.decode(lp, w.shape[0] / float(fp32.features["sample_rate"])) for lp, w in zip(lps, waves)]
        hyps = [" ".join(d[1]) for d in decoded]
        units = [[u for u in d[0] if u != fp32.tokenizer.word_boundary] for d in decoded]
        ref_units = [fp32.tokenizer.scored_units(fp32.tokenizer.units(u)) for u in utterances]
        rows[name] = {"wer": 100 * jiwer.wer(refs, hyps),
                      "unit_er": 100 * jiwer.wer([" ".join(r) for r in ref_units], [" ".join(u) for u in units]),
                      "rtf": wall / seconds, "hyps": hyps}
    torch_lps = outputs["PyTorch eager"]
    same = {name: sum(a == b for a, b in zip(rows[name]["hyps"], rows["PyTorch eager"]["hyps"])) for name in rows}
    max_diff = {name: max(float(np.abs(a - b).max()) for a, b in zip(outputs[name], torch_lps)) for name in rows}

    # the long recording: the utterances joined, read in the transcription command's windows
    rate = int(fp32.features["sample_rate"])
    pieces, total = [], 0
    while total < args.minutes * 60 * rate:
        for w in waves:
            pieces += [w, np.zeros(int(0.3 * rate), np.float32)]
            total += w.shape[0] + int(0.3 * rate)
            if total >= args.minutes * 60 * rate:
                break
    long_wave = np.concatenate(pieces)[: int(args.minutes * 60 * rate)]
    long_features = train_fbank(torch.from_numpy(long_wave)).numpy()
    long_seconds = long_wave.shape[0] / rate
    window = LongFormConfig(mode="windowed")
    long_rtf = {}
    runner = OnnxRecogniser.load(work / "export", threads=args.threads)  # its run swapped for each runtime's
    for name, run in runtimes.items():
        runner.run = run  # the same windows and stitching (OnnxRecogniser.log_probs) for every runtime
        x = long_features if inputs_of[name] == "training" else long_features - SAMPLE_SCALE_LOG
        long_rtf[name] = best_of(args.repeats, lambda x=x: runner.log_probs(x, window, batch_size=8))[0] / long_seconds

    # sherpa-onnx on the same folder, by its public API with its default features: its greedy units
    # against the runtime's and PyTorch's (one pass per utterance)
    sherpa, sherpa_row = None, None
    try:
        import sherpa_onnx
    except ImportError:
        sherpa_onnx = None
    if sherpa_onnx is not None:
        sherpa = sherpa_onnx.OfflineRecognizer.from_zipformer_ctc(
            model=str(work / "export" / "model.onnx"), tokens=str(work / "export" / "tokens.txt"),
            num_threads=args.threads, sample_rate=rate, feature_dim=int(fp32.features["num_mel_bins"]))
        one_pass = LongFormConfig(mode="one_pass")
        shown = [sherpa_text(sherpa, w, rate) for w in waves]
        ours = [fp32.transcribe_waveform(w, long_form=one_pass) for w in waves]
        as_shown = [o.units if fp32.tokenizer.kind == "phoneme" else o.text.split() for o in ours]
        same_filterbank = OnnxRecogniser.load(work / "export", threads=args.threads, filterbank="sherpa-onnx")
        same_shown = [o.units if fp32.tokenizer.kind == "phoneme" else o.text.split()
                      for o in (same_filterbank.transcribe_waveform(w, long_form=one_pass) for w in waves)]
        phoneme, boundary = fp32.tokenizer.kind == "phoneme", fp32.tokenizer.word_boundary
        torch_shown = [d[0] if phoneme else d[1] for d in (fp32.decode(lp, 0.0) for lp in outputs["PyTorch eager"])]
        sherpa_units = [[u for u in t if u != boundary] if phoneme else list("".join(t)) for t in shown]
        ref_units = [fp32.tokenizer.scored_units(fp32.tokenizer.units(u)) for u in utterances]
        def units_of(shown_units: list[str]) -> list[str]:
            """A phoneme model's units without word boundaries (sherpa-onnx prints a lone boundary
            that the runtime's tidying drops), a char model's words as they are."""
            return [u for u in shown_units if u != boundary] if phoneme else shown_units

        def agree(a: list[list[str]], b: list[list[str]]) -> int:
            return sum(units_of(x) == units_of(y) for x, y in zip(a, b))

        def scored(shown_units: list[str]) -> str:
            """The units the error rates count, space-separated: a char model's letters."""
            return " ".join(units_of(shown_units) if phoneme else "".join(shown_units)) or "_"

        sherpa_row = {
            "same_as_runtime": agree(shown, as_shown),
            "unit_er_to_runtime": 100 * jiwer.wer([scored(o) for o in as_shown], [scored(t) for t in shown]),
            "same_as_runtime_on_its_filterbank": agree(shown, same_shown),
            "same_as_pytorch": agree(shown, torch_shown),
            "unit_er": 100 * jiwer.wer([" ".join(r) for r in ref_units], [" ".join(u) or "_" for u in sherpa_units])}
        if fp32.tokenizer.kind != "phoneme":
            sherpa_row["wer"] = 100 * jiwer.wer(refs, [" ".join(t) or "_" for t in shown])

    # end to end: waveform -> filterbank -> model -> greedy words, each runtime with its own filterbank
    def torch_words(w: np.ndarray, long_form: LongFormConfig):
        x = train_fbank(torch.from_numpy(w)).numpy()
        runner.run = torch_run
        lp, _ = runner.log_probs(x, long_form, batch_size=8)
        return runner.decode(lp, w.shape[0] / rate)[1]

    one_pass = LongFormConfig(mode="one_pass")
    e2e = {"PyTorch eager": lambda w, lf: torch_words(w, lf),
           "onnxruntime fp32": lambda w, lf: fp32.transcribe_waveform(w, long_form=lf, batch_size=8).text,
           "onnxruntime int8": lambda w, lf: int8.transcribe_waveform(w, long_form=lf, batch_size=8).text}
    e2e_rtf = {name: (best_of(args.repeats, lambda f=f: [f(w, one_pass) for w in waves])[0] / seconds,
                      best_of(args.repeats, lambda f=f: f(long_wave, window))[0] / long_seconds)
               for name, f in e2e.items()}
    if sherpa is not None:
        piece = 10 * rate
        e2e_rtf["sherpa-onnx fp32"] = (
            best_of(args.repeats, lambda: [sherpa_text(sherpa, w, rate) for w in waves])[0] / seconds,
            best_of(args.repeats, lambda: [sherpa_text(sherpa, long_wave[i:i + piece], rate)
                                           for i in range(0, long_wave.shape[0], piece)])[0] / long_seconds)

    info = machine_info("cpu")
    sizes = {f: (exported.out / f).stat().st_size / 1e6 for f in ("model.onnx", "model.int8.onnx")}
    result = {"date": datetime.date.today().isoformat(), "machine": info, "load": load_average(), "ckpt": args.ckpt,
              "manifest": args.manifest, "utterances": len(utterances), "seconds": round(seconds, 1),
              "trained_attention": trained, "exported_attention": exported.attention, "sizes_mb": sizes,
              "identical_greedy": same, "max_logprob_diff": max_diff, "fbank_rtf": fbank_rtf,
              "long_seconds": long_seconds, "long_rtf": long_rtf, "sherpa": sherpa_row,
              "end_to_end_rtf": {k: {"utterances": a, "recording": b} for k, (a, b) in e2e_rtf.items()},
              "rows": {k: {kk: vv for kk, vv in v.items() if kk != "hyps"} for k, v in rows.items()}}
    unit = "PER" if fp32.tokenizer.kind == "phoneme" else "CER"
    lines = [f"# Export: {args.ckpt}", "",
             f"{result['date']}, {info['cpu']}, {info['cores']} cores, {args.threads} threads, load {result['load']}; "
             f"torch {info['torch']}; trained with {trained}, exported with {exported.attention}.", "",
             f"Test set: {args.manifest}, {len(utterances)} utterances, {seconds:.0f} s; greedy decoding, the same rules for all.", "",
             f"| runtime | model size (MB) | greedy transcripts identical to PyTorch | largest log-prob difference | WER (%) | {unit} (%) | RTF, utterances | RTF, {args.minutes:g}-min recording |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    size_of = {"PyTorch eager": sizes["model.onnx"], "onnxruntime fp32": sizes["model.onnx"], "onnxruntime int8": sizes["model.int8.onnx"]}
    for name, row in rows.items():
        lines.append(f"| {name} | {size_of[name]:.1f} | {same[name]} / {len(utterances)} | {max_diff[name]:.1e} | "
                     f"{row['wer']:.2f} | {row['unit_er']:.2f} | {row['rtf']:.4f} | {long_rtf[name]:.4f} |")
    if sherpa_row is not None:
        lines += ["", f"sherpa-onnx {sherpa_onnx.__version__} (the same folder, fp32, `from_zipformer_ctc` with its default "
                      f"features, one pass each): greedy units identical to the runtime's for {sherpa_row['same_as_runtime']} / "
                      f"{len(utterances)} utterances, to PyTorch's for {sherpa_row['same_as_pytorch']} / {len(utterances)}, "
                      f"to the runtime's computing sherpa-onnx's filterbank (`filterbank=\"sherpa-onnx\"`) for "
                      f"{sherpa_row['same_as_runtime_on_its_filterbank']} / {len(utterances)}; {unit} against the "
                      f"runtime's units {sherpa_row['unit_er_to_runtime']:.2f} %, against the references "
                      f"{unit} {sherpa_row['unit_er']:.2f} %" + (f", WER {sherpa_row['wer']:.2f} %" if "wer" in sherpa_row else "")
                      + "."]
    lines += ["", "End to end (waveform → filterbank → model → greedy words, each runtime with its own filterbank; "
                  "the recording: PyTorch and onnxruntime in 10-s windows overlapping by 4 s, sherpa-onnx in 10-s pieces):", "",
              f"| runtime | RTF, utterances | RTF, {args.minutes:g}-min recording |", "| --- | ---: | ---: |"]
    lines += [f"| {name} | {a:.4f} | {b:.4f} |" for name, (a, b) in e2e_rtf.items()]
    lines += ["", "Filterbank RTF: " + ", ".join(f"{k} {v:.4f}" for k, v in fbank_rtf.items()), "",
              f"Speed-up of int8 over PyTorch eager: {rows['PyTorch eager']['rtf'] / rows['onnxruntime int8']['rtf']:.2f}x "
              f"(utterances), {long_rtf['PyTorch eager'] / long_rtf['onnxruntime int8']:.2f}x (recording); "
              f"fp32: {rows['PyTorch eager']['rtf'] / rows['onnxruntime fp32']['rtf']:.2f}x, "
              f"{long_rtf['PyTorch eager'] / long_rtf['onnxruntime fp32']:.2f}x."]
    stem = f"export_{args.name or Path(args.manifest).resolve().parent.name}_{info['slug']}"  # the corpus, the machine
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(lines))
    return result


def sherpa_text(recognizer, waveform: np.ndarray, rate: int) -> list[str]:
    """sherpa-onnx's greedy text of one waveform, split at spaces."""
    stream = recognizer.create_stream()
    stream.accept_waveform(rate, waveform)
    recognizer.decode_stream(stream)
    return stream.result.text.split()


if __name__ == "__main__":
    main()
