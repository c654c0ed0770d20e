"""``fastasr-onnx-transcribe model_dir=DIR audio=PATH [key=value ...]``: transcribe audio with
an exported recogniser (``fastasr-export``), without PyTorch: this module and what it
imports load no torch (:mod:`fastasr.onnx.onnx_recogniser`). Also ``python -m fastasr.onnx.transcribe``.
The one command outside :mod:`fastasr.cli`: that package's commands import torch, and the runtime
must be whole without it.

Keys (docs/DEPLOY.md):
    model_dir=DIR      the exported folder
    audio=PATH         an audio file, a directory (its audio files, recursively) or a manifest (.jsonl);
                       several: audio=[a.wav,b.wav]
    int8=false         true: the int8 model (model.int8.onnx)
    out=null           a directory for transcripts.jsonl (and transcripts.ctm, srt/<id>.srt)
    ctm=false srt=false
    mode=auto          auto / windowed: windows of window_s seconds overlapping by overlap_s, as
                       fastasr-transcribe reads a recording with full attention; one_pass
    window_s=10 overlap_s=4 batch_size=8 threads=null
    decoding=greedy    greedy | beam (the folder's lexicon) | beam_lm (its lexicon and word LM): the
                       beam search of fastasr-transcribe (fastasr.decoding.beam), with
    beam_size=500 lm_weight=2.0 word_score=0.0   its settings (conf/decoding/beam.yaml's defaults)

Prints ``path<TAB>text`` per recording on stdout, and a closing line on stderr; exit status 2
for a bad key or value, 1 when no input could be transcribed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import soundfile as sf

from fastasr.decoding.transcript_formats import ctm_lines, srt_text
from fastasr.decoding.windows import LongFormConfig
from fastasr.onnx.onnx_recogniser import OnnxRecogniser, beam_search

DEFAULTS = {"model_dir": None, "audio": None, "int8": "false", "out": None, "ctm": "false", "srt": "false",
            "mode": "auto", "window_s": "10", "overlap_s": "4", "batch_size": "8", "threads": None,
            "decoding": "greedy", "beam_size": "500", "lm_weight": "2.0", "word_score": "0.0"}
DECODINGS = ("greedy", "beam", "beam_lm")


def refuse(message: str) -> None:
    """One line on stderr and exit status 2."""
    print(f"fastasr-onnx-transcribe: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse(argv: list[str]) -> dict[str, str | None]:
    """``key=value`` arguments over :data:`DEFAULTS`; refused (:func:`refuse`) naming an unknown or missing key."""
    args = dict(DEFAULTS)
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in DEFAULTS:
            refuse(f"{arg!r}; expected key=value with a key of {sorted(DEFAULTS)}")
        args[key] = value
    for key in ("model_dir", "audio"):
        if not args[key]:
            refuse(f"{key} is not set; expected {key}=... (fastasr-onnx-transcribe model_dir=DIR audio=PATH)")
    return args


def audio_paths(spec: str) -> list[Path]:
    """The audio files ``spec`` names: a file, a directory (files soundfile reads, recursively,
    sorted), a manifest's ``audio_filepath`` entries, or a list ``[a,b]`` of them."""
    if spec.startswith("[") and spec.endswith("]"):
        return [p for part in spec[1:-1].split(",") if part.strip() for p in audio_paths(part.strip())]
    path = Path(spec)
    if path.is_dir():
        known = {"." + ext.lower() for ext in sf.available_formats()} | {".wav", ".flac", ".ogg", ".mp3"}
        return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in known)
    if path.suffix in (".jsonl", ".json"):
        lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [Path(r["audio_filepath"]) if Path(r["audio_filepath"]).is_absolute()
                else path.parent / r["audio_filepath"] for r in lines]
    return [path]


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        long_form = LongFormConfig(mode=str(args["mode"]), window_s=float(args["window_s"]),
                                   overlap_s=float(args["overlap_s"]))
        batch_size = int(args["batch_size"])
        search = {"beam_size": int(args["beam_size"]), "lm_weight": float(args["lm_weight"]),
                  "word_score": float(args["word_score"])}
    except ValueError as err:
        refuse(str(err))
    if args["decoding"] not in DECODINGS:
        refuse(f"decoding={args['decoding']!r}; expected one of {', '.join(DECODINGS)}")
    options = None
    if args["decoding"] != "greedy":  # the beam search (flashlight-text) is imported for it alone
        try:
            options = beam_search()[1](**search)
        except ValueError as err:
            refuse(str(err))
    truthy = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    flags = {}
    for key in ("int8", "ctm", "srt"):
        if str(args[key]).lower() not in truthy:
            refuse(f"{key}={args[key]!r}; expected true or false")
        flags[key] = truthy[str(args[key]).lower()]
    try:
        recogniser = OnnxRecogniser.load(args["model_dir"], int8=flags["int8"],
                                         threads=int(args["threads"]) if args["threads"] else None)
        decoder = (None if args["decoding"] == "greedy"
                   else recogniser.beam_decoder(lm=args["decoding"] == "beam_lm", options=options))
    except (FileNotFoundError, ValueError) as err:
        refuse(str(err))
    out = Path(args["out"]) if args["out"] else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if flags["srt"]:
            (out / "srt").mkdir(exist_ok=True)
    started, seconds, done, failed = time.perf_counter(), 0.0, 0, []
    jsonl = open(out / "transcripts.jsonl", "w", encoding="utf-8") if out is not None else None
    ctm = open(out / "transcripts.ctm", "w", encoding="utf-8") if out is not None and flags["ctm"] else None
    try:
        for t in recogniser.transcribe(audio_paths(str(args["audio"])), long_form=long_form, batch_size=batch_size,
                                       decoder=decoder):
            if not t.ok:
                failed.append(t)
                print(f"fastasr-onnx-transcribe: skipped {t.error}", file=sys.stderr)
                continue
            done, seconds = done + 1, seconds + t.duration
            print(f"{t.audio_filepath}\t{t.text}", flush=True)
            if jsonl is not None:
                jsonl.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")
            if ctm is not None:
                ctm.write(ctm_lines(t))
            if out is not None and flags["srt"]:
                (out / "srt" / f"{t.id}.srt").write_text(srt_text(t.words), encoding="utf-8")
    finally:
        for f in (jsonl, ctm):
            if f is not None:
                f.close()
    wall = time.perf_counter() - started
    rtf = f", RTF {wall / seconds:.3f}" if seconds else ""
    print(f"fastasr-onnx-transcribe: {done} of {done + len(failed)} input(s) transcribed ({seconds:.1f} s of audio "
          f"in {wall:.1f} s{rtf}; {'int8' if flags['int8'] else 'fp32'}, {args['decoding']}, attention "
          f"{recogniser.export.get('attention')})", file=sys.stderr)
    return 0 if done or not failed else 1


if __name__ == "__main__":
    sys.exit(main())
