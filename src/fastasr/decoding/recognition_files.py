"""Per-utterance results a researcher can read, beside results.json (as icefall's
``recogs-*.txt`` / ``errs-*.txt``; the names are :meth:`fastasr.rundir.RunDir.recognition_files`):

* ``recogs-<tag>.txt``: for every utterance its reference and hypothesis words, and units;
* ``errs-<tag>.txt``: the word error rate with its substitutions, deletions and insertions,
  every utterance aligned (``the (cat->cap) sat [+extra] [-missing]``), then the most
  frequent substitutions, deletions and insertions;
* ``errs-units-<tag>.txt``: the same over units (phonemes or characters).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from fastasr.decoding.metrics import Alignment

TOP = 50  # most frequent confusions listed


def aligned_text(ref: Sequence[str], hyp: Sequence[str], chunks: Sequence) -> str:
    """One utterance's alignment: correct tokens as they are, ``(r->h)`` substitutions,
    ``[-r]`` deletions, ``[+h]`` insertions."""
    out: list[str] = []
    for c in chunks:
        r, h = ref[c.ref_start_idx:c.ref_end_idx], hyp[c.hyp_start_idx:c.hyp_end_idx]
        if c.type == "equal":
            out += r
        elif c.type == "substitute":
            out += [f"({a}->{b})" for a, b in zip(r, h)]
        elif c.type == "delete":
            out += [f"[-{a}]" for a in r]
        else:
            out += [f"[+{b}]" for b in h]
    return " ".join(out)


def confusions(refs: Sequence[Sequence[str]], hyps: Sequence[Sequence[str]],
               alignment: Alignment) -> tuple[Counter, Counter, Counter]:
    """Counts of (ref, hyp) substitutions, deleted ref tokens and inserted hyp tokens."""
    subs, dels, ins = Counter(), Counter(), Counter()
    for ref, hyp, chunks in zip(refs, hyps, alignment.chunks):
        for c in chunks:
            r, h = ref[c.ref_start_idx:c.ref_end_idx], hyp[c.hyp_start_idx:c.hyp_end_idx]
            if c.type == "substitute":
                subs.update(zip(r, h))
            elif c.type == "delete":
                dels.update(r)
            elif c.type == "insert":
                ins.update(h)
    return subs, dels, ins


def format_errors(title: str, ids: Sequence[str], refs: Sequence[Sequence[str]],
                  hyps: Sequence[Sequence[str]], alignment: Alignment) -> str:
    """The text of an errs file (``alignment`` must have been made with ``keep_chunks=True``)."""
    a = alignment
    lines = [f"%{title} {a.rate:.2f} [ {a.errors} / {a.reference_length}, {a.insertions} ins, "
             f"{a.deletions} del, {a.substitutions} sub ]", "", "PER-UTTERANCE ALIGNMENT:"]
    lines += [f"{i}:\t{aligned_text(r, h, c)}" for i, r, h, c in zip(ids, refs, hyps, a.chunks)]
    subs, dels, ins = confusions(refs, hyps, a)
    lines += ["", f"SUBSTITUTIONS (count ref -> hyp), {TOP} most frequent:"]
    lines += [f"{n}\t{r} -> {h}" for (r, h), n in subs.most_common(TOP)]
    lines += ["", f"DELETIONS (count ref), {TOP} most frequent:"]
    lines += [f"{n}\t{r}" for r, n in dels.most_common(TOP)]
    lines += ["", f"INSERTIONS (count hyp), {TOP} most frequent:"]
    lines += [f"{n}\t{h}" for h, n in ins.most_common(TOP)]
    return "\n".join(lines) + "\n"


def write_recognition_files(paths: Mapping[str, Path], transcripts: Sequence, words: Alignment,
                            units: Alignment, unit_name: str = "PER") -> dict[str, Path]:
    """Write the ``recogs``, ``errs`` and ``errs_units`` files of one decoding.

    Args:
        paths: where each goes, by kind (:meth:`fastasr.rundir.RunDir.recognition_files`).
        transcripts: :class:`fastasr.decoding.metrics.Transcript` per utterance.
        words / units: their alignments (``keep_chunks=True``), in the same order.
        unit_name: PER or CER, for the units' header.

    Returns ``paths``.
    """
    missing = {"recogs", "errs", "errs_units"} - set(paths)
    if missing:
        raise ValueError(f"write_recognition_files: no path for {sorted(missing)}")
    paths = {k: Path(p) for k, p in paths.items()}
    for p in paths.values():
        p.parent.mkdir(parents=True, exist_ok=True)
    ids = [t.id for t in transcripts]
    recogs = []
    for t in transcripts:
        recogs += [f"{t.id}:\tref={' '.join(t.ref_words)}", f"{t.id}:\thyp={' '.join(t.hyp_words)}",
                   f"{t.id}:\tref_units={' '.join(t.ref_units)}", f"{t.id}:\thyp_units={' '.join(t.hyp_units)}", ""]
    paths["recogs"].write_text("\n".join(recogs), encoding="utf-8")
    paths["errs"].write_text(format_errors("WER", ids, [t.ref_words for t in transcripts],
                                           [t.hyp_words for t in transcripts], words), encoding="utf-8")
    paths["errs_units"].write_text(format_errors(unit_name, ids, [t.ref_scored_units for t in transcripts],
                                                 [t.hyp_scored_units for t in transcripts], units), encoding="utf-8")
    return paths
