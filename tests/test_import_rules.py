"""The import rules of docs/ARCHITECTURE.md "Layers", checked on the code: which package may
never import which, today's exceptions named one by one, and imports inside functions counted."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: The outside contract's names of two commands (DESIGN.md; docs/ARCHITECTURE.md, "Commands"): two-line
#: modules that run fastasr.cli.transcribe's and fastasr.cli.matrix's.
CONTRACT_COMMANDS = ("fastasr.transcribe", "fastasr.cross_eval")
#: The one command outside fastasr.cli: the PyTorch-free runtime's (fastasr.cli's commands import torch).
RUNTIME_COMMAND = "fastasr.onnx.transcribe"
#: The layers, from the ground up: a module may import its own layer and those below it.
LAYERS = [
    ("shared", ("fastasr.config", "fastasr.distributed", "fastasr.progress", "fastasr.quiet", "fastasr.rundir",
                "fastasr.sections")),
    ("kernels", ("fastasr.kernels",)),
    ("attention", ("fastasr.attention",)),
    ("data", ("fastasr.data",)),
    ("model", ("fastasr.model",)),
    ("lm", ("fastasr.lm",)),
    ("decoding", ("fastasr.decoding",)),
    ("recognition", ("fastasr.recognition",)),
    ("training", ("fastasr.training",)),
    ("deployment", ("fastasr.deploy", "fastasr.onnx")),
    ("studies and corpus builders", ("fastasr.studies", "fastasr.corpora")),
    ("commands", ("fastasr.cli", *CONTRACT_COMMANDS)),
]
#: (importer, imported, why it must never be), within the layers' order too: a module is
#: matched with its submodules.
NEVER = [
    ("fastasr.attention", "fastasr.data", "attention has no speech knowledge"),
    ("fastasr.kernels", "fastasr.data", "kernels have no speech knowledge"),
    ("fastasr.kernels.clustering", "fastasr.kernels.layers", "attention's clustering kernels need no model layer"),
    ("fastasr.kernels.layers", "fastasr.kernels.clustering", "the layers' kernels share only the kernels' root"),
    ("fastasr.model", "fastasr.data", "the model takes features, not corpora"),
    ("fastasr.decoding", "fastasr.model", "decoding searches emissions; it runs whatever model it is given"),
    ("fastasr.config", "fastasr", "the configuration glue imports nothing of fastasr"),
    ("fastasr.sections", "fastasr", "the runtime's config rule imports nothing of fastasr"),
    ("fastasr.studies", "fastasr.corpora", "the studies train on manifests, whoever built them"),
    ("fastasr.corpora", "fastasr.training", "corpus builders are offline tools"),
    ("fastasr.corpora", "fastasr.studies", "corpus builders are offline tools"),
    ("fastasr.onnx", "fastasr.model", "the ONNX runtime runs without PyTorch"),
    ("fastasr.onnx", "fastasr.recognition", "the ONNX runtime runs without PyTorch"),
    ("fastasr.onnx", "fastasr.deploy", "the ONNX runtime runs without PyTorch"),
]
#: Imports that break a rule today, each named with why it is there; none may be added, and a
#: fixed one must leave this list.
KNOWN: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer, by its longest matching prefix (a contract
    command, ``fastasr.transcribe``, is a command; ``fastasr`` itself: the top)."""
    longest, layer = -1, len(LAYERS)
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if _within(module, p) and len(p) > longest:
                longest, layer = len(p), i
    return layer


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def module_name(path: Path, src: Path) -> str:
    parts = path.relative_to(src).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def fastasr_imports(path: Path) -> list[tuple[str, int, bool, str]]:
    """``(imported module, line, inside a function, the line's text)`` for each fastasr import."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            else:
                names = []
            for name in names:
                if _within(name, "fastasr"):
                    found.append((name, child.lineno, in_function, lines[child.lineno - 1]))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(source), False)
    return found


def all_imports(src: Path = SRC) -> dict[str, list[tuple[str, int, bool, str]]]:
    return {module_name(p, src): fastasr_imports(p) for p in sorted((src / "fastasr").rglob("*.py"))}


def rule_breaks(src: Path = SRC) -> dict[tuple[str, str], str]:
    """``(importer module, imported module or rule's package) -> why`` for every import that
    climbs to a higher layer or that a ``NEVER`` pair forbids."""
    out = {}
    for importer, imports in all_imports(src).items():
        for imported, _, _, _ in imports:
            if layer_of(imported) > layer_of(importer):
                out[(importer, imported)] = (f"{LAYERS[layer_of(importer)][0]} imports {imported}, "
                                             f"of the higher layer {LAYERS[layer_of(imported)][0]}")
            for low, high, why in NEVER:
                if _within(importer, low) and _within(imported, high):
                    out[(importer, high)] = why
    return out


def test_no_import_breaks_a_layer_rule_beyond_the_named_exceptions():
    broken = rule_breaks()
    assert set(broken) - set(KNOWN) == set(), {k: broken[k] for k in set(broken) - set(KNOWN)}
    assert set(KNOWN) - set(broken) == set(), "fixed: take these off KNOWN"


def test_no_library_module_imports_a_command():
    """The commands (``fastasr.cli``) sit on top: they call the library, never the reverse."""
    callers = sorted({importer for importer, imports in all_imports().items()
                      if not any(_within(importer, c) for c in ("fastasr.cli", *CONTRACT_COMMANDS))
                      for imported, _, _, _ in imports if _within(imported, "fastasr.cli")})
    assert callers == []


def is_command(path: Path) -> bool:
    """Whether ``path`` runs as a command: a ``@hydra.main``, an ``if __name__ == "__main__":``
    block, or a ``__main__.py``."""
    text = path.read_text(encoding="utf-8")
    return (path.name == "__main__.py" or "hydra.main" in text
            or re.search(r"""^if __name__ == ["']__main__["']:""", text, re.M) is not None)


def test_every_library_command_lives_in_cli():
    """No ``@hydra.main``, no ``__main__`` block and no ``__main__.py`` outside ``fastasr.cli``, but
    for the two contract names and the PyTorch-free runtime's command; each of those three is one."""
    allowed = (*CONTRACT_COMMANDS, RUNTIME_COMMAND)
    commands = sorted(module_name(path, SRC) for path in (SRC / "fastasr").rglob("*.py") if is_command(path))
    assert [c for c in commands if not _within(c, "fastasr.cli") and c not in allowed] == []
    assert set(allowed) <= set(commands)


def test_a_command_outside_cli_is_caught(tmp_path):
    (tmp_path / "fastasr" / "corpora").mkdir(parents=True)
    tool = tmp_path / "fastasr" / "corpora" / "tool.py"
    tool.write_text("def main():\n    pass\n\n\nif __name__ == '__main__':\n    main()\n")
    assert is_command(tool)
    tool.write_text("def main():\n    pass\n")
    assert not is_command(tool)


def test_no_library_code_reads_the_docs_folder():
    """A non-editable install has no ``docs/``: no module builds a path into it (``"docs"`` as a
    path part, or ``"docs/results..."``, in code; a message may name a page for the reader)."""
    readers = []
    for path in sorted((SRC / "fastasr").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                    node.value == "docs" or node.value.startswith("docs/results")):
                readers.append(f"{module_name(path, SRC)}:{node.lineno}")
    assert readers == []


def test_a_forbidden_import_is_caught(tmp_path):
    """The check fails when a forbidden import is added: an lm module importing decoding (a
    higher layer), and a model module importing data (a NEVER pair)."""
    for package, source in (("lm", "from fastasr.decoding.beam import BeamSearchDecoder"),
                            ("model", "from fastasr.data.features import FeatureConfig")):
        (tmp_path / "fastasr" / package).mkdir(parents=True)
        (tmp_path / "fastasr" / package / "oops.py").write_text(f"def f():\n    {source}\n")
    assert rule_breaks(tmp_path) == {
        ("fastasr.lm.oops", "fastasr.decoding.beam"): "lm imports fastasr.decoding.beam, of the higher layer decoding",
        ("fastasr.model.oops", "fastasr.data"): "the model takes features, not corpora",
    }


def import_circles(src: Path = SRC) -> list[list[str]]:
    """The circles of the module graph: each a list of modules that reach one another by their
    fastasr imports, every import counted (inside functions and ``if TYPE_CHECKING:`` blocks too);
    an import of a name is an arrow to the deepest module the name's path reaches."""
    imports = all_imports(src)

    def module(name: str) -> str | None:
        while name not in imports and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in imports else None

    graph = {m: sorted({t for i, _, _, _ in found if (t := module(i)) not in (None, m)})
             for m, found in imports.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def strong(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return circles


def test_no_import_circle():
    """No two modules import each other, not even for annotations alone."""
    assert import_circles() == []


def test_an_import_circle_is_caught(tmp_path):
    (tmp_path / "fastasr" / "decoding").mkdir(parents=True)
    (tmp_path / "fastasr" / "decoding" / "a.py").write_text("from fastasr.decoding.b import B\n")
    (tmp_path / "fastasr" / "decoding" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fastasr.decoding.a import A\n")
    assert import_circles(tmp_path) == [["fastasr.decoding.a", "fastasr.decoding.b"]]


def test_the_layers_cover_every_package():
    """Every fastasr module belongs to a layer (a new top-level module or package must be placed)."""
    unplaced = sorted(m for m in all_imports() if m != "fastasr" and layer_of(m) == len(LAYERS))
    assert unplaced == []


#: fastasr imports inside functions without a reason on their line (a ``#`` comment): none; an
#: import inside a function says why it is not at the top (a heavy or optional dependency only
#: one path needs).
UNEXPLAINED_FUNCTION_IMPORTS = 0


def test_imports_inside_functions_give_a_reason():
    unexplained = sorted({(m, line, text.strip()) for m, imports in all_imports().items()
                          for _, line, inside, text in imports if inside and "#" not in text})
    assert len(unexplained) <= UNEXPLAINED_FUNCTION_IMPORTS, "\n".join(map(str, unexplained))


#: The most lines a source module outside ``kernels/`` holds: past it a module holds several
#: concepts (kernels keep a kernel and its launcher together, whatever their length).
MAX_MODULE_LINES = 450


def test_no_module_outside_the_kernels_is_over_the_line_limit():
    src = Path(__file__).resolve().parents[1] / "src" / "fastasr"
    long = sorted((str(p.relative_to(src)), n) for p in src.rglob("*.py")
                  if "kernels" not in p.relative_to(src).parts
                  and (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES)
    assert long == []


#: The ``fastasr-runtime`` distribution (runtime/pyproject.toml): what its modules may import at
#: their top, beside the standard library and one another (its ``dependencies``), and the modules
#: whose top may import an extra's package (``beam``: flashlight-text; ``decoding=greedy`` imports none).
RUNTIME_PYPROJECT = SRC.parent / "runtime" / "pyproject.toml"
RUNTIME_DEPENDENCIES = {"numpy", "onnxruntime", "soundfile", "sentencepiece"}
RUNTIME_EXTRAS = {"fastasr.decoding.beam": {"flashlight"}}


def runtime_modules() -> set[str]:
    """The modules the runtime's wheel holds: its ``packages``' modules, its ``py-modules``, and
    the ``__init__`` of every package above them."""
    import tomllib

    spec = tomllib.loads(RUNTIME_PYPROJECT.read_text(encoding="utf-8"))["tool"]["setuptools"]
    modules = set(spec["py-modules"]) | {m for m in all_imports() for p in spec["packages"] if _within(m, p)}
    return modules | {".".join(m.split(".")[:i]) for m in modules for i in range(1, m.count(".") + 1)}


def top_level_imports(path: Path) -> set[str]:
    """The top-level package of every import at a module's top (not in a function, not under
    ``if TYPE_CHECKING:``)."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_runtime_distribution_holds_what_the_runtime_imports():
    """fastasr-runtime's modules import (anywhere) only one another; at their top only the standard
    library and the runtime's dependencies, flashlight-text only in the beam search; the command's
    and OnnxRecogniser's modules are in it. ``make test-runtime`` installs it without torch."""
    import sys

    import tomllib

    modules = runtime_modules()
    assert {"fastasr.onnx.onnx_recogniser", RUNTIME_COMMAND, "fastasr.decoding.windows"} <= modules
    packages = tomllib.loads(RUNTIME_PYPROJECT.read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"]
    imports = all_imports()
    # held: a module the wheel lists, or any module of a package it holds whole (a package that is
    # there only as the __init__ above a listed module holds none of its other modules)
    missing = sorted((m, name) for m in modules for name, _, _, _ in imports[m]
                     if name not in modules and not any(_within(name, p) for p in packages))
    assert missing == [], "add them to runtime/pyproject.toml's py-modules, or import them lazily"
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    heavy = {}
    for m in modules:
        path = SRC / (m.replace(".", "/") + ".py")
        path = path if path.is_file() else SRC / m.replace(".", "/") / "__init__.py"
        extra = top_level_imports(path) - stdlib - RUNTIME_DEPENDENCIES - RUNTIME_EXTRAS.get(m, set()) - {"fastasr"}
        if extra:
            heavy[m] = sorted(extra)
    assert heavy == {}
