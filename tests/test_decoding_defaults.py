"""Each decoding default has one value: the YAML of conf/decoding/ and the code agree."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from omegaconf import OmegaConf

from fastasr.decoding import parallel
from fastasr.decoding.beam import BeamSearchOptions
from fastasr.decoding.builder import DEFAULT_LEXICON_SOURCE, DEFAULT_LM_SOURCE
from fastasr.recognition.recogniser import DECODING_PRESETS

CONF = Path(__file__).resolve().parents[1] / "conf" / "decoding"


def _yaml(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))


def test_beam_yaml_states_every_search_option_at_the_dataclass_default():
    beam = _yaml("beam")
    options = {f.name: f.default for f in dataclasses.fields(BeamSearchOptions)}
    stated = {k: v for k, v in beam.items() if k in options}
    assert set(stated) == set(options), set(options) ^ set(stated)
    for key, default in options.items():
        value = stated[key]
        if isinstance(default, float) and math.isinf(default):
            assert math.isinf(value) and (value > 0) == (default > 0), key
        else:
            assert value == default, (key, value, default)
    assert set(beam) == set(options) | {"name", "lexicon", "lm", "workers"}  # nothing unknown to the code
    assert beam["workers"] == parallel.AUTO  # as build_decoder's default (the Python presets)


def test_lexicon_and_lm_sources_agree_with_the_builder_and_the_presets():
    beam, beam_lm, greedy = _yaml("beam"), _yaml("beam_lm"), _yaml("greedy")
    assert beam["lexicon"] == {"source": DEFAULT_LEXICON_SOURCE, "path": None}
    assert greedy["lexicon"] == {"source": DEFAULT_LEXICON_SOURCE, "path": None}
    assert beam["lm"] == {"source": DEFAULT_LM_SOURCE, "path": None}
    # the Python presets (rec.transcribe(decoding="beam_lm")) are the YAML's names and sources
    assert DECODING_PRESETS["beam"] == {"name": beam["name"]}
    assert DECODING_PRESETS["greedy"] == {"name": greedy["name"]}
    assert DECODING_PRESETS["beam_lm"] == {"name": beam["name"], "lm": {"source": beam_lm["lm"]["source"]}}
    assert beam_lm["lm"]["path"] is None
