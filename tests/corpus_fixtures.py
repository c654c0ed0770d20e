"""Helpers that write tiny corpora in their native layouts (audio synthesised here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf


def tone(seconds: float, rate: int = 16000, freq: float = 440.0, amp: float = 0.3) -> np.ndarray:
    """A sine ``(T,)`` float32."""
    t = np.arange(int(round(seconds * rate))) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def write_sphere(path: Path, samples: np.ndarray, rate: int = 16000, utterance_id: str = "x") -> None:
    """A NIST SPHERE file as TIMIT ships it: a 1024-byte ASCII header, then little-endian
    16-bit PCM."""
    pcm = np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2")
    header = (
        "NIST_1A\n   1024\n"
        "database_id -s5 TIMIT\ndatabase_version -s3 1.0\n"
        f"utterance_id -s{len(utterance_id)} {utterance_id}\n"
        f"channel_count -i 1\nsample_count -i {pcm.shape[0]}\nsample_rate -i {rate}\n"
        f"sample_min -i {int(pcm.min())}\nsample_max -i {int(pcm.max())}\n"
        "sample_n_bytes -i 2\nsample_byte_format -s2 01\nsample_sig_bits -i 16\nend_head\n"
    ).encode("ascii")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header.ljust(1024, b" ") + pcm.tobytes())


def write_wav(path: Path, samples: np.ndarray, rate: int, **kw) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), samples, rate, **kw)
