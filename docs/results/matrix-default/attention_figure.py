"""Figure 8 for speech: the full-attention model of the default matrix, its longest dev utterance,
decoded with clustered-100 / i-clustered-100 beside its own full attention (makes the PNGs here).

    .venv/bin/python docs/results/matrix-default/attention_figure.py docs/results/matrix-default
    (after `make matrix`; prints the mean L1 distance to full attention per head)
"""

import json
import sys
from pathlib import Path

import matplotlib.image

from fastasr.data.features import Fbank
from fastasr.recognition.loading import load_recogniser
from fastasr.training.callbacks import AttentionMapLogger, mean_l1_distance, render_attention_maps

runs = Path("outputs/matrix/default/runs")
ckpt = sorted((runs / "full/checkpoints").glob("best-*.ckpt"))[0]
dev = [json.loads(line) for line in open("data/synthetic/dev.jsonl")]
utt = max(dev, key=lambda u: u["duration"])
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
for spec in ["clustered-100", "i-clustered-100"]:
    recogniser = load_recogniser(ckpt, spec)
    features = Fbank(recogniser.features).from_file(Path("data/synthetic") / utt["audio_filepath"])
    maps, heads, layer = AttentionMapLogger(heads=3).compute_maps(recogniser.model, features)
    (_, own), (_, full) = maps
    l1 = [round(mean_l1_distance(own[h], full[h]), 3) for h in range(len(heads))]
    title = f"{Path(utt['audio_filepath']).stem} ({features.shape[0]} frames) · model trained with full · layer {layer}"
    path = out / f"attention_full-model_{spec}.png"
    matplotlib.image.imsave(path, render_attention_maps(maps, heads, title, 3.2, 60))
    print(f"{spec}: L1 to full per head {l1} -> {path}")
