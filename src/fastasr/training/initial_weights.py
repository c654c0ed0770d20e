"""Starting a run from a trained model's weights: ``python train.py ... init_from=CKPT`` (fine-tuning).

:func:`load_initial_weights` copies the front end and the encoder of any fastasr checkpoint into a
new run's model before its first update, and says what it did in an :class:`InitialWeights`
report that the run's first lines print:

* **the front end and the encoder** are loaded whole. Their shapes follow from the model's width,
  heads, feed-forward size, depth, convolution kernel, subsampling, Q/K sharing and the filterbank
  bins: where one differs, nothing is loaded and one line names both values
  (``init_from=base.ckpt: the checkpoint's model.layers is 6, this run's 4; ...``);
* **the output layer** (``head``) is loaded when the units are the checkpoint's. Units of the same
  kind with another vocabulary (a char model on a corpus with an apostrophe the base model never
  saw) keep the rows of the units both have, the blank included, and start the others fresh;
  units of another kind (phonemes -> chars, chars -> BPE) get a new output layer;
* **the CMVN statistics** are the new corpus's, as the training data computed them;
* **the attention** is the run's (``attention=...``): every variant is parameter-free, so a model
  trained with full attention fine-tunes with clustered and back.

Dropout, SpecAugment, the schedule and every other setting are the run's own; a resumed run
(``ckpt_path=auto`` finding ``last.ckpt``) continues from its own checkpoint and ignores
``init_from``. :class:`fastasr.training.callbacks.FreezeLoaded` keeps the loaded part fixed for
the first updates, so that a new output layer learns first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fastasr.data.tokenizer import Tokenizer
from fastasr.model import CTCModel
from fastasr.recognition.loading import read_checkpoint
from fastasr.recognition.recogniser import Recogniser
from fastasr.training.derived_config import ConfigError

#: Model settings that fix the shapes of the front end's and the encoder's parameters (with the
#: filterbank bins): a checkpoint whose value differs cannot be loaded.
SHAPE_KEYS = ("d_model", "heads", "ff_dim", "layers", "conv_kernel", "subsampling", "shared_qk", "positions")
#: Parameters that are never loaded: the corpus's own feature statistics.
CORPUS_STATISTICS = ("cmvn.",)
HEAD = "head."
#: The parameters :class:`fastasr.training.callbacks.FreezeLoaded` can hold fixed: everything
#: below the output layer.
LOADED_PARTS = ("frontend.", "encoder.")


class InitialWeightsError(ConfigError):
    """A checkpoint that cannot initialise this run's model; the message is one line (the training
    command prints it and exits with status 2, as for every config error)."""


@dataclass
class InitialWeights:
    """What :func:`load_initial_weights` did.

    Attributes:
        ckpt: the checkpoint read.
        loaded: the names of the parameters copied from it.
        new: ``name -> why`` for the parameters left as the run initialised them.
        head: how the output layer was treated: ``loaded``, ``partial`` (rows of the shared
            units) or ``new``.
        shared_units: the units whose output rows were copied (``partial`` and ``loaded``).
    """

    ckpt: str
    loaded: list[str] = field(default_factory=list)
    new: dict[str, str] = field(default_factory=dict)
    head: str = "new"
    shared_units: int = 0

    def summary(self) -> list[str]:
        """The lines the run's log starts with: what was loaded, what is new, and why."""
        groups: dict[str, int] = {}
        for name in self.loaded:
            groups[name.split(".")[0]] = groups.get(name.split(".")[0], 0) + 1
        parts = ", ".join(f"{part} ({count} tensors)" for part, count in groups.items())
        lines = [f"init_from={self.ckpt}: loaded {len(self.loaded)} tensors: {parts}"]
        reasons: dict[str, list[str]] = {}
        for name, why in self.new.items():
            reasons.setdefault(why, []).append(name)
        for why, names in reasons.items():
            lines.append(f"init_from: new {', '.join(names)}: {why}")
        return lines


