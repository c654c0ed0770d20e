"""An exported folder (:mod:`fastasr.deploy.export`) in sherpa-onnx's offline CTC recogniser, by
its public API alone.

The graph has the inputs and outputs of icefall's CTC export and reads sherpa-onnx's default
filterbank's scale (samples in [-1, 1]: :data:`fastasr.deploy.export.INPUT_SAMPLES`) and frame
grid (it drops the first frame, centred before training's first: :class:`fastasr.deploy.export.OnnxCTC`), so
``sherpa_onnx.OfflineRecognizer.from_zipformer_ctc`` loads it with only the sample rate and the
feature dimension given, as it loads icefall's models. :func:`sherpa_recognizer` reads those two
from ``recogniser.json``; a user without fastasr writes the same call (docs/DEPLOY.md).
sherpa-onnx decodes greedily; its text is the units with ``▁`` shown as a space
(:func:`fastasr.deploy.export.tokens_txt`): a char model's words, a phoneme model's phonemes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["sherpa_recognizer"]


def sherpa_recognizer(folder: str | os.PathLike, *, int8: bool = False, threads: int = 1) -> Any:
    """``sherpa_onnx.OfflineRecognizer.from_zipformer_ctc`` of the exported ``folder`` (``int8``:
    its int8 model), with sherpa-onnx's default features at the model's rate and dimension.
    Use: ``s = r.create_stream(); s.accept_waveform(rate, samples); r.decode_stream(s); s.result.text``."""
    import sherpa_onnx

    folder = Path(folder)
    features = json.loads((folder / "recogniser.json").read_text(encoding="utf-8"))["features"]
    return sherpa_onnx.OfflineRecognizer.from_zipformer_ctc(
        model=str(folder / ("model.int8.onnx" if int8 else "model.onnx")), tokens=str(folder / "tokens.txt"),
        num_threads=threads, sample_rate=int(features["sample_rate"]), feature_dim=int(features["num_mel_bins"]))
