"""benchmarks/cpu_half_attention.py: full attention's bfloat16 kernel against float32 on a CPU."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cpu_half_attention  # noqa: E402

from fastasr.attention.full import CPU_HALF_IN_FLOAT32_BELOW  # noqa: E402


def test_cpu_half_attention_times_both_precisions_and_names_the_one_fastasr_takes(tmp_path):
    short, long = CPU_HALF_IN_FLOAT32_BELOW // 16, CPU_HALF_IN_FLOAT32_BELOW
    cpu_half_attention.main(["--ns", str(short), str(long), "--tokens", str(2 * long), "--heads", "2",
                             "--dim", "8", "--rounds", "2", "--out-dir", str(tmp_path)])
    (md,) = tmp_path.glob("cpu_half_attention_*.md")
    rows = [line for line in md.read_text().splitlines() if line.startswith(f"| {short} (") or
            line.startswith(f"| {long} (")]
    assert rows[0].startswith(f"| {short} (32) |") and rows[0].endswith("| float32 |")
    assert rows[1].startswith(f"| {long} (2) |") and rows[1].endswith("| bfloat16 |")