def _read(ckpt: str | os.PathLike) -> tuple[Recogniser, dict[str, torch.Tensor]]:
    path = Path(ckpt)
    if not path.is_file():
        raise InitialWeightsError(f"init_from={ckpt}: no such checkpoint file")
    recogniser, weights = read_checkpoint(path)
    if not weights:
        raise InitialWeightsError(f"init_from={ckpt}: the checkpoint holds no model weights (state_dict 'model.*')")
    return recogniser, weights


def shape_mismatches(theirs: Recogniser, model_config: Mapping[str, Any], feat_in: int) -> list[str]:
    """``"<key> is <theirs>, this run's <ours>"`` for each shape-fixing setting that differs."""
    out = []
    for key in SHAPE_KEYS:
        a, b = theirs.model_config.get(key), model_config.get(key)
        if a != b:
            out.append(f"model.{key} is {a}, this run's {b}")
    if theirs.feat_in != feat_in:
        out.append(f"features.num_mel_bins is {theirs.feat_in}, this run's {feat_in}")
    return out


def _head_rows(theirs: Tokenizer, ours: Tokenizer) -> list[tuple[int, int]]:
    """``(our row, their row)`` for each unit both vocabularies have (same kind only)."""
    if theirs.kind != ours.kind:
        return []
    index = {unit: i for i, unit in enumerate(theirs.vocab)}
    return [(i, index[unit]) for i, unit in enumerate(ours.vocab) if unit in index]


@torch.no_grad()
def load_initial_weights(model: CTCModel, recogniser: Recogniser, ckpt: str | os.PathLike) -> InitialWeights:
    """Copy ``ckpt``'s front end, encoder and (where the units allow) output layer into ``model``,
    the run's freshly built model of ``recogniser`` (module docstring); its CMVN is left as set.

    Raises:
        InitialWeightsError: no such file, no weights, or a shape-fixing setting that differs
            (one line naming the checkpoint's and the run's value of each).
    """
    theirs, weights = _read(ckpt)
    mismatches = shape_mismatches(theirs, recogniser.model_config, recogniser.feat_in)
    if mismatches:
        raise InitialWeightsError(f"init_from={ckpt}: cannot load: the checkpoint's " + "; ".join(mismatches))
    report = InitialWeights(ckpt=str(ckpt))
    ours = model.state_dict()
    rows = _head_rows(theirs.tokenizer, recogniser.tokenizer)
    same_units = theirs.tokenizer.kind == recogniser.tokenizer.kind and theirs.tokenizer.vocab == recogniser.tokenizer.vocab
    for name, tensor in ours.items():
        if name.startswith(CORPUS_STATISTICS):
            report.new[name] = "this corpus's feature statistics"
            continue
        if name.startswith(HEAD) and not same_units:
            if rows:
                source = weights[name]
                for mine, other in rows:
                    tensor[mine] = source[other].to(tensor.dtype)
                report.new[name] = (f"{len(rows)} of {len(recogniser.tokenizer.vocab)} units' rows from the checkpoint, "
                                    f"the rest new (the checkpoint's {theirs.tokenizer.kind} vocabulary has "
                                    f"{len(theirs.tokenizer.vocab)} units)")
            else:
                report.new[name] = (f"other units: the checkpoint's are {theirs.tokenizer.kind} "
                                    f"({len(theirs.tokenizer.vocab)}), this run's {recogniser.tokenizer.kind} "
                                    f"({len(recogniser.tokenizer.vocab)})")
            continue
        if name not in weights:
            raise InitialWeightsError(f"init_from={ckpt}: cannot load: the checkpoint has no {name} "
                                      f"(this run's model has it, {tuple(tensor.shape)})")
        if weights[name].shape != tensor.shape:
            raise InitialWeightsError(f"init_from={ckpt}: cannot load: {name} is {tuple(weights[name].shape)} "
                                      f"in the checkpoint, {tuple(tensor.shape)} in this run's model")
        tensor.copy_(weights[name])
        report.loaded.append(name)
    report.head = "loaded" if same_units else ("partial" if rows else "new")
    report.shared_units = len(recogniser.tokenizer.vocab) if same_units else len(rows)
    model.load_state_dict(ours)
    return report
