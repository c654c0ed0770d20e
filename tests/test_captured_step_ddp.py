"""Captured training steps under DDP on the CPU: two gloo processes, Lightning's DDP strategy, the
stand-in graphs backend (:class:`fastasr.training.graph_backends.EagerGraphs`). The gradients'
all-reduce that DDP's backward hooks do in an eager step is the captured step's own
(:meth:`CapturedSteps.reduce_gradients`), and a NaN batch on one rank skips that update on every
rank, decided on the host in an eager step and on the device in a captured one: both train
alike, and the replicas stay identical."""

from __future__ import annotations

import os

import lightning as L
import torch
import torch.multiprocessing as mp
from run_probe import free_port
from test_captured_step import _batches, _lit, _Losses

from fastasr.distributed import average_gradients
from fastasr.training.callbacks.nonfinite_loss import NonFiniteLossGuard
from fastasr.training.captured_step import CapturedSteps
from fastasr.training.graph_backends import EagerGraphs

WORLD = 2


def _fit_ddp(lit, batches) -> list[float]:
    losses, guard = _Losses(), NonFiniteLossGuard()
    trainer = L.Trainer(accelerator="cpu", devices=WORLD, strategy="ddp", max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, gradient_clip_val=0.05, use_distributed_sampler=False,
                        callbacks=[losses, guard])
    trainer.fit(lit, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False))
    return losses.values()


def _worker(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(WORLD), RANK=str(rank),
                      LOCAL_RANK=str(rank), NODE_RANK="0")
    torch.set_num_threads(1)
    batches = _batches(steps=6, seed=rank)  # each rank its own data, the same shapes
    if rank == 0:  # a NaN batch on one rank: every rank skips that update
        batches[4]["features"] = batches[4]["features"] * float("nan")
    out = {}
    eager = _lit()
    out["eager"] = (_fit_ddp(eager, batches), [p.detach().clone() for p in eager.parameters()])
    captured = _lit(capture=True)
    captured.captured = CapturedSteps(captured.model, True, warmup=1, backend=EagerGraphs())
    out["captured"] = (_fit_ddp(captured, batches), [p.detach().clone() for p in captured.parameters()])
    out["summary"] = captured.captured.summary()
    # a parameter without a gradient on rank 1 contributes zeros and gets the average
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    if rank == 0:
        a.grad, b.grad = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 8.0], dtype=torch.float64)
    else:
        a.grad = torch.tensor([3.0, 2.0, 1.0])
    average_gradients([a, b], WORLD)
    out["averaged"] = (a.grad.clone(), b.grad.clone())
    results[rank] = out


def test_captured_steps_under_ddp_train_as_ddps_eager_steps():
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_worker, args=(free_port(), results), nprocs=WORLD, start_method="fork")
        results = dict(results)
    for rank in range(WORLD):
        (eager_losses, eager_params), (losses, params) = results[rank]["eager"], results[rank]["captured"]
        nan = [i for i, loss in enumerate(losses) if loss != loss]
        assert nan == ([4] if rank == 0 else [])  # rank 0's NaN batch; its update skipped on both ranks
        assert [x for i, x in enumerate(losses) if i not in nan] == [x for i, x in enumerate(eager_losses)
                                                                    if i not in nan]
        for a, b in zip(params, eager_params):
            assert torch.equal(a, b)
        summary = results[rank]["summary"]
        assert sorted(summary["captured"]) == [(2, 64, 20), (3, 40, 20)] and not summary["failed"]
        a, b = results[rank]["averaged"]
        assert torch.equal(a, torch.tensor([2.0, 2.0, 2.0]))
        assert torch.equal(b, torch.tensor([2.0, 4.0], dtype=torch.float64))
    assert results[0]["captured"][0] != results[1]["captured"][0]  # the ranks trained on different batches
    for a, b in zip(results[0]["captured"][1], results[1]["captured"][1]):
        assert torch.equal(a, b)  # the replicas stay identical
