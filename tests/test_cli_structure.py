"""The shape of the command line: a ``cli/`` package of small modules, one per command group, that parses arguments
without importing torch; ``python -m attnkit`` is the same command; the benchmark library does not import the CLI."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnkit.cli import main

SRC = Path(__file__).resolve().parents[1] / "src"
CLI_DIR = SRC / "attnkit" / "cli"
ENV = {**os.environ, "PYTHONPATH": str(SRC)}


def _python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, check=True).stdout


def test_cli_is_a_package_of_small_modules():
    modules = sorted(CLI_DIR.glob("*.py"))
    assert {"__init__.py", "common.py", "classify.py", "translate.py", "bench.py"} <= {m.name for m in modules}
    sizes = {m.name: len(m.read_text(encoding="utf-8").splitlines()) for m in modules}
    assert all(n <= 300 for n in sizes.values()), sizes  # a module past ~300 lines is two concepts (STYLE.md)
    assert not (SRC / "attnkit" / "cli.py").exists()


def test_parsing_arguments_does_not_import_torch():
    # build_parser() registers every command: its imports are all the CLI needs before a command runs.
    out = _python(
        "import sys; import attnkit.cli as c; c.build_parser().parse_args(['bench', 'scaling']); "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    assert out.strip() == "[]"


def test_the_benchmark_library_does_not_import_the_cli():
    out = _python("import sys; import attnkit.bench; print([m for m in sys.modules if m.startswith('attnkit.cli')])")
    assert out.strip() == "[]"
    for path in (SRC / "attnkit" / "bench").glob("*.py"):  # lazy imports inside functions too
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n == "attnkit.cli" or n.startswith("attnkit.cli.") for n in names), path


@pytest.mark.parametrize("module", ["attnkit", "attnkit.cli"])
def test_python_dash_m_is_the_attnkit_command(module):
    import attnkit

    done = subprocess.run([sys.executable, "-m", module, "--version"], env=ENV, capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, f"attnkit {attnkit.__version__}")
    done = subprocess.run([sys.executable, "-m", module, "bogus"], env=ENV, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: attnkit: argument command: invalid choice")


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["bench", "train", "--threads", "0"], "bench: --threads=0 must be >= 1"),
        (
            ["bench", "scaling", "--impl", "ctranslate2"],
            "bench: suite scaling runs attnkit, torch.nn; --impl chose none",
        ),
        (["bench", "decode", "--compiled"], "bench decode --compiled: only the train suite has compiled rows"),
        (["bench", "train", "--threads", "100000"], "bench: --threads=100000 is over attnkit's ceiling of 1,024"),
        (["bench", "classify", "--json", "/"], "--json /: is a directory; give a file in an existing folder"),
        (
            ["bench", "classify", "--json", "/no-such-folder/x.json"],
            "--json /no-such-folder/x.json: its folder /no-such-folder does not exist",
        ),
    ],
)
def test_bench_refuses_bad_arguments_before_measuring(argv, fragment, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and fragment in err and len(err.splitlines()) == 1


def test_an_atomic_write_names_the_file_asked_for_not_its_temporary(tmp_path):
    """A write into a missing folder, or onto a directory, failed naming ``.x.json.<hex>.tmp``, a file the user never
    asked for."""
    from attnkit.atomic import atomic_write_bytes

    for target in (tmp_path / "missing" / "x.json", tmp_path):
        with pytest.raises(OSError) as caught:
            atomic_write_bytes(target, b"{}")
        assert caught.value.filename == str(target)
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary left behind
