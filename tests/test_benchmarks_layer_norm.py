"""benchmarks/step/layer_norm_gpu.py without a GPU: its arguments checked before anything is timed, and
a clear exit where no CUDA device is visible."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "benchmarks.step.layer_norm_gpu", *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=ROOT)


@pytest.mark.parametrize("tile,expected", [("8:8", "expected ROWS:WARPS:PROGRAMS"),
                                           ("3:1:16", "expected powers of two for ROWS and WARPS")])
def test_layer_norm_bench_names_a_bad_tile(tile, expected):
    proc = _run("--tiles", tile)
    assert proc.returncode != 0
    assert f"--tiles: {tile!r}; {expected}" in proc.stderr


def test_layer_norm_bench_exits_clearly_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the script would time it")
    proc = _run("--tiles", "1:1:32")
    assert proc.returncode != 0 and "no CUDA device here" in proc.stderr
