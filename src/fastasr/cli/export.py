"""``fastasr-export ckpt_path=CKPT [out=DIR] [int8=true] [check=true] [streaming=auto] [chunk=0.64]
[left=auto]`` (or ``python -m fastasr.cli.export``): write a trained
checkpoint as an exported folder (:func:`fastasr.deploy.export.export_recogniser`; docs/DEPLOY.md).

``streaming=true`` adds ``model.streaming.onnx``, the chunk-by-chunk graph sherpa-onnx's online
recogniser streams (:func:`fastasr.deploy.streaming_export.export_streaming`), with chunks of
``chunk`` seconds and ``left`` seconds of left context (``auto``: the model's trained one, else
10 s); ``auto`` (the default): for a model trained with chunks (``model.streaming``).

``out`` defaults to ``<the checkpoint's run directory>/export`` (``exported`` beside a checkpoint
outside a run). Prints the files written, the attention the graph holds (and, for a fast attention,
why it is full attention there), and the largest difference between PyTorch's and onnxruntime's
log-probabilities on two test batches. Exit status 2 for a bad key or a missing checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

DEFAULTS = {"ckpt_path": None, "out": None, "int8": "true", "check": "true", "streaming": "auto", "chunk": "0.64",
            "left": "auto"}


def main(argv: list[str] | None = None) -> None:
    args = dict(DEFAULTS)
    for arg in sys.argv[1:] if argv is None else argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in DEFAULTS:
            raise SystemExit(f"fastasr-export: {arg!r}; expected key=value with a key of {sorted(DEFAULTS)}")
        args[key] = value
    ckpt = Path(args["ckpt_path"] or "")
    if not args["ckpt_path"] or not ckpt.is_file():
        print(f"fastasr-export: ckpt_path={args['ckpt_path']}: no such checkpoint file; expected "
              "fastasr-export ckpt_path=CKPT [out=DIR]", file=sys.stderr)
        raise SystemExit(2)
    flags = {}
    for key in ("int8", "check"):
        if args[key].lower() not in ("true", "false"):
            print(f"fastasr-export: {key}={args[key]!r}; expected true or false", file=sys.stderr)
            raise SystemExit(2)
        flags[key] = args[key].lower() == "true"
    streaming = args["streaming"].lower()
    if streaming not in ("true", "false", "auto"):
        print(f"fastasr-export: streaming={args['streaming']!r}; expected true, false or auto", file=sys.stderr)
        raise SystemExit(2)
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None
    out = Path(args["out"]) if args["out"] else (run / "export" if run is not None else ckpt.parent / "exported")

    from fastasr.deploy.export import export_recogniser  # loads torch: after the checks
    from fastasr.quiet import quiet_known_noise  # (with torch: its noise)
    from fastasr.recognition.loading import load_recogniser  # loads torch

    quiet_known_noise()
    recogniser = load_recogniser(ckpt)
    result = export_recogniser(recogniser, out, source=str(ckpt), int8=flags["int8"], check=flags["check"])
    for name in result.files:
        size = (result.out / name).stat().st_size
        print(f"{result.out / name}\t{size / 1e6:.2f} MB")
    if result.swapped:
        print(f"fastasr-export: {result.swapped}", file=sys.stderr)
    if result.max_abs_diff is not None:
        print(f"fastasr-export: attention {result.attention}; onnxruntime against PyTorch: largest log-probability "
              f"difference {result.max_abs_diff:.2e}", file=sys.stderr)

    if streaming == "auto":
        streaming = "true" if (recogniser.model_config.get("streaming") or {}).get("chunk_sizes") else "false"
    if streaming == "true":
        from fastasr.deploy.streaming_export import export_streaming  # streaming=true only

        try:
            streamed = export_streaming(recogniser, out, chunk=args["chunk"], left=args["left"], source=str(ckpt),
                                        check=flags["check"])
        except ValueError as error:
            print(f"fastasr-export: streaming: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        print(f"{streamed.out / streamed.files[0]}\t{(streamed.out / streamed.files[0]).stat().st_size / 1e6:.2f} MB")
        print(f"fastasr-export: streaming: chunk_size {streamed.chunk_size}, num_left_chunks {streamed.left_chunks} "
              f"(sherpa-onnx's from_wenet_ctc arguments)", file=sys.stderr)
        if streamed.swapped:
            print(f"fastasr-export: streaming: {streamed.swapped}", file=sys.stderr)
        if streamed.max_abs_diff is not None:
            print(f"fastasr-export: streaming: onnxruntime against the PyTorch stream: largest log-probability "
                  f"difference {streamed.max_abs_diff:.2e}", file=sys.stderr)


if __name__ == "__main__":
    main()
