"""The models of the matrix: one per train spec, composed and trained exactly as
``python train.py experiment=<matrix.experiment> member=<spec> ...`` would.

A member's run directory is ``${matrix_dir}/runs/<spec>`` for single runs and for Hydra
multirun jobs alike (``conf/experiment/matrix_member_base.yaml``), so models trained
anywhere are found and reused here.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from fastasr.rundir import RunDir
from fastasr.studies.matrix.rules import MatrixError, train_member
from fastasr.training.derived_config import resolve_train_config
from fastasr.training.fit import train
from fastasr.training.loggers import finish_wandb

log = logging.getLogger(__name__)

# What makes two trainings "the same model" for reuse: its architecture and what it learnt from.
IDENTITY_KEYS = ("model", "data.train_manifest", "data.tokenizer", "data.features")
# Keys of those sections that say how a config is built, not what is built (conf/model's
# `_partial_: true`, absent from configs saved before the model config was a Hydra partial).
_BUILD_KEYS = ("model._partial_",)


@dataclass
class Member:
    """One trained model of the matrix: its train spec, config and run directory."""

    spec: str
    attention: str
    shared_qk: bool
    overrides: list[str]
    cfg: DictConfig
    run_dir: Path

    @property
    def command(self) -> str:
        """The train.py command that trains this member on its own (same run directory)."""
        return "python train.py " + " ".join(shlex.quote(o) for o in self.overrides)

    def finished(self) -> dict[str, Any] | None:
        """The ``fit_done.json`` record when training is complete for the configured budget."""
        done = RunDir(self.run_dir).read_fit_done()
        if done is None:
            return None
        wanted = self.cfg.trainer.get("max_epochs")
        if wanted is not None and done.get("max_epochs") is not None and int(done["max_epochs"]) < int(wanted):
            return None  # asked for more epochs than it has: continue training
        return done

    def checkpoint(self, done: Mapping[str, Any]) -> Path:
        """The checkpoint the matrix decodes: the best by validation error, else the last."""
        return RunDir(self.run_dir).finished_checkpoint(done)

    def check_saved_config(self) -> None:
        """Refuse to reuse/resume a run directory trained with a different model config."""
        saved_file = self.run_dir / "config.yaml"
        if not saved_file.is_file():
            return
        saved = OmegaConf.to_container(OmegaConf.load(saved_file), resolve=False)
        wanted = OmegaConf.to_container(self.cfg, resolve=True)
        diffs = []
        for key in IDENTITY_KEYS:
            diffs += [d for d in _diff(_select(saved, key), _select(wanted, key), key)
                      if d.split(":", 1)[0] not in _BUILD_KEYS]
        if diffs:
            raise MatrixError(
                f"{self.run_dir} was trained with another config ({'; '.join(diffs[:5])}); "
                "delete that run directory or give this matrix another matrix.name"
            )


def _select(cfg: Mapping[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _diff(a: Any, b: Any, prefix: str = "model") -> list[str]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            out += _diff(a.get(key), b.get(key), f"{prefix}.{key}")
        return out
    return [] if a == b else [f"{prefix}: {a!r} there, {b!r} here"]


def member_overrides(cfg: DictConfig, spec: str) -> list[str]:
    """The train.py overrides of the member trained with ``spec`` (see conf/cross_eval.yaml)."""
    m = cfg.matrix
    overrides = [
        f"experiment={m.experiment}",
        f"member={spec}",
        f"matrix_name={m.name}",
        f"paths.output_dir={cfg.paths.output_dir}",
    ]
    if m.get("data"):
        overrides.append(f"data={m.data}")
    if m.get("max_epochs") is not None:
        overrides.append(f"trainer.max_epochs={m.max_epochs}")
    overrides += [str(o) for o in (m.get("overrides") or [])]
    overrides += [str(o) for o in (m.get("extra_overrides") or [])]
    return overrides


def compose_member(cfg: DictConfig, spec: str) -> Member:
    """Compose train.yaml for one member with Hydra, its derived values filled in
    (:func:`fastasr.training.derived_config.resolve_train_config`): the config ``train.py`` would run.

    ``cfg`` is the composed ``cross_eval`` config; Hydra must be initialised with the
    project's config directory. Raises :class:`MatrixError` when the experiment does not
    give the member the run directory, attention or Q/K sharing the matrix expects.
    """
    attention, shared_qk = train_member(spec)
    overrides = member_overrides(cfg, spec)
    composed = resolve_train_config(hydra.compose(config_name="train", overrides=overrides))
    run_dir = Path(composed.paths.run_dir)
    expected = Path(cfg.matrix_dir) / "runs" / spec
    if run_dir.resolve() != expected.resolve():
        raise MatrixError(
            f"member {spec}: experiment={cfg.matrix.experiment} puts its run in {run_dir}, "
            f"expected {expected}; set paths.run_dir: ${{paths.output_dir}}/matrix/${{matrix_name}}/runs/${{member}}"
        )
    rule = ("leave attention and model.shared_qk to the member's spec (experiment=matrix_member_base: "
            "fastasr.training.derived_config sets them from `member`)")
    if composed.model.get("shared_qk") != shared_qk:
        raise MatrixError(f"member {spec}: model.shared_qk={composed.model.shared_qk}, expected {shared_qk}; {rule}")
    if str(composed.model.get("attention")) != attention:
        raise MatrixError(f"member {spec}: model.attention={composed.model.attention}, expected {attention}; {rule}")
    return Member(spec, attention, shared_qk, overrides, composed, run_dir)


def train_member_model(member: Member) -> dict[str, Any]:
    """Train (or resume) a member in-process in its run directory; returns its
    ``fit_done.json`` record."""

    member.check_saved_config()
    log.info("training %s in %s\n    %s", member.spec, member.run_dir, member.command)
    try:
        train(member.cfg, run_dir=member.run_dir)
    finally:
        finish_wandb()
    done = RunDir(member.run_dir).read_fit_done()
    if done is None:
        raise MatrixError(
            f"{member.run_dir}: training returned but wrote no fit_done.json; "
            "is fastasr.training.callbacks.FitCompletionMarker in the callbacks config?"
        )
    return done
