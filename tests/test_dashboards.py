"""Dashboards: what a training run leaves in TensorBoard, wandb (offline), CSV and PNG files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import matplotlib.image
import pytest
import torch
from hydra import compose, initialize_config_dir

from fastasr.config import CONFIG_DIR
from fastasr.model import CTCModel
from fastasr.training.callbacks import (
    AttentionMapLogger,
    attention_info,
    mean_l1_distance,
    peak_memory_mb,
    render_attention_maps,
)

TINY_MODEL = ["model.d_model=32", "model.heads=2", "model.ff_dim=64", "model.layers=2", "model.spec_augment=null"]


# ----------------------------------------------------------------------------- wandb offline files
def wandb_records(path: Path) -> Iterator[bytes]:
    """Records of a wandb ``run-*.wandb`` file: a 7-byte header (``:W&B``, magic, version), then
    a LevelDB-style log of 32 KiB blocks, each record ``crc32 (4) | length (2) | type (1) | data``
    with type 1 = full, 2/3/4 = first/middle/last fragment."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb transaction log"
    pos, block, parts = 7, 32768, []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4: pos + 6], "little"), data[pos + 6]
        payload = data[pos + 7: pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield payload
        elif kind == 2:
            parts = [payload]
        elif kind == 3:
            parts.append(payload)
        elif kind == 4:
            yield b"".join(parts + [payload])
        elif kind == 0 and length == 0:  # zero padding up to the block end
            pos += left - 7


def wandb_offline_run(run_dir: Path) -> dict:
    """History keys, config (key → JSON) and summary keys of the offline wandb run in ``run_dir``."""
    from wandb.proto import wandb_internal_pb2 as pb

    files = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert files, f"no wandb/offline-run-*/run-*.wandb under {run_dir}"
    history, config, summary = set(), {}, set()
    for raw in wandb_records(files[-1]):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history |= {i.key or "/".join(i.nested_key) for i in record.history.item}
        elif kind == "summary":
            summary |= {i.key or "/".join(i.nested_key) for i in record.summary.update}
        elif kind in ("config", "run"):
            updates = record.config.update if kind == "config" else record.run.config.update
            config.update({i.key: json.loads(i.value_json) for i in updates})
    return {"history": history, "config": config, "summary": summary}


# ----------------------------------------------------------------------------- attention maps
def _model(attention: str, shared_qk: bool = False) -> CTCModel:
    torch.manual_seed(0)
    return CTCModel(vocab_size=10, feat_in=40, d_model=32, heads=4, ff_dim=64, layers=3,
                    attention=attention, shared_qk=shared_qk).eval()


@pytest.mark.parametrize("attention,shared,columns", [
    ("i-clustered-8", False, 2), ("lsh-1", True, 2), ("full", False, 1), ("oracle-top", False, 2),
])
def test_attention_map_image_has_the_right_shape(attention, shared, columns):
    model = _model(attention, shared)
    cb = AttentionMapLogger(heads=3, panel_size=2.0, dpi=50, max_frames=60)
    maps, heads, layer = cb.compute_maps(model, torch.randn(90, 40))
    assert layer == 1 and heads == [0, 1, 2] and len(maps) == columns
    assert maps[0][0] == {"oracle-top": "topk-32"}.get(attention, attention)
    for _, w in maps:
        assert w.shape == (3, 60, 60)
        assert abs(w.sum(-1) - 1).max() < 1e-4  # rows are distributions
    image = render_attention_maps(maps, heads, "t", panel_size=2.0, dpi=50)
    assert image.dtype.name == "uint8"
    assert image.shape == (int(50 * (2.0 * 3 + 0.5)), int(50 * 2.0 * columns), 3)
    # the callback observed the model through capture_attention and left no hook behind
    assert all(not layer.inner._forward_pre_hooks for layer in model.attention_layers())


def test_attention_map_callback_leaves_the_training_rng_alone():
    model = _model("clustered-8")
    cb = AttentionMapLogger(heads=[1], layer=-1)
    features = torch.randn(50, 40)
    torch.manual_seed(5)
    maps, heads, layer = cb.compute_maps(model, features)
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(3))
    assert heads == [1] and layer == 2
    with pytest.raises(ValueError, match="3 layers"):
        AttentionMapLogger(layer=7).compute_maps(model, features)


def _val_batch(ids: list[str], lengths: list[int]) -> dict:
    feats = torch.zeros(len(ids), max(lengths), 4)
    for i, n in enumerate(lengths):
        feats[i, :n] = float(n)  # each utterance's frames hold its length, to tell them apart
    return {"ids": ids, "features": feats, "feature_lengths": torch.tensor(lengths)}


@pytest.mark.parametrize("pick,expected", [("longest", ("c", 12)), ("first", ("a", 5))])
def test_attention_map_utterance_is_chosen_over_the_first_validation_epoch(pick, expected, monkeypatch):
    from types import SimpleNamespace

    cb = AttentionMapLogger(pick=pick)
    rendered = []
    monkeypatch.setattr(cb, "log_maps", lambda trainer, module: rendered.append(cb._utterance[0]))
    trainer = SimpleNamespace(sanity_checking=True, is_global_zero=True, current_epoch=0)

    def validation(batches):
        for idx, batch in enumerate(batches):
            cb.on_validation_batch_start(trainer, None, batch, idx)
        cb.on_validation_epoch_end(trainer, None)

    validation([_val_batch(["s"], [30])])  # the sanity check chooses nothing and renders nothing
    assert cb._utterance is None and rendered == []
    trainer.sanity_checking = False
    # sorted validation batches: the first one holds the short utterances
    validation([_val_batch(["a", "b"], [5, 7]), _val_batch(["c", "d"], [12, 9]), _val_batch(["e"], [11])])
    utt_id, feats = cb._utterance
    assert (utt_id, feats.shape[0]) == expected and torch.all(feats == expected[1])
    assert rendered == [expected[0]]
    trainer.current_epoch = 1
    validation([_val_batch(["z"], [40])])  # later epochs keep the chosen utterance
    assert rendered == [expected[0]] * 2
    resumed = AttentionMapLogger(pick=pick)
    resumed.load_state_dict(cb.state_dict())
    resumed.on_validation_batch_start(trainer, None, _val_batch(["z"], [40]), 0)
    assert resumed._utterance[0] == expected[0]


