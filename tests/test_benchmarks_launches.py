"""benchmarks/gpu/launches.py: the host's work for one encoder layer's training step, counted on
the CPU standing in for CUDA (the Triton kernels interpreted, in a child process so that
``TRITON_INTERPRET`` is set before Triton loads): every attention of the registry counted, its
counts sane, and no step that reads a device value back to the host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu import launches

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def counted(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("launches")
    env = {k: v for k, v in os.environ.items() if k != "FASTASR_KERNELS"}
    env.update(TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "src")]))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu.launches", "--device", "cpu", "--length", "16",
                           "--out-dir", str(out)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (path,) = out.glob("launches_*.json")
    assert path.with_suffix(".md").is_file()
    data = json.loads(path.read_text())
    return {"layers": {r["name"]: r for r in data["layers"]}, "layer_norms": {r["name"]: r for r in data["layer_norms"]}}


def _total(row: dict, phase: str, kind: str) -> int:
    return sum(row[phase][kind].values())


def test_every_attention_of_the_registry_is_a_row():
    from fastasr.attention import available, build_attention

    names = {build_attention(spec).name for spec in launches.DEFAULT_SPECS if spec != launches.FLOOR}
    assert names == set(available())


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the child's interpreted kernels (a minute or two on 2 idle cores)
def test_no_host_synchronisation_in_any_layers_training_step(counted):
    """The step training runs, for every attention: forward and backward read nothing back from
    the device (the CPU stand-in's own lengths check is set apart and named)."""
    for name, row in (counted["layers"] | counted["layer_norms"]).items():
        for phase in ("forward", "backward"):
            assert row[phase]["syncs"] == [], (name, phase, row[phase]["syncs"])
            assert all("(check_lengths)" in where for _, where in row[phase]["cpu_only"]), (name, row[phase])


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_counts_are_sane(counted):
    layers = counted["layers"]
    floor = layers[launches.FLOOR]
    for name, row in layers.items():
        for phase in ("forward", "backward"):
            assert 10 <= _total(row, phase, "aten") <= 2000, (name, phase)
        # an attention adds work to the layer without one
        launched = sum(_total(row, p, k) for p in ("forward", "backward") for k in ("aten", "triton"))
        assert launched >= sum(_total(floor, p, k) for p in ("forward", "backward") for k in ("aten", "triton")), name
    # the layer's two layer norms by the Triton kernels (their switch on, as on a GPU); the
    # switches that are off (bias gradients, GELU dropout) launch nothing
    assert layers["full"]["forward"]["triton"] == {"triton_layer_norm._forward_kernel": 2}
    assert layers["full"]["backward"]["triton"] == {"triton_layer_norm._backward_kernel": 2}
    assert layers["full, torch layer norm"]["forward"]["triton"] == {}
    assert "triton_kmeans._lloyd_kernel" in layers["i-clustered-100"]["forward"]["triton"]
    norms = counted["layer_norms"]
    assert norms["Triton layer norm"]["forward"]["triton"] == {"triton_layer_norm._forward_kernel": 1}
    assert norms["Triton layer norm"]["backward"]["triton"] == {"triton_layer_norm._backward_kernel": 1}
    assert norms["torch layer norm"]["forward"]["triton"] == {} and _total(norms["torch layer norm"], "forward", "aten") >= 1


def test_the_probe_tells_syncs_from_launches():
    """Views and allocations launch nothing; a read of a CPU tensor synchronises only where the
    CPU stands in for the device; ``repeat_interleave`` without ``output_size`` reads its
    repeats, with it does not."""
    x = torch.arange(6.0)
    for stand_in in (False, True):
        with launches.LaunchProbe(stand_in=stand_in) as probe:
            y = x.view(2, 3).transpose(0, 1)
            torch.empty(3)
            (y * 2).sum()
            float(x.sum())
            x.repeat_interleave(torch.tensor([1, 2, 0, 1, 1, 1]))
            x.repeat_interleave(torch.tensor([1, 2, 0, 1, 1, 1]), output_size=6)
        assert probe.aten.get("aten::mul") == 1 and "aten::view" not in probe.aten and "aten::empty" not in probe.aten
        want = ["aten::_local_scalar_dense", "aten::repeat_interleave"] if stand_in else []
        assert probe.syncs == want
