"""The documentation's references resolve: README.md and docs/**/*.md.

* every relative Markdown link (``[text](target)``, ``![alt](target)``, ``[ref]: target``) names a
  file or directory of the repository; an anchor (``page.md#section``, ``#section``) must be the
  GitHub slug of a heading of the Markdown page it points into (anchors into other files are not
  checked);
* every ``make <target>`` written in code (fenced blocks and inline code) is a target of the
  Makefile;
* every ``group=option`` written in code for a config group (a directory of ``conf/``; also
  ``group@package=option`` and ``hydra/launcher=option``) names ``conf/<group>/<option>.yaml``;
  comma-separated sweeps are checked one by one, a glob (``paper_*``) must match a file, and
  ``null`` and placeholders (``X``, ``CKPT``, ``<name>``, ``...``) are skipped;
* README.md stays a front page: at most 150 lines, its first code block holding ``make train``
  and ``make test``;
* the docs say what is: no commit and no date in README.md, docs/*.md (top level) and
  src/**/*.py outside quoted commands, and no GPU model in src/**/*.py (``history_problems``
  says precisely what counts); the results folders, docs/results/** and benchmarks/results/**,
  are where each run's command, machine, date and commit live;
* no page names a removed command (``python -m fastasr.export``, ``python -m fastasr.corpora.…``,
  ``python -m fastasr.kernels.…``, a script of the former flat ``benchmarks/`` folder), so a
  stale command cannot come back.

A failure names the file, the line and the bad link, target, option, commit, date or command.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from fnmatch import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
README = ROOT / "README.md"
README_MAX_LINES = 140

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
# `make <target>` where a command starts: a line or code span, or after ; && || | ( $
MAKE = re.compile(r"(?:^|[;&|(]|\$)\s*make\s+((?:[A-Z_]+=\S*\s+)*)([a-z][\w-]*)(?![\w=-])", re.MULTILINE)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
MAKE_TARGET = re.compile(r"^([A-Za-z0-9][\w.-]*(?:\s+[A-Za-z0-9][\w.-]*)*)\s*:(?!=)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...


def doc_files() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def split_code(path: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(prose, code) of a Markdown file as (line number, text) pairs: prose is every line outside
    fenced blocks with inline code removed; code is every line of a fenced block and every
    inline code span."""
    prose: list[tuple[int, str]] = []
    code: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        opening = FENCE.match(line)
        if fence is not None:
            if opening and opening.group(1) == fence:
                fence = None
            else:
                code.append((number, line))
            continue
        if opening:
            fence = opening.group(1)
            continue
        code.extend((number, span.group(2)) for span in INLINE_CODE.finditer(line))
        prose.append((number, INLINE_CODE.sub("", line)))
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces → '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFC", text).strip().lower()
    text = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 suffixes for repeats."""
    found: set[str] = set()
    repeats: dict[str, int] = {}
    fence: str | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        opening = FENCE.match(line)
        if fence is not None:
            if opening and opening.group(1) == fence:
                fence = None
            continue
        if opening:
            fence = opening.group(1)
            continue
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            count = repeats.get(base, 0)
            repeats[base] = count + 1
            found.add(f"{base}-{count}" if count else base)
    return found


def link_problems(path: Path) -> list[str]:
    prose, _ = split_code(path)
    problems = []
    for number, line in prose:
        targets = [m.group(1) for m in LINK.finditer(line)]
        ref = REF_LINK.match(line)
        if ref:
            targets.append(ref.group(1))
        for target in targets:
            if EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            if file_part:
                base = ROOT if file_part.startswith("/") else path.parent
                resolved = (base / file_part.lstrip("/")).resolve()
                if not resolved.exists():
                    where = rel(resolved) if resolved.is_relative_to(ROOT) else str(resolved)
                    problems.append(f"{rel(path)}:{number}: link '{target}' does not resolve "
                                    f"(no file or directory {where})")
                    continue
            else:
                resolved = path
            if anchor and resolved.suffix == ".md" and resolved.is_file() and anchor not in anchors(resolved):
                problems.append(f"{rel(path)}:{number}: link '{target}': no heading with anchor "
                                f"'#{anchor}' in {rel(resolved)}")
    return problems


def makefile_targets() -> set[str]:
    targets: set[str] = set()
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        match = MAKE_TARGET.match(line)
        if match and not line.startswith((".", "\t")):
            targets.update(match.group(1).split())
    return targets


def make_problems(path: Path, targets: set[str]) -> list[str]:
    _, code = split_code(path)
    problems = []
    for number, text in code:
        for match in MAKE.finditer(text):
            target = match.group(2)
            if target not in targets:
                problems.append(f"{rel(path)}:{number}: 'make {target}': no target '{target}' in the "
                                f"Makefile (targets: {', '.join(sorted(targets))})")
    return problems


def config_groups() -> list[str]:
    """Config groups: every directory under conf/ that holds option files, as 'data', 'hydra/launcher'."""
    groups = {rel_dir.relative_to(CONF).as_posix() for rel_dir in CONF.rglob("*")
              if rel_dir.is_dir() and any(rel_dir.glob("*.yaml"))}
    return sorted(groups, key=len, reverse=True)


def group_pattern(groups: list[str]) -> re.Pattern[str]:
    names = "|".join(re.escape(g) for g in groups)
    return re.compile(rf"(?<![\w.$/{{@+~-])(?:\+{{1,2}}|~)?({names})(?:@[\w.]+)?=([^\s'\"`)\]}};]+)")


PLACEHOLDER = re.compile(r"^(null|None|\?\?\?|\.\.\.|…|[A-Z][A-Z0-9_]*)$")


def option_problems(path: Path, pattern: re.Pattern[str]) -> list[str]:
    _, code = split_code(path)
    problems = []
    for number, text in code:
        for match in pattern.finditer(text):
            group, value = match.group(1), match.group(2).rstrip(".,:")
            for option in value.split(","):
                if not option or PLACEHOLDER.match(option) or any(c in option for c in "<>${}[]…"):
                    continue
                directory = CONF / group
                if any(c in option for c in "*?"):
                    if not any(fnmatch(p.stem, option) for p in directory.glob("*.yaml")):
                        problems.append(f"{rel(path)}:{number}: '{group}={option}': no conf/{group}/*.yaml "
                                        f"matches '{option}'")
                elif not (directory / f"{option}.yaml").is_file():
                    known = ", ".join(sorted(p.stem for p in directory.glob("*.yaml")))
                    problems.append(f"{rel(path)}:{number}: '{group}={option}': no conf/{group}/{option}.yaml "
                                    f"(options: {known})")
    return problems


def report(problems: list[str]) -> str:
    return f"{len(problems)} problem(s):\n" + "\n".join(problems)


@pytest.mark.parametrize("path", doc_files(), ids=rel)
def test_relative_links_resolve(path):
    problems = link_problems(path)
    assert not problems, report(problems)


@pytest.mark.parametrize("path", doc_files(), ids=rel)
def test_make_targets_exist(path):
    problems = make_problems(path, makefile_targets())
    assert not problems, report(problems)


@pytest.mark.parametrize("path", doc_files(), ids=rel)
def test_config_options_exist(path):
    problems = option_problems(path, group_pattern(config_groups()))
    assert not problems, report(problems)


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md: {len(lines)} lines; expected at most {README_MAX_LINES} (topics belong in docs/)")
    fence, first_block = None, []
    for line in lines:
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
            continue
        if fence is not None:
            if opening and opening.group(1) == fence:
                break
            first_block.append(line)
    block = "\n".join(first_block)
    for command in ("make train", "make test"):
        assert re.search(rf"(?m)^\s*{command}\b", block), (
            f"README.md: the first code block does not hold '{command}'; it opens with the two commands "
            f"(first block:\n{block})")


def test_the_checks_catch_what_they_are_for(tmp_path, monkeypatch):
    """A bad link, anchor, make target and config option are each reported with file and line."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "conf" / "attention").mkdir(parents=True)
    (tmp_path / "conf" / "attention" / "full.yaml").write_text("name: full\n")
    (tmp_path / "Makefile").write_text("train: lm\n\tpython train.py\n")
    page = docs / "PAGE.md"
    page.write_text("# Page\n\n## A section\n\n[ok](#a-section) [bad](MISSING.md) [anchor](#nope)\n\n"
                    "```bash\nmake train ARGS=x\nmake trian\npython train.py attention=full,fast\n"
                    "# make sure of it; then make a plan\n```\n"
                    "`attention=X` `make train`\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "CONF", tmp_path / "conf")
    links = link_problems(page)
    assert len(links) == 2 and links[0].startswith("docs/PAGE.md:5: link 'MISSING.md'"), links
    assert "'#nope'" in links[1], links
    makes = make_problems(page, makefile_targets())
    assert makes == [makes[0]] and makes[0].startswith("docs/PAGE.md:9: 'make trian'"), makes
    options = option_problems(page, group_pattern(config_groups()))
    assert len(options) == 1 and options[0].startswith("docs/PAGE.md:10: 'attention=fast'"), options


# ---------------------------------------------------------------------- the docs' command lines compose
# The Hydra entry points and their configs; `make train ARGS="..."` passes its overrides to train.py.
# Each is written `python [-m] <module or file>`, `make train` or as its console script.
ENTRY_POINTS = {"train.py": "train", "make train": "train", "evaluate.py": "evaluate",
                "fastasr.transcribe": "transcribe", "fastasr.cross_eval": "cross_eval",
                "fastasr.cli.train": "train", "fastasr.cli.evaluate": "evaluate",
                "fastasr.cli.transcribe": "transcribe", "fastasr.cli.matrix": "cross_eval",
                "fastasr.cli.tune": "tune_decoding", "fastasr.cli.budget": "budget",
                "fastasr-train": "train", "fastasr-evaluate": "evaluate", "fastasr-transcribe": "transcribe",
                "fastasr-matrix": "cross_eval", "fastasr-tune": "tune_decoding", "fastasr-budget": "budget"}
_PYTHON_ENTRIES = sorted((e for e in ENTRY_POINTS if not e.startswith(("make ", "fastasr-"))), key=len, reverse=True)
_CONSOLE_ENTRIES = sorted((e for e in ENTRY_POINTS if e.startswith("fastasr-")), key=len, reverse=True)
ENTRY = re.compile(r"python3?\s+(?:-m\s+)?(" + "|".join(map(re.escape, _PYTHON_ENTRIES)) + r")\b(?!\.)"
                   r"|make\s+(train)\b"
                   r"|(?<![\w./-])(" + "|".join(map(re.escape, _CONSOLE_ENTRIES)) + r")(?![\w.-])")
OVERRIDE = re.compile(r"^(?:\+{1,2}|~)?[A-Za-z_][\w.@/-]*=")


def command_lines(path: Path) -> list[tuple[int, str, list[str]]]:
    """``(line, config name, overrides)`` of every entry-point command written in code: the
    ``key=value`` words after the command up to a comment, with ``ARGS="..."`` unwrapped; a
    sweep's first option; hydra.* settings, placeholders and flags left out."""
    _, code = split_code(path)
    found = []
    for number, text in code:
        for match in ENTRY.finditer(text):
            entry = match.group(1) or match.group(3) or "make train"
            name = ENTRY_POINTS[entry]
            rest = text[match.end():].split("#", 1)[0].replace('ARGS="', "").replace("ARGS='", "")
            rest = rest.replace('"', " ").replace("'", " ")
            rest = re.split(r"\s(?:\||&&|;|>)\s", rest)[0]
            overrides = []
            for word in rest.split():
                if not OVERRIDE.match(word) or word.lstrip("+~").startswith(("hydra.", "hydra/")):
                    continue
                key, value = word.split("=", 1)
                if " -m " in f" {rest} " or " --multirun " in f" {rest} ":
                    value = value.split(",")[0]
                if "@" not in key and "." not in key.lstrip("+~") and (
                        PLACEHOLDER.match(value) or any(c in value for c in "*<>$…")):
                    continue  # a group option left to the reader
                if any(c in value for c in "<>$…") or value in ("...",):
                    value = "x"
                overrides.append(f"{key}={value}")
            found.append((number, name, overrides))
    return found


@functools.cache
def compose_error(conf: Path, name: str, overrides: tuple[str, ...]) -> str | None:
    """The first line of the error composing config ``name`` with ``overrides`` gives, or None."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    import fastasr.config  # noqa: F401  (registers the resolver conf/train.yaml's defaults list uses)

    with initialize_config_dir(str(conf), version_base="1.3"):
        try:
            compose(name, overrides=list(overrides))
        except (HydraException, OmegaConfBaseException) as err:
            return str(err).strip().splitlines()[0]
    return None


def compose_problems(path: Path) -> list[str]:
    problems = []
    for number, name, overrides in command_lines(path):
        error = compose_error(CONF, name, tuple(overrides))
        if error:
            problems.append(f"{rel(path)}:{number}: python {name} {' '.join(overrides)}: {error}")
    return problems


@pytest.mark.parametrize("path", doc_files(), ids=rel)
def test_documented_commands_compose(path):
    """Every key=value a page's commands give is one the config has (``Key 'pick' is not in
    struct`` was a documented override that failed)."""
    problems = compose_problems(path)
    assert not problems, report(problems)


def test_the_compose_check_catches_a_stale_key(tmp_path, monkeypatch):
    page = tmp_path / "docs" / "PAGE.md"
    page.parent.mkdir()
    page.write_text("```bash\npython train.py name=x callbacks.attention_maps.pikc=first   # typo\n```\n"
                    "`python evaluate.py ckpt_path=CKPT decoding=beam_lm` and `make train ARGS=\"model.layerz=9\"`\n"
                    "`fastasr-transcribe ckpt_path=CKPT audio=a.wav chunkk=0.64` and `fastasr-train-x model.layerz=9`\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    problems = compose_problems(page)
    assert len(problems) == 3, problems
    assert problems[0].startswith("docs/PAGE.md:2: python train name=x callbacks.attention_maps.pikc=first")
    assert "pikc" in problems[0] and "layerz" in problems[1]
    assert problems[2].startswith("docs/PAGE.md:5: python transcribe") and "chunkk" in problems[2], problems


# ---------------------------------------------------------------------- the docs say what is, not when
# A commit: a token of 7 to 40 hex digits holding both a digit and a letter a-f. The letters-only
# words of hex ("defaced", "facade") and the digits-only numbers ("1234567") are not commits; a
# hash that happens to be all digits or all letters goes unseen (about 4 % of short hashes).
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b(?:19|20)\d{2}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b")
# A GPU model names the machine a number was measured on; in src/ only (docs may say which GPU a
# table is from).
GPU_MODEL = re.compile(r"\b(?:A100|A10G?|H100|H200|H800|GH200|B200|V100|L40S?|T4)\b")
HISTORY = (("commit", COMMIT), ("date", DATE))
# Where a run's command, machine, date and commit are recorded.
RESULTS_FOLDERS = ("docs/results/", "benchmarks/results/")
# A Markdown link into a results folder may name a result file, whose name can hold a date.
RESULTS_LINK = re.compile(r"(!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?)([^)\s>]+)(>?[^)]*\))")
# A comment in a fenced block: from a '#' at the line's start or after a blank to the line's end.
COMMENT = re.compile(r"(?:^|\s)#.*$")


def history_files() -> list[Path]:
    """README.md, docs/*.md (top level) and src/**/*.py: the pages and the code that must say what is."""
    return [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "src").rglob("*.py"))]


def checked_text(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of what the history rule reads.

    * A .py file: every line, comments, docstrings and code alike (nothing is a quoted command).
    * A Markdown page: everything but its quoted commands, which are (1) a fenced block's lines,
      less any comment in them (``# …``: prose), and (2) an inline code span that holds a blank,
      a command with its arguments (```FASTASR_COMMIT=<hash> make gpu-check```); a one-word span
      (```7f13715```, ```2026-11-28```) is prose in code font and is read. A link's target that
      points into a results folder is not read either: it names a file where history belongs.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.suffix == ".py":
        return list(enumerate(lines, start=1))
    checked: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(lines, start=1):
        opening = FENCE.match(line)
        if fence is not None:
            if opening and opening.group(1) == fence:
                fence = None
            else:
                comment = COMMENT.search(line)
                if comment:
                    checked.append((number, comment.group(0)))
            continue
        if opening:
            fence = opening.group(1)
            continue
        text = INLINE_CODE.sub(lambda m: m.group(0) if not re.search(r"\s", m.group(2).strip()) else "", line)
        text = RESULTS_LINK.sub(
            lambda m: m.group(1) + m.group(3) if any(
                f in (path.parent / m.group(2)).resolve().as_posix() + "/" for f in RESULTS_FOLDERS) else m.group(0),
            text)
        checked.append((number, text))
    return checked


def history_problems(path: Path) -> list[str]:
    """Every commit and date the page or module states outside its quoted commands (and every GPU
    model in a module), as ``file:line: <what> '<match>': <the line>``."""
    patterns = HISTORY + ((("GPU model", GPU_MODEL),) if path.suffix == ".py" else ())
    problems = []
    for number, text in checked_text(path):
        for what, pattern in patterns:
            for match in pattern.finditer(text):
                problems.append(f"{rel(path)}:{number}: {what} '{match.group(0)}': {text.strip()}")
    return problems


@pytest.mark.parametrize("path", history_files(), ids=rel)
def test_no_commit_or_date_outside_the_results(path):
    """Dates, commits and machines live in docs/results/ and benchmarks/results/ with the command
    that made each number; a page or a docstring states what is and links the result behind it."""
    problems = history_problems(path)
    assert not problems, report(problems) + (
        f"\n(a run's date and commit belong in a file under {' or '.join(RESULTS_FOLDERS)}; link it instead)")


# ---------------------------------------------------------------------- no removed command comes back
# Commands that are gone, each with what replaced it (docs/COMMANDS.md lists every command).
# The former flat benchmarks/ folder: each script's module now, or None where it was deleted (its
# verdict is in benchmarks/gpu/notes.md "Answered questions").
FLAT_BENCHMARKS = {
    "attention_bench": "attention.sweep", "attention_entropy": "models.attention_entropy",
    "clustering_gpu": "attention.clustering_gpu", "cpu_bench": "attention.cpu_table", "cpu_half_attention": None,
    "export_bench": "pipeline.export", "feature_cache_bench": "pipeline.feature_cache",
    "full_paths": "attention.full_paths", "fusion_ab": None, "gpu_bench": "attention.gpu_table",
    "gpu_check": "gpu/check.sh", "gpu_checks": "attention.gpu_checks", "gpu_decisions": "gpu.decisions",
    "gpu_notes": "gpu/notes.md", "gpu_step": "step.gpu", "host_overhead": None,
    "kernel_resources": "gpu.kernel_resources", "kmeans_convergence": None, "layer_norm_gpu": "step.layer_norm_gpu",
    "learning_curves": "models.learning_curves", "long_recordings": "pipeline.long_recordings",
    "peak_memory": "step.peak_memory", "precision_step": "step.precision", "profile_attention": "attention.profile_stages",
    "step_time": "step.cpu", "streaming_bench": "pipeline.streaming", "topk_steps": None,
}
_FLAT = "|".join(sorted(FLAT_BENCHMARKS, key=len, reverse=True))
FLAT_SCRIPT = re.compile(rf"(?<![\w/.-])benchmarks/({_FLAT})\.(?:py|sh|md)\b|-m\s+benchmarks\.({_FLAT})\b")
REMOVED_COMMANDS = (
    (re.compile(r"python3?\s+-m\s+fastasr\.export\b(?!\.)"), "fastasr-export"),
    (re.compile(r"python3?\s+-m\s+fastasr\.corpora\.[\w.]+"), "fastasr-corpus <builder>"),
    (re.compile(r"python3?\s+-m\s+fastasr\.kernels\.[\w.]+"), "fastasr-kernels build | compile-check"),
)


def flat_replacement(name: str) -> str:
    new = FLAT_BENCHMARKS[name]
    if new is None:
        return "deleted; its verdict is in benchmarks/gpu/notes.md"
    return f"benchmarks/{new}" if "/" in new else f"python -m benchmarks.{new}"


def command_files() -> list[Path]:
    """The pages a reader copies commands from: README.md, docs/**/*.md but the results (records of
    runs, each with the commit its command ran at), and benchmarks' own pages."""
    pages = [p for p in doc_files() if not rel(p).startswith(RESULTS_FOLDERS)]
    pages += [p for p in sorted((ROOT / "benchmarks").rglob("*.md")) if not rel(p).startswith(RESULTS_FOLDERS)]
    return pages


