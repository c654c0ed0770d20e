"""One epoch of the training dataloader with features computed on the fly vs read from the
feature cache, in one run, on one machine.

    python -m benchmarks.pipeline.feature_cache                  # the built-in corpus (make data first)
    python -m benchmarks.pipeline.feature_cache --epochs 2 features=fbank80 data.num_workers=4
    python -m benchmarks.pipeline.feature_cache data=manifest data.train_manifest=T.jsonl \\
        data.dev_manifest=D.jsonl data.test_manifest=E.jsonl tokenizer=char

Positional arguments are the overrides ``train.py`` takes (the data and features groups
matter). Steps: build (or find) the training manifest's feature cache (timed: it is the
cost of ``make features``); set up two DataModules from the same config, ``data.cache.mode=off``
and ``data.cache.mode=auto`` (CMVN statistics are computed once, untimed, if not cached yet);
then time ``--epochs`` full passes over each training dataloader (worker start-up included in
the first), on the fly first, cached second. Nothing but batches is produced: no model runs,
so the ratio is the data pipeline's alone (``data.num_workers`` workers, as in training).

Writes ``benchmarks/results/feature_cache_<machine>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks import bench_io, timing

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from lightning.fabric.utilities.data import _set_sampler_epoch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from fastasr.config import CONFIG_DIR  # noqa: E402
from fastasr.data.feature_cache import CacheConfig, open_feature_cache  # noqa: E402
from fastasr.data.features import FeatureConfig, with_native_rate  # noqa: E402
from fastasr.data.manifest import read_manifest  # noqa: E402
from fastasr.training.derived_config import resolve_train_config  # noqa: E402


def time_epochs(datamodule, epochs: int) -> list[dict]:
    """Seconds, batches, utterances and frames of ``epochs`` passes over the training loader."""
    loader = datamodule.train_dataloader()
    out = []
    for epoch in range(epochs):
        _set_sampler_epoch(loader, epoch)
        batches = utts = frames = 0
        start = timing.Clock()
        for batch in loader:
            batches += 1
            utts += len(batch["ids"])
            frames += int(batch["feature_lengths"].sum())
        out.append({"epoch": epoch, "seconds": start.seconds(), "batches": batches,
                    "utterances": utts, "frames": frames})
        print(f"  epoch {epoch}: {out[-1]['seconds']:.2f} s, {batches} batches, {utts} utterances", flush=True)
    return out


def run(overrides: list[str], epochs: int) -> dict:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    resolve_train_config(cfg)  # tokenizer, batch price: the values training works out
    data = OmegaConf.to_container(cfg.data, resolve=True)
    cache = CacheConfig.from_dict({**data["cache"], "mode": "build"})
    utterances = read_manifest(data["train_manifest"], on_error=data.get("on_bad_utterance", "skip"))
    features = with_native_rate(FeatureConfig.from_dict(data["features"]), [u.audio_filepath for u in utterances],
                                data["train_manifest"])

    print(f"feature cache of {data['train_manifest']} ({len(utterances)} utterances)", flush=True)
    start = timing.Clock()
    built = open_feature_cache(utterances, data["train_manifest"], features, cache,
                               num_workers=int(data.get("num_workers", 0)))
    build_s = start.seconds()
    print(f"  {built.directory}: {build_s:.1f} s (build or lookup), {built.nbytes() / 1e6:.1f} MB", flush=True)

    results = {}
    for name, mode in (("on_the_fly", "off"), ("cached", "auto")):
        print(f"{name} (data.cache.mode={mode})", flush=True)
        dm = instantiate(cfg.data, subsampling_factor=cfg.model.subsampling, _convert_="all",
                         cache={**data["cache"], "mode": mode})
        dm.setup("fit")
        results[name] = time_epochs(dm, epochs)
    first = {k: v[0]["seconds"] for k, v in results.items()}
    return {
        "train_manifest": data["train_manifest"],
        "features": data["features"],
        "num_workers": data.get("num_workers", 0),
        "max_frames_per_batch": data.get("max_frames_per_batch"),
        "cache_dir": str(built.directory),
        "cache_mb": built.nbytes() / 1e6,
        "cache_dtype": cache.dtype,
        "cache_build_or_lookup_s": build_s,
        "epochs": results,
        "ratio_first_epoch": first["on_the_fly"] / first["cached"],
    }


def write_markdown(result: dict, info: dict, meta: dict, path: Path) -> None:
    fly, cached = result["epochs"]["on_the_fly"], result["epochs"]["cached"]
    lines = [
        f"# Feature cache: one training epoch, on the fly vs cached ({info['cpu']}, {info['cores']} cores)",
        "",
        f"- command: `{meta['command']}`",
        f"- machine: {info['cpu']}, {info['cores']} cores; torch {info['torch']}, Python {info['python']}; "
        f"1-min load average {meta['load_start']} at start, {meta['load_end']} at end",
        f"- training manifest: {result['train_manifest']} ({fly[0]['utterances']} utterances, "
        f"{fly[0]['frames']} frames per epoch); features {result['features']}",
        f"- dataloader: {result['num_workers']} worker(s), {result['max_frames_per_batch']} padded frames per batch; "
        "time = a full pass over the batches (worker start-up included in epoch 0), no model",
        f"- cache: {result['cache_mb']:.1f} MB ({result['cache_dtype']}); build (or lookup, if it existed) "
        f"{result['cache_build_or_lookup_s']:.1f} s",
        "",
        "| epoch | on the fly (s) | cached (s) | speed-up |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for a, b in zip(fly, cached):
        lines.append(f"| {a['epoch']} | {a['seconds']:.2f} | {b['seconds']:.2f} | {a['seconds'] / b['seconds']:.1f}× |")
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="train.py overrides (data=..., features=..., data.num_workers=...)")
    p.add_argument("--epochs", type=int, default=1, help="passes over each loader (≥ 2 shows the warm epochs)")
    p.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    info = bench_io.machine_info("cpu")
    print(json.dumps(info), flush=True)
    meta = {"command": " ".join(["python", "-m", "benchmarks.pipeline.feature_cache", *(sys.argv[1:] if argv is None else argv)]),
            "load_start": bench_io.load_average()}
    result = run(args.overrides, args.epochs)
    meta["load_end"] = bench_io.load_average()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"feature_cache_{info['slug']}"
    stem.with_suffix(".json").write_text(json.dumps({"machine": info, **meta, **result}, indent=2) + "\n")
    write_markdown(result, info, meta, stem.with_suffix(".md"))
    print(f"first epoch: on the fly {result['epochs']['on_the_fly'][0]['seconds']:.2f} s, cached "
          f"{result['epochs']['cached'][0]['seconds']:.2f} s: {result['ratio_first_epoch']:.1f}× faster cached")
    print(f"wrote {stem}.json/.md")


if __name__ == "__main__":
    main()
