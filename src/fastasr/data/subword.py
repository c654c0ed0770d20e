"""Subword units (BPE or unigram) learnt with sentencepiece from the training transcripts.

The model is trained in memory at setup and kept as its serialised protobuf bytes, which
the tokenizer stores base64-encoded in its state, so a checkpoint stays self-contained.
Training is deterministic (one thread, every sentence used).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable

import sentencepiece as spm

WORD_START = "\u2581"  # "▁": sentencepiece's mark of a piece that starts a word
UNK = "<unk>"


def train_model(texts: Iterable[str], model_type: str, vocab_size: int) -> bytes:
    """Learn a ``bpe`` or ``unigram`` model of at most ``vocab_size`` units — its pieces,
    ``<unk>`` included, plus the CTC blank that the tokenizer puts first — from
    normalised transcripts; returns the serialised model. Every character of the
    transcripts is covered. A vocabulary larger than the text supports is capped
    (sentencepiece's soft limit), not an error."""
    if model_type not in ("bpe", "unigram"):
        raise ValueError(f"subword model type {model_type!r}; expected 'bpe' or 'unigram'")
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError("no training transcripts to learn subword units from")
    chars = {c for t in texts for c in t if not c.isspace()}
    if vocab_size < len(chars) + 3:
        raise ValueError(f"vocab_size {vocab_size}; expected more than the {len(chars)} characters of the "
                         f"training transcripts + <unk> + the CTC blank (≥ {len(chars) + 3})")
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=out, model_type=model_type, vocab_size=int(vocab_size) - 1,
        character_coverage=1.0, hard_vocab_limit=False, unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1,
        num_threads=1, shuffle_input_sentence=False, split_digits=False, minloglevel=2,
    )
    return out.getvalue()


def load_model(model: bytes) -> spm.SentencePieceProcessor:
    """A processor from serialised model bytes."""
    return spm.SentencePieceProcessor(model_proto=model)


def pieces(processor: spm.SentencePieceProcessor) -> list[str]:
    """All pieces in id order (``<unk>`` first)."""
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def to_text(model: bytes) -> str:
    """Model bytes → base64 string (for JSON-able checkpoint state)."""
    return base64.b64encode(model).decode("ascii")


def from_text(text: str) -> bytes:
    """Inverse of :func:`to_text`."""
    return base64.b64decode(text.encode("ascii"))
