"""ThroughputLogger's step times: the host's clock on a CPU; on a GPU CUDA events read without
waiting for the device (a stand-in event here, on a timeline the test moves), each logged with
its own batch's sizes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fastasr.training.callbacks import throughput
from fastasr.training.callbacks.throughput import HOST_LENGTHS_KEY, ThroughputLogger
from fastasr.training.lit import HostLengths


class _Device:
    """A device timeline: events recorded in order get the times the test sets; ``now`` is how
    far the device has run."""

    def __init__(self, times):
        self.times, self.now, self.recorded = list(times), 0.0, 0

    def event(self):
        device = self

        class _Event:
            def record(self):
                self.at = device.times[device.recorded]
                device.recorded += 1

            def query(self):
                return self.at <= device.now

            def elapsed_time(self, end):  # milliseconds, as torch.cuda.Event's
                return (end.at - self.at) * 1000

        return _Event()


class _Module:
    device = torch.device("cuda")


class _Trainer:
    """What the logger reads of a trainer: its loggers, Lightning's logging cadence, the step."""

    current_epoch = 0

    def __init__(self):
        self.logged = []
        self.loggers = [SimpleNamespace(log_metrics=lambda metrics, step: self.logged.append((step, metrics)))]
        self._logger_connector = SimpleNamespace(should_update_logs=True)
        self.fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=0))


def _batch(frames):
    lengths = torch.tensor(frames)
    return {"feature_lengths": lengths, "ids": [str(i) for i in range(len(frames))],
            HOST_LENGTHS_KEY: HostLengths(lengths, lengths)}


def test_gpu_step_times_come_from_events_the_device_has_passed(monkeypatch):
    monkeypatch.setattr(throughput, "peak_memory_mb", lambda device: 7.0)
    # batch 0 on the device from 1.0 to 1.5 s, batch 1 from 1.75 to 2.75, batch 2 from 3.0 to 3.25
    device = _Device([1.0, 1.5, 1.75, 2.75, 3.0, 3.25])
    logger, module, trainer = ThroughputLogger(event=device.event), _Module(), _Trainer()
    logger.on_train_epoch_start(trainer, module)
    sizes = [[100, 50], [200, 200, 100], [40]]
    # how far the device has run when each batch's end is issued: not into batch 0 at its end;
    # past batch 0 at batch 1's end (logs batch 0); past batch 2 at its end (logs the latest, 2)
    for i, (frames, now) in enumerate(zip(sizes, [0.0, 1.6, 5.0])):
        logger.on_train_batch_start(trainer, module, _batch(frames), i)
        device.now = now
        logger.on_train_batch_end(trainer, module, None, _batch(frames), i)
        trainer.fit_loop.epoch_loop._batches_that_stepped += 1
    # at the steps Lightning logs batches 1 and 2's own metrics
    assert [step for step, _ in trainer.logged] == [1, 2]
    logged = [values for _, values in trainer.logged]
    keys = {"perf/batch_seconds", "perf/peak_memory_mb", "perf/frames_per_second", "perf/samples_per_second", "epoch"}
    assert [set(v) for v in logged] == [keys, keys | {"perf/data_seconds"}]
    first, last = logged
    assert first["perf/batch_seconds"] == pytest.approx(0.5)
    assert first["perf/frames_per_second"] == pytest.approx(150 / 0.5)
    assert first["perf/samples_per_second"] == pytest.approx(2 / 0.5)
    assert last["perf/batch_seconds"] == pytest.approx(0.25)
    assert last["perf/data_seconds"] == pytest.approx(0.25)  # batch 1's end (2.75) to batch 2's start (3.0)
    assert last["perf/frames_per_second"] == pytest.approx(40 / 0.25)
    assert device.recorded == 6


def test_synchronize_times_each_batch_by_the_host_clock(monkeypatch):
    monkeypatch.setattr(throughput, "peak_memory_mb", lambda device: 7.0)
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    clock = iter([10.0, 11.0, 13.0, 13.5, 14.0, 16.0])
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: next(clock))
    logger = ThroughputLogger(synchronize=True, event=lambda: pytest.fail("no events when synchronising"))
    module, trainer = _Module(), _Trainer()
    logger.on_train_epoch_start(trainer, module)  # 10.0
    for i, frames in enumerate([[100, 50], [40]]):
        logger.on_train_batch_start(trainer, module, _batch(frames), i)  # 11.0, 13.5
        logger.on_train_batch_end(trainer, module, None, _batch(frames), i)  # 13.0, 14.0
    assert len(syncs) == 4
    logged = [values for _, values in trainer.logged]
    assert [v["perf/batch_seconds"] for v in logged] == [2.0, 0.5]
    assert logged[1]["perf/data_seconds"] == 0.5
    assert logged[1]["perf/frames_per_second"] == 80.0


def test_off_lightnings_logging_steps_nothing_is_logged(monkeypatch):
    monkeypatch.setattr(throughput, "peak_memory_mb", lambda device: 7.0)
    logger, module, trainer = ThroughputLogger(synchronize=True), _Module(), _Trainer()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    trainer._logger_connector.should_update_logs = False
    logger.on_train_epoch_start(trainer, module)
    logger.on_train_batch_start(trainer, module, _batch([10]), 0)
    logger.on_train_batch_end(trainer, module, None, _batch([10]), 0)
    assert trainer.logged == []
