"""An exported folder (:mod:`fastasr.deploy.export`) in sherpa-onnx's offline CTC recogniser.

The graph has the inputs and outputs of icefall's CTC export, so sherpa-onnx loads it as a
``zipformer_ctc`` model; :func:`sherpa_recognizer` sets sherpa-onnx's filterbank to training's
(Kaldi's with edges snipped, the Nyquist frequency as the top, int16-scaled samples, no dither:
``fastasr.data.features.Fbank``), which its ``from_zipformer_ctc`` shortcut does not expose.
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
    """A ``sherpa_onnx.OfflineRecognizer`` of the exported ``folder`` (``int8``: its int8 model).
    Use: ``s = r.create_stream(); s.accept_waveform(rate, samples); r.decode_stream(s); s.result.text``."""
    from sherpa_onnx.offline_recognizer import (
        FeatureExtractorConfig,
        OfflineModelConfig,
        OfflineRecognizer,
        OfflineRecognizerConfig,
        OfflineZipformerCtcModelConfig,
        _Recognizer,
    )

    folder = Path(folder)
    features = json.loads((folder / "recogniser.json").read_text(encoding="utf-8"))["features"]
    model = folder / ("model.int8.onnx" if int8 else "model.onnx")
    config = OfflineRecognizerConfig(
        feat_config=FeatureExtractorConfig(
            sampling_rate=int(features["sample_rate"]), feature_dim=int(features["num_mel_bins"]), low_freq=20,
            high_freq=0, dither=0.0, normalize_samples=False, snip_edges=True),
        model_config=OfflineModelConfig(zipformer_ctc=OfflineZipformerCtcModelConfig(model=str(model)),
                                        tokens=str(folder / "tokens.txt"), num_threads=threads),
        decoding_method="greedy_search",
    )
    recognizer = OfflineRecognizer.__new__(OfflineRecognizer)  # as from_zipformer_ctc builds it, with our features
    recognizer.recognizer, recognizer.config = _Recognizer(config), config
    return recognizer
