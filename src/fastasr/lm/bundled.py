"""The word LM a recogniser carries: the ARPA text itself when it is small, else its path and hash.

Training writes the word n-gram LM that beam search + LM decodes with (``conf/decoding/beam_lm.yaml``;
by default ``lm/words-3gram.arpa`` beside the training manifest, built by :func:`ensure_corpus_lm`
when it does not exist) into the recogniser (``fastasr.recognition.recogniser``), so that a checkpoint decodes
with the LM it was trained beside wherever it is copied:

* an LM of at most :data:`EMBED_LIMIT_BYTES` (20 MiB) is embedded: its ARPA text travels in
  every checkpoint (the built-in corpus's word 3-gram is about 2 MiB);
* a larger one (or a KenLM binary file) is referenced by its absolute path, size and SHA-256:
  decoding reads the file there and refuses, naming the path, when it is missing or its
  content has changed since training.

The limit keeps checkpoints small: the LM is repeated in every checkpoint of a run (last, best,
step and the per-epoch weights), and 20 MiB is about the size of a paper-sized model's weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastasr.lm.arpa import corpus_lm_path
from fastasr.lm.build import build

log = logging.getLogger(__name__)

EMBED_LIMIT_BYTES = 20 * 2**20  # ARPA files up to this size are embedded in the recogniser
_ARPA_HEADER = "\\data\\"


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class BundledLM:
    """A word n-gram LM as a recogniser carries it.

    Attributes:
        path: the absolute path the LM was read from at training time.
        sha256: the SHA-256 of its bytes.
        size: its size in bytes.
        arpa: its ARPA text when embedded (at most :data:`EMBED_LIMIT_BYTES`), else None: the
            file at ``path`` is read when decoding, and must still have the hash ``sha256``.
    """

    path: str
    sha256: str
    size: int
    arpa: str | None = None

    @property
    def embedded(self) -> bool:
        return self.arpa is not None

    @classmethod
    def from_file(cls, path: str | os.PathLike, embed_limit: int = EMBED_LIMIT_BYTES) -> BundledLM:
        """Read an ARPA (or KenLM binary) file: embedded when it is ARPA text of at most
        ``embed_limit`` bytes, else referenced by path and hash."""
        path = Path(path).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"word LM {path}: no such file")
        size = path.stat().st_size
        arpa = None
        if size <= embed_limit:
            data = path.read_bytes()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:  # a KenLM binary file: referenced, not embedded
                text = None
            if text is not None and text.lstrip().startswith(_ARPA_HEADER):
                arpa = text
            sha256 = hashlib.sha256(data).hexdigest()
        else:
            sha256 = file_sha256(path)
        return cls(str(path), sha256, size, arpa)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (``checkpoint["recogniser"]["lm"]``)."""
        return {"path": self.path, "sha256": self.sha256, "size": self.size, "arpa": self.arpa}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any], source: str = "recogniser") -> BundledLM:
        """Inverse of :meth:`to_dict`; errors name ``source`` (e.g. the checkpoint)."""
        try:
            lm = cls(str(state["path"]), str(state["sha256"]), int(state["size"]), state.get("arpa"))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{source}: bad word LM entry ({err}); expected path, sha256, size and arpa") from None
        if lm.arpa is not None and not isinstance(lm.arpa, str):
            raise ValueError(f"{source}: word LM entry's arpa is {type(lm.arpa).__name__}; expected text or null")
        return lm

    def describe(self) -> dict[str, Any]:
        """Its identity, for results.json (the text left out)."""
        return {"path": self.path, "sha256": self.sha256, "size": self.size, "embedded": self.embedded}

    def check_file(self) -> Path:
        """The referenced file at :attr:`path`, after checking that it is there with the
        content it had at training time; a ``FileNotFoundError`` / ``ValueError`` naming the
        path and what to do otherwise."""
        path = Path(self.path)
        if not path.is_file():
            raise FileNotFoundError(
                f"word LM {path}: no such file. The recogniser refers to it by path (it was "
                f"{self.size / 2**20:.1f} MiB, too large to embed in the checkpoint): put the same file there, "
                "or decode with decoding.lm.path=FILE (another LM) or decoding.lm.source=none (no LM)")
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        digest = _HASHES.get(key)
        if digest is None:
            digest = _HASHES[key] = file_sha256(path)
        if digest != self.sha256:
            raise ValueError(
                f"word LM {path} has changed since the model was trained: sha256 {digest[:12]}… now, "
                f"{self.sha256[:12]}… in the recogniser. Restore the file, or decode with "
                f"decoding.lm.path={path} to use it as it is now")
        return path

    @contextlib.contextmanager
    def file(self) -> Iterator[Path]:
        """A path to read the LM from, valid inside the ``with`` block: the embedded text written
        to a temporary file, or the checked referenced file (:meth:`check_file`)."""
        if self.arpa is None:
            yield self.check_file()
            return
        with tempfile.TemporaryDirectory(prefix="fastasr-lm-") as tmp:
            path = Path(tmp) / Path(self.path).name
            path.write_bytes(self.arpa.encode("utf-8"))  # the exact bytes that were hashed
            yield path


_HASHES: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) -> sha256: hash a large file once


def ensure_corpus_lm(train_manifest: str | os.PathLike, fallback_dir: str | os.PathLike | None = None,
                     order: int = 3) -> Path:
    """The corpus's word LM, ``lm/words-<order>gram.arpa`` beside ``train_manifest``
    (:func:`fastasr.lm.corpus_lm_path`), estimated from the manifest's transcripts when it does
    not exist yet (as ``python -m fastasr.cli.lm build --manifest M`` does; seconds for a small corpus).

    The file is written atomically (concurrent DDP ranks write identical bytes); where the corpus
    directory is not writable it goes to ``fallback_dir/lm/`` instead (when given)."""
    target = corpus_lm_path(train_manifest, order)
    if target.is_file():
        return target
    candidates = [target] + ([Path(fallback_dir) / "lm" / target.name] if fallback_dir is not None else [])
    for out in candidates:
        if out.is_file():
            return out
        start = time.perf_counter()
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
            os.close(fd)
        except OSError as err:
            log.warning("cannot write the word LM to %s (%s)", out, err)
            continue
        try:
            info = build([train_manifest], tmp, order=order)
            os.replace(tmp, out)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        log.info("word %d-gram LM of %s: %s (%d sentences, %.1f s)", order, train_manifest, out,
                 info["sentences"], time.perf_counter() - start)
        return out
    raise OSError(f"word LM of {train_manifest}: none of {[str(c) for c in candidates]} can be written")
