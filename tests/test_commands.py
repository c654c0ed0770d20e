"""The commands (docs/ARCHITECTURE.md, "Commands"): every console script of pyproject.toml is a
``main`` of ``fastasr.cli`` (but the PyTorch-free runtime's), runs as ``python -m`` too, and the
repository's ``train.py`` / ``evaluate.py`` and the contract's two module names run the same ``main``."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys

import pytest

from fastasr.config import PROJECT_ROOT

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

#: The console script that is not fastasr.cli's (fastasr.cli's commands import torch; the runtime must not).
RUNTIME_SCRIPT = ("fastasr-onnx-transcribe", "fastasr.onnx.transcribe:main")
#: Modules of fastasr.cli that are not commands.
HELPERS = {"__init__", "preflight", "subcommands"}


def scripts() -> dict[str, str]:
    return tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_every_script_is_a_main_of_cli_and_every_command_a_script():
    found = scripts()
    assert RUNTIME_SCRIPT in found.items()
    for name, target in found.items():
        module, _, attribute = target.partition(":")
        assert attribute == "main" and callable(importlib.import_module(module).main), name
        if (name, target) != RUNTIME_SCRIPT:
            assert module.startswith("fastasr.cli.") and name == "fastasr-" + module.rsplit(".", 1)[1], name
    commands = {p.stem for p in (PROJECT_ROOT / "src" / "fastasr" / "cli").glob("*.py")} - HELPERS
    assert {f"fastasr.cli.{c}:main" for c in commands} | {RUNTIME_SCRIPT[1]} == set(found.values())


def test_every_script_runs_as_a_module_too():
    """Each script's module has a ``__main__`` block calling its ``main`` (``python -m``)."""
    for target in scripts().values():
        module = target.partition(":")[0]
        path = PROJECT_ROOT / "src" / (module.replace(".", "/") + ".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        blocks = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
        assert len(blocks) == 1 and "main()" in ast.unparse(blocks[0]), module


def test_the_shims_run_the_commands_main():
    """``train.py``, ``evaluate.py`` (the README's and Hydra users' names) and the outside
    contract's ``fastasr.transcribe`` and ``fastasr.cross_eval`` import the command's ``main``;
    the ``fastasr.export`` alias is gone."""
    for shim, command in (("train.py", "fastasr.cli.train"), ("evaluate.py", "fastasr.cli.evaluate"),
                          ("src/fastasr/transcribe.py", "fastasr.cli.transcribe"),
                          ("src/fastasr/cross_eval.py", "fastasr.cli.matrix")):
        tree = ast.parse((PROJECT_ROOT / shim).read_text(encoding="utf-8"))
        imports = [(n.module, [a.name for a in n.names]) for n in tree.body if isinstance(n, ast.ImportFrom)]
        assert imports == [(command, ["main"])], shim
    assert not (PROJECT_ROOT / "src" / "fastasr" / "export.py").exists()


@pytest.mark.parametrize("command, subcommands", [
    ("fastasr.cli.corpus", ["synthetic", "digits", "librispeech", "mini-librispeech", "timit", "kaldi",
                            "commonvoice", "join", "shapes"]),
    ("fastasr.cli.kernels", ["build", "check", "compile-check"]),
])
def test_the_subcommand_commands_list_and_dispatch(command, subcommands, capsys):
    """``fastasr-corpus`` / ``fastasr-kernels``: ``--help`` lists the subcommands, an unknown one is
    exit status 2, and a known one runs its module's ``main`` with the rest of the arguments (its
    own ``--help`` names it ``fastasr-corpus <builder>``)."""
    main = importlib.import_module(command).main
    assert main(["--help"]) == 0
    listing = capsys.readouterr().out
    assert all(f"\n  {name} " in listing for name in subcommands), listing
    assert main(["nope"]) == 2 and "unknown subcommand 'nope'" in capsys.readouterr().err
    assert main([]) == 2
    prog = "fastasr-corpus synthetic" if command.endswith("corpus") else "fastasr-kernels compile-check"
    with pytest.raises(SystemExit) as done:
        main([prog.split()[1], "--help"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith(f"usage: {prog} ")


@pytest.mark.slow
def test_the_corpus_builders_run_from_fastasr_corpus(tmp_path):
    """``python -m fastasr.cli.corpus shapes ...`` reaches the builder: a bad source is its one
    line and exit status 2; ``python -m fastasr.cli.train --help`` is train.py's help page."""
    done = subprocess.run([sys.executable, "-m", "fastasr.cli.corpus", "shapes", "tiny", str(tmp_path / "none"),
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "error:" in done.stderr and "Traceback" not in done.stderr, done.stderr
    done = subprocess.run([sys.executable, "-m", "fastasr.cli.train", "--help"], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("train.py: "), done.stderr
