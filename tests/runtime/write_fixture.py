"""Write what tests/runtime/test_runtime_no_torch.py checks in an environment without PyTorch:
``python tests/runtime/write_fixture.py OUT`` (``make test-runtime`` runs it with the full install).

OUT gets ``model/`` (``export_recogniser``'s folder of a tiny untrained phoneme model with the
units, lexicon and LM of a tiny synthesised corpus; fp32 and int8), ``audio/`` (two test utterances
and a 26-second recording of the corpus's utterances joined, which the runtime reads in windows)
and ``expected.json``: PyTorch's greedy transcription of each (``Recogniser.transcribe``), the
words the runtime must give without PyTorch.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: recogniser_fixtures

from recogniser_fixtures import tiny_recogniser  # noqa: E402

from fastasr.corpora.synthetic import build_corpus  # noqa: E402
from fastasr.data.manifest import read_manifest  # noqa: E402
from fastasr.deploy.export import export_recogniser  # noqa: E402

COUNTS = {"train": 10, "dev": 2, "test": 2}  # tests/conftest.py's tiny corpus


def write(out: Path) -> None:
    started = time.perf_counter()
    corpus = out / "corpus"
    build_corpus(corpus, seed=0, counts=COUNTS, workers=1)  # does nothing when it is there already
    audio = out / "audio"
    shutil.rmtree(audio, ignore_errors=True)
    audio.mkdir(parents=True)
    utterances = [corpus / u.audio_filepath for split in ("test", "dev") for u in read_manifest(corpus / f"{split}.jsonl")]
    for path in utterances[:2]:
        shutil.copy(path, audio / path.name)
    pieces, rate = [], 16000
    for path in utterances * 3:
        samples, rate = sf.read(str(path), dtype="float32")
        pieces += [samples, np.zeros(rate // 2, np.float32)]
    joined = np.concatenate(pieces)
    while joined.shape[0] < 26 * rate:
        joined = np.concatenate([joined, joined])
    sf.write(str(audio / "joined.wav"), joined[:26 * rate], rate)

    recogniser = tiny_recogniser(corpus, kind="phoneme")
    shutil.rmtree(out / "model", ignore_errors=True)
    export_recogniser(recogniser, out / "model", source="tests/runtime/write_fixture.py")
    paths = sorted(audio.iterdir())
    expected = {p.name: {"text": t.text, "units": t.units, "mode": t.mode}
                for p, t in zip(paths, recogniser.transcribe([str(p) for p in paths], decoding="greedy"))}
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n", encoding="utf-8")
    print(f"{out}\t{len(paths)} recordings, {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/runtime/write_fixture.py OUT")
    write(Path(sys.argv[1]))
