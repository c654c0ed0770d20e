"""``train.py --help``, ``evaluate.py --help`` and ``fastasr-transcribe --help`` describe the command, list the config groups
with their options and the most used keys with a line each and this command's values
(conf/hydra/help/; issue #38)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fastasr.config import CONFIG_DIR, PROJECT_ROOT


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)

def _keys(help_text: str) -> list[str]:
    """The keys of the help's "Most used keys" section (the first word of each indented line)."""
    section = help_text.split("== Most used keys", 1)[1].split("\n\n", 2)[1]
    return [line.split()[0] for line in section.splitlines() if line.strip()]


@pytest.mark.parametrize("script, config, expected", [  # the page starts with the command's name
    ("train.py", "train", ["name", "ckpt_path", "attention", "model.layers", "optim.lr", "trainer.max_time",
                           "data.train_manifest", "data.dev_manifest", "data.test_manifest", "tokenizer"]),
    ("evaluate.py", "evaluate", ["ckpt_path", "data.test_manifest", "attention", "decoding", "progress"]),
    ("-m fastasr.cli.transcribe", "transcribe", ["ckpt_path", "audio", "decoding", "attention", "device",
                                              "long_form.mode", "output.srt"]),
])
def test_help_lists_the_groups_and_the_most_used_keys(script, config, expected):
    done = run(*script.split(), "attention=i_clustered", "--help")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "powered by Hydra" not in text  # not Hydra's stock page
    name = "fastasr-transcribe" if config == "transcribe" else script  # the console script's name
    assert text.startswith(f"{name}: ")
    listing = text.split("== Config groups", 1)[1].split("\n", 1)[1].split("== Most used keys")[0]
    groups = dict(line.split(": ", 1) for line in listing.splitlines() if ": " in line)
    assert "i_clustered" in groups["attention"].split(", ") and "beam_lm" in groups["decoding"].split(", ")
    keys = _keys(text)
    assert set(expected) <= set(keys), keys
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config, overrides=["attention=i_clustered", "decoding=beam_lm" if config != "train"
                                         else "final_decoding=beam_lm"])
    for key in keys:  # every key the page names is one of the config: a renamed key fails here
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        assert node is not None and leaf in list(node.keys()), key
    assert "???" in text  # what the ??? of the full config mean
    if script == "train.py":
        assert re.search(r"^  model.layers +encoder depth \(now: 4;", text, re.M)
        assert "(now: i-clustered)" in text  # values are this command's, overrides included
        assert "filled in at start" in text and "(now: builtin)" in text  # the recipe this command trains with
