"""``fastasr-redecode RUN_DIR [--out DIR] [KEY=VALUE ...]`` (or ``python -m fastasr.cli.redecode``): a finished run's final
decoding again, without training (:func:`fastasr.training.fit.decode_run`, what training hands over to).

The run's ``config.yaml`` with the ``KEY=VALUE`` overrides (OmegaConf dot-list, e.g.
``final_tuning.extend_edges=3`` or ``final_decoding.beam_size=1000``) says what to decode; the
checkpoint is the one the run's final decoding read (``results.json``'s ``ckpt_path``), else
``checkpoints/averaged.ckpt``, else the run's finished checkpoint. The run's ``lm/`` (the word LMs
its tuning built) is copied, not rebuilt. Writes ``results.json`` and the recogs/errs files to
``DIR`` (default ``RUN_DIR/redecoded``; refused where a ``results.json`` is already) and prints the
decoding's error rates.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from fastasr.rundir import RunDir
from fastasr.training.fit import decode_run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fastasr-redecode", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a finished training run (outputs/runs/NAME)")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE changes to the run's config.yaml")
    parser.add_argument("--out", help="where the decoding's files go (default: RUN_DIR/redecoded)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the tuning grid and the decoding, as they go
    run = RunDir(args.run_dir)
    out = RunDir(args.out or run.path / "redecoded")
    if not run.config_file.is_file():
        print(f"redecode: {run.config_file} does not exist; expected a training run directory", file=sys.stderr)
        return 2
    if out.results_file.is_file():
        print(f"redecode: {out.results_file} exists; pass another --out", file=sys.stderr)
        return 2
    before = run.read_results() or {}
    ckpt = next((Path(p) for p in (before.get("ckpt_path"), run.checkpoints / "averaged.ckpt")
                 if p and Path(p).is_file()), None) or run.finished_checkpoint(run.read_fit_done())
    out.create()
    if (run.path / "lm").is_dir():
        shutil.copytree(run.path / "lm", out.path / "lm", dirs_exist_ok=True)
    averaged_from = before.get("averaged_checkpoints") if str(ckpt) == before.get("ckpt_path") else None
    result = decode_run(run, str(ckpt), out=out, overrides=args.overrides, averaged_from=averaged_from)
    if result is None:
        print("redecode: no final decoding for this run (final_decoding is null, or no lexicon for its units)")
        return 1
    print(f"{ckpt}: {result.decoding['name']} ({result.words} words) {result.unit_metric.upper()}="
          f"{result.unit_error_rate:.2f} WER={result.wer:.2f} -> {out.results_file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