def test_mean_l1_distance_between_attention_rows():
    import numpy as np

    eye, flip = np.eye(3), np.eye(3)[::-1]  # rows 0 and 2 disjoint, row 1 equal
    assert mean_l1_distance(eye, eye) == 0.0
    assert mean_l1_distance(eye, flip) == pytest.approx(4 / 3)
    assert mean_l1_distance(np.full((2, 4), 0.25), np.eye(4)[:2]) == pytest.approx(1.5)


def test_attention_info_names_the_variant_and_its_parameters():
    info = attention_info(_model("i-clustered-8"))
    assert info["spec"] == "i-clustered-8" and info["clusters"] == 8 and info["topk"] == 32
    assert info["shared_qk"] is False
    assert attention_info(_model("lsh-4", shared_qk=True))["rounds"] == 4


def test_peak_memory_is_positive_on_cpu():
    assert peak_memory_mb(torch.device("cpu")) > 10


def test_resetting_the_peak_forgets_an_earlier_runs_memory():
    """Runs that share a process (budget members) each report their own peak: after
    reset_peak_memory the peak is the memory in use now, not an earlier 300 MB block's."""
    from fastasr.training.callbacks import reset_peak_memory

    block = torch.ones(75_000_000)  # 300 MB, touched
    with_block = peak_memory_mb(torch.device("cpu"))
    del block  # a block this large is returned to the OS at once (mmap)
    assert peak_memory_mb(torch.device("cpu")) >= with_block - 1.0  # a high-water mark: the block still counts
    if not reset_peak_memory():
        pytest.skip("/proc/self/clear_refs is not writable here: the peak cannot be reset")
    assert peak_memory_mb(torch.device("cpu")) < with_block - 250


# ----------------------------------------------------------------------------- a tiny training
@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))


def test_training_fills_tensorboard_wandb_csv_and_pngs(tiny_corpus, tmp_path, offline_wandb):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from test_train_eval import data_overrides

    from fastasr.studies.report import read_metrics
    from fastasr.training.fit import train

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[
            "name=dash", f"paths.output_dir={tmp_path}", "logger=default",
            *data_overrides(tiny_corpus), "data.max_frames_per_batch=4000", *TINY_MODEL,
            "attention=i_clustered", "attention.clusters=8",
            "trainer.max_epochs=2", "trainer.log_every_n_steps=1", "test=false",
            "callbacks.attention_maps.heads=2",
        ])
    result = train(cfg)
    run_dir = Path(result.run_dir)
    assert run_dir == tmp_path / "runs" / "dash"
    scalars = {"train/loss", "val/loss", "val/per", "val/wer", "lr-RAdam", "train/grad_norm",
               "perf/batch_seconds", "perf/data_seconds", "perf/samples_per_second",
               "perf/frames_per_second", "perf/peak_memory_mb", "perf/epoch_seconds"}

    # TensorBoard: scalars, the attention-map image, the config and attention as text
    (tb_dir,) = list((run_dir / "tensorboard").glob("version_*"))
    events = EventAccumulator(str(tb_dir), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()
    assert scalars <= set(tags["scalars"]), scalars - set(tags["scalars"])
    assert len(events.Scalars("val/per")) == 2
    (image_tag,) = [t for t in tags["images"] if t.startswith("attention_maps/")]
    images = events.Images(image_tag)
    assert len(images) == 2 and images[-1].width > 100 and images[-1].height > 100
    config_text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "i-clustered" in config_text and "clusters: 8" in config_text
    hparams = (tb_dir / "hparams.yaml").read_text()
    assert "spec: i-clustered-8" in hparams

    # wandb (offline): the same metrics in history, the attention and the whole config as config
    wb = wandb_offline_run(run_dir)
    assert scalars <= wb["history"], scalars - wb["history"]
    assert {"val/per", "val/wer"} <= wb["summary"]
    assert any(k.startswith("attention_maps/") for k in wb["history"])
    assert wb["config"]["attention"]["spec"] == "i-clustered-8"
    assert wb["config"]["attention"]["clusters"] == 8
    assert wb["config"]["model"]["layers"] == 2 and wb["config"]["optim"]["lr"] == 1e-3

    # CSV metrics, PNGs of the attention maps, the completion marker
    columns = set().union(*read_metrics(run_dir))
    assert scalars <= columns
    pngs = sorted((run_dir / "attention_maps").glob("*.png"))
    assert [p.name[:8] for p in pngs] == ["epoch000", "epoch001"]
    image = matplotlib.image.imread(pngs[-1])
    assert image.shape[:2] == (images[-1].height, images[-1].width)  # PNG == the logged image
    done = json.loads((run_dir / "fit_done.json").read_text())
    assert done["epochs"] == 2 and done["max_epochs"] == 2 and Path(done["best_ckpt"]).is_file()
