"""Recordings of any length: one pass vs overlapping windows, against decoding utterance by utterance.

    python -m benchmarks.pipeline.long_recordings --ckpt outputs/runs/default/checkpoints/last.ckpt
    python -m benchmarks.pipeline.long_recordings --ckpt CKPT --manifest data/synthetic/test.jsonl --minutes 1 10 60 \\
        --attentions full clustered i_clustered auto --modes one_pass windowed --window-s 10 --overlap-s 2
    python -m benchmarks.pipeline.long_recordings --ckpt CKPT --manifest TINY/test.jsonl --seconds 20 --out-dir /tmp/b  (smoke)

Steps (issue #20, item 2):

1. Long recordings, made offline: the test manifest's utterances, in manifest order (from the
   start again when it runs out: the table says so), joined with ``--pause-s`` (0.3 s) of
   silence until ``--minutes`` (1, 10, 60) are reached. Each is written to ``--work-dir`` as
   ``long-<s>s.wav`` with a reference manifest ``long-<s>s.jsonl`` (the joined ``text`` and
   ``phonemes``, `` | `` between utterances) and ``long-<s>s.parts.jsonl`` (its utterances, with
   their ``start``/``end`` in the recording). A recording already there with the same settings is reused.
2. For each attention (``--attentions``: conf/attention names or spec strings; ``trained`` =
   the checkpoint's own): the utterances decoded one by one (the baseline), then each recording
   decoded whole in each ``--modes`` (``one_pass``, ``windowed``, ``auto``:
   ``fastasr.decoding.long_form``) through ``Recogniser.transcribe`` — the API and the path
   ``python -m fastasr.transcribe`` uses.
3. Per run: PER (CER for char models) and WER of the recording against its reference, the same
   for the utterance-by-utterance baseline (same reference length) and their difference; the
   real-time factor (wall time of ``transcribe`` — audio loading, features, model, search and
   word alignment — over the audio's duration; the model is loaded before); the peak resident
   memory, ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of a fresh process per run (its
   high-water mark: the loaded model and libraries included, shown apart as the RSS once
   loaded), and on a GPU ``torch.cuda.max_memory_allocated``.

Full (or top-k) attention in one pass is quadratic: its runs above ``--max-quadratic-one-pass-s``
(900 s) are skipped and listed as such (the attention's own ``length_cost``; ``auto``: the variant
it chooses at the recording's length). Writes ``--out-dir``/long_recordings_<machine>.{md,json}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import subprocess
import sys
from pathlib import Path

from benchmarks import bench_io, timing

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from fastasr.corpora.join import join_audio, joined_record  # noqa: E402
from fastasr.data.audio import write_wav  # noqa: E402
from fastasr.data.manifest import Utterance, read_manifest, write_manifest  # noqa: E402

RESULT_PREFIX = "RESULT "  # the line a child process answers with


# ---------------------------------------------------------------------- recordings
def build_long_recording(utterances: list[Utterance], seconds: float, out_dir: Path, name: str,
                         pause_s: float = 0.3, source: str = "") -> Path:
    """Join ``utterances`` (in order, cycled) with ``pause_s`` of silence until ``seconds`` are
    reached; write ``<name>.wav``, the reference manifest ``<name>.jsonl`` (one line: the joined
    ``text``, ``phonemes``, ``utterances``, ``cycles``) and ``<name>.parts.jsonl`` (each
    utterance with its ``start``/``end`` in the recording). Returns the reference manifest; an
    existing one built with the same settings is returned as it is."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest, parts_manifest, meta = out_dir / f"{name}.jsonl", out_dir / f"{name}.parts.jsonl", out_dir / f"{name}.meta.json"
    settings = {"source": source, "seconds": seconds, "pause_s": pause_s, "utterances": [u.id for u in utterances]}
    if manifest.is_file() and parts_manifest.is_file() and meta.is_file() and json.loads(meta.read_text()) == settings:
        return manifest
    if not utterances:
        raise ValueError(f"{name}: no utterances to join")
    chosen, total = [], 0.0
    while total < seconds:  # by the manifest's durations
        utt = utterances[len(chosen) % len(utterances)]
        total += (pause_s if chosen else 0.0) + utt.duration
        chosen.append(utt)
    wav, rate, parts = join_audio(chosen, [pause_s] * (len(chosen) - 1))
    for n, part in enumerate(parts, 1):
        part["id"] = f"{part['id']}#{n}"
    write_wav(out_dir / f"{name}.wav", wav, rate)
    record = joined_record(parts, (out_dir / f"{name}.wav").resolve(), wav.shape[0] / rate)
    record.update(utterances=len(parts), cycles=-(-len(parts) // len(utterances)), pause_s=pause_s, source=source)
    write_manifest(manifest, [record])
    write_manifest(parts_manifest, parts)
    meta.write_text(json.dumps(settings))
    return manifest


# ---------------------------------------------------------------------- one measurement (child process)
def _cost(name: str, rec, seconds: float) -> str:
    """``linear`` or ``quadratic``: what attention ``name`` costs on ``seconds`` of audio in one pass."""
    from fastasr.attention import build_attention
    from fastasr.decoding.long_form import attention_cost, inner_attention_cost

    spec = _attention(name)
    frames = int(seconds / rec.frame_seconds)
    return attention_cost(rec.model, frames) if spec is None else inner_attention_cost(build_attention(spec), frames)


def _attention(name: str):
    """A conf/attention option's mapping, a spec string, or None (``trained``)."""
    if name == "trained":
        return None
    from omegaconf import OmegaConf

    from fastasr.config import CONFIG_DIR

    path = CONFIG_DIR / "attention" / f"{name}.yaml"
    return OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else name


def _score(recogniser, refs: list[Utterance], hyps: list) -> dict:
    """Unit (PER/CER) and word error rates of transcriptions against references (corpus-level)."""
    from fastasr.data.lexicon import words_of
    from fastasr.decoding.metrics import align

    tok = recogniser.tokenizer
    real = all(h.real_words for h in hyps)
    ref_units = [tok.units(u) for u in refs]
    units = align([tok.scored_units(r) for r in ref_units], [tok.scored_units(h.units) for h in hyps])
    words = align([words_of(u.text) if real else tok.units_to_words(r) for u, r in zip(refs, ref_units)],
                  [h.text.split() for h in hyps])
    return {recogniser.unit_metric: units.rate, "wer": words.rate, "words": "real" if real else "phonetic",
            "reference_words": words.reference_length, "reference_units": units.reference_length}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KB on Linux


def child(spec: dict) -> dict:
    """One run: ``kind`` ``utterances`` (the baseline of every recording) or ``long`` (one recording, one mode)."""
    import torch

    from fastasr.recognition.loading import load_recogniser

    torch.manual_seed(spec["seed"])
    rec = load_recogniser(spec["ckpt"], _attention(spec["attention"]))
    decoder = rec.decoder(spec["decoding"])
    options = {"decoding": decoder, "batch_size": spec["batch_size"], "device": spec["device"]}
    loaded = _peak_rss_mb()
    cuda = spec["device"] in ("gpu", "cuda") or (spec["device"] == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    out = {"attention": rec.model.attention_spec, "loaded_rss_mb": loaded}
    if spec["kind"] == "utterances":
        recordings = {m: read_manifest(Path(m).with_suffix(".parts.jsonl"), check_audio=False) for m in spec["manifests"]}
        unique = {u.audio_filepath: u for parts in recordings.values() for u in parts}
        start = timing.Clock()
        done = dict(zip(unique, rec.transcribe(list(unique), **options)))
        out["seconds"] = start.seconds()
        out["recordings"] = {m: _score(rec, parts, [done[u.audio_filepath] for u in parts])
                             for m, parts in recordings.items()}
    else:
        (ref,) = read_manifest(spec["manifest"], check_audio=False)
        long_form = {"mode": spec["mode"], "window_s": spec["window_s"], "overlap_s": spec["overlap_s"]}
        start = timing.Clock()
        (t,) = rec.transcribe(ref.audio_filepath, long_form=long_form, **options)
        out["seconds"] = start.seconds()
        if not t.ok:
            raise RuntimeError(f"{ref.audio_filepath}: {t.error}")
        out.update(_score(rec, [ref], [t]), audio_seconds=t.duration, rtf=out["seconds"] / t.duration,
                   mode_used=t.mode, output_frames=int(round(t.duration / rec.frame_seconds)),
                   hyp_words=len(t.words))
    out["peak_rss_mb"] = _peak_rss_mb()
    if cuda:
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def run_child(spec: dict, timeout: float) -> dict:
    """``child(spec)`` in a fresh process (so its peak RSS is this run's); ``{"error": ...}`` on failure."""
    cmd = [sys.executable, "-m", "benchmarks.pipeline.long_recordings", "--child", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=bench_io.child_env())
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode or not lines:
        return {"error": f"exit status {proc.returncode}: {proc.stderr.strip().splitlines()[-1:] or ['?']}"}
    return json.loads(lines[-1][len(RESULT_PREFIX):])


# ---------------------------------------------------------------------- the table
def _fmt(value, digits: int = 2) -> str:
    return "n/a" if value is None or (isinstance(value, float) and value != value) else f"{value:.{digits}f}"


def render(report: dict) -> str:
    """The Markdown page of a report."""
    metric = report["unit_metric"].upper()
    lines = [f"# Long recordings: one pass vs windows ({report['machine']['cpu']}, {report['machine']['cores']} cores)",
             "", f"- command: `{report['command']}`",
             f"- date {report['date']}, commit {report['commit']}; torch {report['machine']['torch']}, "
             f"{report['machine']['torch_threads']} thread(s); 1-min load average {report['load_start']} at start, "
             f"{report['load_end']} at end",
             f"- checkpoint: {report['ckpt']} (trained with {report['trained_attention']}, "
             f"{report['unit_metric']} units, subsampling {report['subsampling']}, {report['frame_ms']:.0f} ms output frames)",
             f"- decoding: {report['decoding']}; windowed: {report['window_s']} s windows, {report['overlap_s']} s overlap; "
             f"device {report['device']}",
             "- memory: peak RSS = `resource.getrusage(RUSAGE_SELF).ru_maxrss` of a fresh process per run (libraries, "
             "model, audio and features included); 'loaded' = the same once the model is loaded, before decoding",
             "- voices: " + (f"one, {report['speaker']} (only its utterances are joined)" if report.get("speaker")
                             else "the test set's, in manifest order (a new voice every utterance or two)"),
             "", "## Recordings", "", "| recording | duration (s) | utterances | times through the test set | words |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for r in report["recordings"]:
        lines.append(f"| {r['name']} | {r['duration']:.1f} | {r['utterances']} | {r['cycles']} | {r['words']} |")
    lines += ["", "## Results", "",
              "u2u = the same utterances decoded one by one with the same attention; Δ = recording − u2u "
              "(percentage points).", "",
              f"| recording | attention | mode | {metric} | WER | u2u {metric} | u2u WER | Δ{metric} | ΔWER | RTF | "
              "peak RSS (MB) | loaded RSS (MB) |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in report["runs"]:
        if "error" in r or "skipped" in r:
            lines.append(f"| {r['recording']} | {r['attention']} | {r['mode']} | "
                         f"{r.get('skipped') or 'failed: ' + r['error']} |  |  |  |  |  |  |  |  |")
            continue
        u = r["u2u"]
        du = r[report["unit_metric"]] - u[report["unit_metric"]] if u else None
        dw = r["wer"] - u["wer"] if u else None
        mode = r["mode"] if r["mode"] != "auto" else f"auto → {r['mode_used']}"
        lines.append(f"| {r['recording']} | {r['attention']} | {mode} | {_fmt(r[report['unit_metric']])} | "
                     f"{_fmt(r['wer'])} | {_fmt(u and u[report['unit_metric']])} | {_fmt(u and u['wer'])} | "
                     f"{_fmt(du)} | {_fmt(dw)} | {_fmt(r['rtf'], 3)} | {r['peak_rss_mb']:.0f} | {r['loaded_rss_mb']:.0f} |")
    lines += ["", "## Target", "", "60-minute recording, one pass, i-clustered attention, 2-core CPU: RTF ≤ 0.1, "
              f"{metric} and WER each within 2 points of utterance-by-utterance decoding.", ""]
    target = [r for r in report["runs"] if r.get("audio_seconds", 0) >= 3600 and r["mode"] == "one_pass"
              and str(r.get("attention_spec", "")).startswith("i-clustered") and "error" not in r]
    if not target:
        lines.append("- not measured here (no 60-minute one-pass i-clustered run in this report)")
    for r in target:
        u = r["u2u"]
        ok_rtf = r["rtf"] <= 0.1
        ok_err = u is not None and all(abs(r[k] - u[k]) <= 2 for k in (report["unit_metric"], "wer"))
        lines.append(f"- {r['recording']} {r['attention']}: RTF {_fmt(r['rtf'], 3)} ({'met' if ok_rtf else 'NOT met'}); "
                     f"Δ{metric} {_fmt(r[report['unit_metric']] - u[report['unit_metric']]) if u else 'n/a'}, "
                     f"ΔWER {_fmt(r['wer'] - u['wer']) if u else 'n/a'} ({'met' if ok_err else 'NOT met'})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", help="the checkpoint to decode with")
    p.add_argument("--manifest", default=str(ROOT / "data" / "synthetic" / "test.jsonl"),
                   help="the utterances to join (a test manifest)")
    p.add_argument("--minutes", type=float, nargs="+", default=[1, 10, 60], help="recording lengths (minutes)")
    p.add_argument("--seconds", type=float, nargs="+", help="recording lengths in seconds (instead of --minutes)")
    p.add_argument("--pause-s", type=float, default=0.3, help="silence between two utterances")
    p.add_argument("--speaker", help="join only this speaker's utterances (manifest 'speaker'): a one-voice recording")
    p.add_argument("--attentions", nargs="+", default=["full", "clustered", "i_clustered"],
                   help="conf/attention options or spec strings; 'trained' = the checkpoint's own")
    p.add_argument("--modes", nargs="+", default=["one_pass", "windowed"], choices=["one_pass", "windowed", "auto"])
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--overlap-s", type=float, default=4.0)
    p.add_argument("--decoding", default="greedy", help="greedy | beam | beam_lm")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--max-quadratic-one-pass-s", type=float, default=900.0,
                   help="skip full/top-k attention in one pass above this many seconds of audio")
    p.add_argument("--timeout", type=float, default=7200.0, help="seconds per run")
    p.add_argument("--work-dir", default=str(ROOT / "outputs" / "long_recordings"), help="where recordings go")
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--machine", help="name in the result file (default: CPU model and cores)")
    p.add_argument("--tag", help="appended to the result file's name (e.g. the model: --tag joined)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(RESULT_PREFIX + json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    if not args.ckpt:
        p.error("--ckpt is required")

    from fastasr.recognition.loading import load_recogniser

    load_start = bench_io.load_average()
    rec = load_recogniser(args.ckpt)
    machine = bench_io.machine_info(args.device if args.device != "auto" else "cpu")
    utterances = read_manifest(args.manifest)
    if args.speaker:
        utterances = [u for u in utterances if u.speaker == args.speaker]
        if not utterances:
            raise SystemExit(f"--speaker {args.speaker!r}: no utterance of {args.manifest} has this 'speaker'")
    lengths = args.seconds or [m * 60 for m in args.minutes]
    recordings = []
    for seconds in lengths:
        name = f"long-{seconds:g}s" + (f"-{args.speaker}" if args.speaker else "")
        manifest = build_long_recording(utterances, seconds, Path(args.work_dir), name, args.pause_s,
                                        source=str(Path(args.manifest).resolve()))
        (ref,) = read_manifest(manifest, check_audio=False)
        info = json.loads(manifest.read_text().splitlines()[0])
        recordings.append({"name": name, "manifest": str(manifest), "duration": ref.duration,
                           "utterances": info["utterances"], "cycles": info["cycles"], "words": len(ref.text.split())})
        print(f"{name}: {ref.duration:.1f} s, {info['utterances']} utterances -> {manifest}", flush=True)
    base = {"ckpt": str(Path(args.ckpt).resolve()), "decoding": args.decoding, "batch_size": args.batch_size,
            "device": args.device, "seed": args.seed, "window_s": args.window_s, "overlap_s": args.overlap_s}
    runs = []
    for attention in args.attentions:
        u2u = run_child({**base, "kind": "utterances", "attention": attention,
                         "manifests": [r["manifest"] for r in recordings]}, args.timeout)
        print(f"{attention}: utterance by utterance: {u2u.get('error') or 'done'}", flush=True)
        for r in recordings:
            for mode in args.modes:
                row = {"recording": r["name"], "attention": attention, "mode": mode}
                if (mode == "one_pass" and r["duration"] > args.max_quadratic_one_pass_s
                        and _cost(attention, rec, r["duration"]) == "quadratic"):
                    row["skipped"] = f"skipped: quadratic attention in one pass over {r['duration']:.0f} s"
                else:
                    result = run_child({**base, "kind": "long", "attention": attention, "manifest": r["manifest"],
                                        "mode": mode}, args.timeout)
                    row.update(result)
                    row["attention_spec"] = result.get("attention")
                    row["u2u"] = None if "error" in u2u else u2u["recordings"][r["manifest"]]
                runs.append(row)
                print(f"  {r['name']} {attention} {mode}: "
                      f"{row.get('skipped') or row.get('error') or json.dumps({k: row[k] for k in ('wer', 'rtf')})}",
                      flush=True)
    report = {"command": " ".join(["python -m benchmarks.pipeline.long_recordings", *(argv if argv is not None else sys.argv[1:])]),
              "date": datetime.date.today().isoformat(), "commit": bench_io.git_commit(ROOT), "machine": machine,
              "load_start": load_start, "load_end": bench_io.load_average(), "ckpt": args.ckpt,
              "trained_attention": rec.model.attention_spec, "unit_metric": rec.unit_metric,
              "subsampling": rec.subsampling, "frame_ms": rec.frame_seconds * 1000, "decoding": args.decoding,
              "window_s": args.window_s, "overlap_s": args.overlap_s, "device": args.device, "speaker": args.speaker,
              "recordings": recordings, "runs": runs}
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    slug = "_".join([args.machine or machine["slug"], *([args.decoding] if args.decoding != "greedy" else []),
                     *(bench_io.slugify(x) for x in (args.speaker, args.tag) if x)])
    (out / f"long_recordings_{slug}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"long_recordings_{slug}.md").write_text(render(report))
    print(f"wrote {out / f'long_recordings_{slug}.md'}", flush=True)
    return 0 if not any("error" in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