def removed_command_problems(path: Path) -> list[str]:
    problems = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        found = [(m.group(0), instead) for pattern, instead in REMOVED_COMMANDS for m in pattern.finditer(line)]
        found += [(m.group(0), flat_replacement(m.group(1) or m.group(2))) for m in FLAT_SCRIPT.finditer(line)]
        for command, instead in found:
            problems.append(f"{rel(path)}:{number}: removed command '{command}' (now: {instead}): {line.strip()}")
    return problems


@pytest.mark.parametrize("path", command_files(), ids=rel)
def test_no_removed_command(path):
    problems = removed_command_problems(path)
    assert not problems, report(problems)


def test_the_history_and_command_checks_catch_what_they_are_for(tmp_path, monkeypatch):
    """A commit, a date, a GPU model in code and a removed command are each reported with file and
    line; hex words, numbers, quoted commands and links into the results are not."""
    (tmp_path / "docs" / "results" / "gpu").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "gpu" / "run_2026-11-28.txt").write_text("log\n")
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    page = tmp_path / "docs" / "PAGE.md"
    page.write_text(
        "# Page\n\n"
        "A defaced facade of 1234567 frames, 0x1f2e3d4c, the sha256 "
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 and [a log](results/gpu/run_2026-11-28.txt).\n"
        "It ran at 7f13715 on 2026-11-28.\n"
        "`FASTASR_COMMIT=7f13715 make gpu-check` and `python -m fastasr.cli.budget budget.day=2026-11-28`\n"
        "The table of `c72e613`.\n"
        "```bash\n"
        "git show 04e1e85:docs/x.md   # the table at be595ed\n"
        "python -m fastasr.export ckpt_path=CKPT\n"
        "```\n"
        "Run `python benchmarks/gpu_step.py` or `python -m benchmarks.step.gpu`, not `python -m benchmarks.gpu_step`.\n")
    module = tmp_path / "src" / "pkg" / "mod.py"
    module.write_text('"""Fast on the H200 (``a677210``)."""\nX = 0x1f2e3d4c  # 2026-11-30\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = history_problems(page)
    assert [p.split(": ")[1] for p in found] == [
        "commit '7f13715'", "date '2026-11-28'", "commit 'c72e613'", "commit 'be595ed'"], found
    assert found[0].startswith("docs/PAGE.md:4: commit '7f13715': It ran at"), found
    assert found[3].startswith("docs/PAGE.md:8: commit 'be595ed': # the table at be595ed"), found
    found = history_problems(module)
    assert [p.split(": ")[1] for p in found] == ["commit 'a677210'", "GPU model 'H200'", "date '2026-11-30'"], found
    assert found[2].startswith("src/pkg/mod.py:2: date '2026-11-30'"), found
    removed = removed_command_problems(page)
    assert [p.split("'")[1] for p in removed] == [
        "python -m fastasr.export", "benchmarks/gpu_step.py", "-m benchmarks.gpu_step"], removed
    assert removed[0].startswith("docs/PAGE.md:9:"), removed
    assert "(now: python -m benchmarks.step.gpu)" in removed[1], removed
