"""The PyTorch-free runtime as a user installs it: the ``fastasr-runtime`` distribution
(``runtime/pyproject.toml``) in an environment without torch, transcribing a folder the full
install exported (docs/DEPLOY.md, "Without PyTorch").

``make test-runtime`` (and CI, ``.ci/run``) writes the folder with the full install
(``tests/runtime/write_fixture.py``), creates a venv, installs ``./runtime`` and pytest there, and
runs this file with ``FASTASR_RUNTIME_FIXTURE`` naming the folder. Without that variable (the full
suite, ``make test``) the tests are skipped: they are about an environment the full suite is not.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = os.environ.get("FASTASR_RUNTIME_FIXTURE")
pytestmark = pytest.mark.skipif(not FIXTURE, reason="the PyTorch-free runtime's install: make test-runtime runs "
                                                    "it in a venv without torch (FASTASR_RUNTIME_FIXTURE)")
#: What the runtime must work without; none is installed in its environment.
HEAVY = ("torch", "torchaudio", "lightning", "pytorch_lightning", "hydra", "omegaconf")
REPO_SRC = Path(__file__).resolve().parents[2] / "src"


def fixture() -> Path:
    return Path(FIXTURE).resolve()


def expected() -> dict:
    return json.loads((fixture() / "expected.json").read_text(encoding="utf-8"))


def command() -> str:
    """The console script pip installed beside this interpreter."""
    path = Path(sys.executable).parent / "fastasr-onnx-transcribe"
    assert path.is_file(), f"{path}: pip install ./runtime installs the command"
    return str(path)


def test_the_environment_has_the_runtime_and_no_torch():
    """torch, torchaudio, Lightning, Hydra and OmegaConf are not installed; fastasr is the installed
    fastasr-runtime distribution (not the checkout's src/, not the full fastasr)."""
    assert [m for m in HEAVY if importlib.util.find_spec(m) is not None] == []
    with pytest.raises(ModuleNotFoundError):
        import torch  # noqa: F401
    import fastasr

    assert importlib.metadata.version("fastasr-runtime") == fastasr.__version__
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("fastasr")
    assert REPO_SRC not in Path(fastasr.__file__).resolve().parents


def test_the_runtime_gives_pytorchs_greedy_words():
    """Each recording (two utterances and a 26-second one read in windows): the units and words
    PyTorch's Recogniser.transcribe gave with greedy decoding; the int8 model runs too."""
    from fastasr.onnx.onnx_recogniser import OnnxRecogniser

    want = expected()
    audio = sorted((fixture() / "audio").iterdir())
    assert [p.name for p in audio] == sorted(want)
    got = list(OnnxRecogniser.load(fixture() / "model").transcribe(audio))
    for path, t in zip(audio, got):
        assert t.ok and t.units == want[path.name]["units"] and t.text == want[path.name]["text"], path.name
        assert t.mode == want[path.name]["mode"]
    assert sum(len(t.units) for t in got) > 20  # an untrained model still says something
    int8 = list(OnnxRecogniser.load(fixture() / "model", int8=True).transcribe(audio[-1:]))[0]
    assert int8.ok and int8.duration == got[-1].duration


def test_greedy_decoding_imports_no_flashlight_or_omegaconf():
    """A fresh interpreter: loading the folder and decoding greedily imports neither the beam
    search's flashlight-text nor anything of the training stack."""
    code = ("import sys; from fastasr.onnx.onnx_recogniser import OnnxRecogniser; import fastasr.onnx.transcribe; "
            f"r = OnnxRecogniser.load({str(fixture() / 'model')!r}); "
            f"t = list(r.transcribe([{str(sorted((fixture() / 'audio').iterdir())[0])!r}]))[0]; assert t.ok; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'flashlight', 'omegaconf', 'torch', 'yaml'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_the_command_transcribes(tmp_path):
    """``fastasr-onnx-transcribe model_dir=... audio=DIR out=...``: ``path<TAB>text`` per recording
    (PyTorch's words), the JSON lines, and the closing line."""
    done = subprocess.run([command(), f"model_dir={fixture() / 'model'}", f"audio={fixture() / 'audio'}",
                           f"out={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    want = expected()
    audio = sorted((fixture() / "audio").iterdir())
    assert done.stdout == "".join(f"{p}\t{want[p.name]['text']}\n" for p in audio)
    assert f"{len(audio)} of {len(audio)} input(s) transcribed" in done.stderr
    lines = (tmp_path / "transcripts.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["units"].split() for line in lines] == [want[p.name]["units"] for p in audio]


def test_the_beam_search_without_flashlight_is_one_line():
    """decoding=beam_lm where flashlight-text is not installed (``fastasr-runtime[beam]`` adds it):
    exit status 2 and one line naming the extra."""
    if importlib.util.find_spec("flashlight") is not None:
        pytest.skip("flashlight-text is installed here (fastasr-runtime[beam])")
    done = subprocess.run([command(), f"model_dir={fixture() / 'model'}", f"audio={fixture() / 'audio'}",
                           "decoding=beam_lm"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert "fastasr-runtime[beam]" in done.stderr
