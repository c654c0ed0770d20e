"""Checkpoint averaging against a hand computation, and the choice of the last/best N epochs."""

import argparse

import pytest
import torch

from fastasr.recognition.checkpoint_averaging import (
    average_checkpoints,
    average_into,
    select_checkpoints,
    write_averaged_checkpoint,
)
from fastasr.rundir import RunDir


def save(path, weight, bias, steps):
    torch.save({"epoch": 0, "state_dict": {"layer.weight": weight, "layer.bias": bias,
                                           "bn.num_batches_tracked": torch.tensor(steps)}}, path)
    return path


def test_average_of_two_checkpoints(tmp_path):
    a = save(tmp_path / "a.ckpt", torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([0.5], dtype=torch.float16), 10)
    b = save(tmp_path / "b.ckpt", torch.tensor([[3.0, 6.0], [-3.0, 0.0]]), torch.tensor([1.5], dtype=torch.float16), 20)
    avg = average_checkpoints([a, b])
    assert torch.equal(avg["layer.weight"], torch.tensor([[2.0, 4.0], [0.0, 2.0]]))
    assert avg["layer.bias"].dtype == torch.float16 and avg["layer.bias"].item() == 1.0
    assert avg["bn.num_batches_tracked"].item() == 20  # integers: the last checkpoint's


def test_mismatched_checkpoints_are_refused(tmp_path):
    a = save(tmp_path / "a.ckpt", torch.zeros(2, 2), torch.zeros(1), 1)
    b = save(tmp_path / "b.ckpt", torch.zeros(3, 2), torch.zeros(1), 1)
    with pytest.raises(ValueError, match="shape"):
        average_checkpoints([a, b])
    with pytest.raises(ValueError, match="no checkpoints"):
        average_checkpoints([])


def test_select_last_and_best_epochs(tmp_path):
    run = RunDir(tmp_path)
    run.checkpoints.mkdir()
    scores = {0: 30.0, 1: 20.0, 2: 25.0, 3: 21.0}
    for epoch, score in scores.items():
        save(run.checkpoints / f"epoch{epoch:03d}-score{score:.4f}.ckpt", torch.zeros(1), torch.zeros(1), epoch)
    save(run.checkpoints / "epoch004-scorenan.ckpt", torch.zeros(1), torch.zeros(1), 4)  # no score logged
    (run.checkpoints / "last.ckpt").touch()
    (run.checkpoints / "epoch-notes.ckpt").touch()  # not an epoch checkpoint's name: ignored
    assert [(e, p.name[:8]) for e, _, p in run.epoch_checkpoints()][:2] == [(0, "epoch000"), (1, "epoch001")]
    names = lambda paths: [p.name[:8] for p in paths]  # noqa: E731
    assert names(select_checkpoints(run, last=2)) == ["epoch003", "epoch004"]
    assert names(select_checkpoints(run, best=2)) == ["epoch001", "epoch003"]  # nan ranks last
    with pytest.raises(FileNotFoundError, match="6 epoch checkpoints wanted, 5"):
        select_checkpoints(run, last=6)
    with pytest.raises(ValueError, match="exactly one"):
        select_checkpoints(run, last=1, best=1)


def test_average_into_loads_the_mean(tmp_path):
    module = torch.nn.Linear(2, 1)
    ckpts = RunDir(tmp_path).checkpoints
    ckpts.mkdir()
    for epoch, value in enumerate([1.0, 2.0, 6.0]):
        torch.save({"state_dict": {"model.weight": torch.full((1, 2), value), "model.bias": torch.full((1,), value)}},
                   ckpts / f"epoch{epoch:03d}-score{10 - epoch:.4f}.ckpt")
    used = average_into(module, ckpts / "last.ckpt", last=2)
    assert len(used) == 2 and torch.equal(module.weight.data, torch.full((1, 2), 4.0))
    assert average_into(module, ckpts / "last.ckpt") == []  # neither option: nothing done
    with pytest.raises(ValueError, match="checkpoints/ folder"):  # averaging needs the run's epoch files
        average_into(module, tmp_path / "elsewhere.ckpt", last=2)
    with pytest.raises(ValueError, match="do not fit"):
        average_into(torch.nn.Linear(3, 1), ckpts / "last.ckpt", best=1)


def test_pickled_objects_are_refused(tmp_path):
    torch.save({"state_dict": {"w": torch.zeros(1)}, "args": argparse.Namespace(lr=1)}, tmp_path / "pickled.ckpt")
    with pytest.raises(Exception, match="[Ww]eights only"):  # weights_only=True: no arbitrary unpickling
        average_checkpoints([tmp_path / "pickled.ckpt"])


def test_the_averaged_checkpoint_is_the_template_with_the_mean_weights(tmp_path, caplog):
    """final_average: averaged.ckpt beside the best checkpoint, its weights the mean of the best N
    epochs, everything else the template's; fewer epochs than N average what there is."""
    run = RunDir(tmp_path)
    run.checkpoints.mkdir()
    for epoch, (value, score) in enumerate([(1.0, 30.0), (2.0, 10.0), (6.0, 20.0), (9.0, 40.0)]):
        save(run.checkpoints / f"epoch{epoch:03d}-score{score:.4f}.ckpt", torch.full((1, 2), value), torch.full((1,), value), epoch)
    template = run.checkpoints / "best-epoch001-step20.ckpt"
    torch.save({"epoch": 1, "global_step": 20, "recogniser": {"kind": "ctc"},
                "state_dict": {"layer.weight": torch.zeros(1, 2), "layer.bias": torch.zeros(1),
                               "bn.num_batches_tracked": torch.tensor(0)}}, template)
    path, used = write_averaged_checkpoint(template, best=2)
    assert path == run.checkpoints / "averaged.ckpt" and [p.name[:8] for p in used] == ["epoch001", "epoch002"]
    written = torch.load(path, weights_only=True)
    assert torch.equal(written["state_dict"]["layer.weight"], torch.full((1, 2), 4.0))  # (2 + 6) / 2
    assert written["global_step"] == 20 and written["recogniser"] == {"kind": "ctc"}
    assert run.latest_checkpoint() is None  # never a checkpoint to resume from
    with caplog.at_level("INFO"):
        _, used = write_averaged_checkpoint(template, last=10)
    assert len(used) == 4 and "10 epoch checkpoints wanted, 4 written" in caplog.text
    assert write_averaged_checkpoint(template) is None
    for f in run.checkpoints.glob("epoch*.ckpt"):
        f.unlink()
    assert write_averaged_checkpoint(template, best=2) is None  # no epochs: the template as it is
