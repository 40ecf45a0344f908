"""Code in the documents is rendered from the source, never pasted: a fenced block right after a marker

    <!-- excerpt: src/attnkit/model/layers.py::Residual.forward -->

is the source of that function, class or method (decorators and docstring included, dedented), and one after

    <!-- output: attnkit params --task classify --preset tiny-binary | lines 2-12 -->

is what that command prints (``| lines A-B,C-D`` keeps those lines of its stdout, 1-based, ``C-`` to the end; a
line ``...`` stands for each gap). ``test_every_excerpt_is_current`` fails when a block differs from what it is
rendered from; ``test_no_code_is_pasted`` fails when a guide holds a code block without a marker (a shell block of
commands to type is not an excerpt: tests/test_docs.py parses those). Rewrite every marked block with

    python tests/test_excerpts.py --write
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import shlex
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "README.ko.md", *sorted((ROOT / "docs").rglob("*.md"))]
GUIDES = [ROOT / "docs" / "guide.md", ROOT / "docs" / "ko" / "guide.md"]
MARKED = re.compile(
    r"^(?P<marker><!-- (?P<kind>excerpt|output): (?P<what>.+?) -->)\n(?P<fence>```[^\n]*)\n(?P<body>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)
FENCE = re.compile(r"^(```[^\n]*)\n.*?^```$", re.MULTILINE | re.DOTALL)
SHELL = ("```bash", "```sh", "```console")


def definition(path: Path, name: str) -> str:
    """The source of ``name`` (``function``, ``Class`` or ``Class.method``) in ``path``, dedented."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    body: list[ast.stmt] = ast.parse(source).body
    node: ast.stmt | None = None
    for part in name.split("."):
        node = next((n for n in body if getattr(n, "name", None) == part), None)
        if node is None:
            raise LookupError(f"{path.name} defines no {name}")
        body = getattr(node, "body", [])
    assert node is not None and node.end_lineno is not None
    decorators = getattr(node, "decorator_list", [])
    start = min([node.lineno, *(d.lineno for d in decorators)])
    return textwrap.dedent("\n".join(lines[start - 1 : node.end_lineno]))


def command_output(what: str) -> str:
    """The stdout of an ``attnkit`` command, run in-process, with the ``| lines`` selection applied."""
    from attnkit.cli import main

    command, _, selection = what.partition(" | ")
    argv = shlex.split(command)
    assert argv[0] == "attnkit", f"an output marker runs attnkit commands only: {command}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv[1:])
    assert code == 0, f"{command} exited with {code}"
    lines = out.getvalue().rstrip("\n").splitlines()
    if not selection:
        return "\n".join(lines)
    match = re.fullmatch(r"lines ((?:\d+-\d*,?)+)", selection)
    assert match, f"unknown selection {selection!r}; expected 'lines A-B,C-'"
    kept: list[str] = []
    last = 0
    for span in match[1].strip(",").split(","):
        first, _, end = span.partition("-")
        a, b = int(first), int(end) if end else len(lines)
        if kept and a > last + 1:
            kept.append("...")
        kept += lines[a - 1 : b]
        last = b
    return "\n".join(kept)


def render(kind: str, what: str) -> str:
    if kind == "excerpt":
        file, _, name = what.partition("::")
        return definition(ROOT / file, name)
    return command_output(what)


def marked_blocks(text: str) -> list[re.Match]:
    return list(MARKED.finditer(text))


def rewrite(text: str) -> str:
    def current(match: re.Match) -> str:
        body = render(match["kind"], match["what"])
        return f"{match['marker']}\n{match['fence']}\n{body}\n```"

    return MARKED.sub(current, text)


BLOCKS = [(path, match) for path in DOCS for match in marked_blocks(path.read_text(encoding="utf-8"))]


def test_the_guides_have_excerpts():
    for guide in GUIDES:
        kinds = {m["kind"] for p, m in BLOCKS if p == guide}
        assert kinds == {"excerpt", "output"}, f"{guide.relative_to(ROOT)}: {kinds}"


@pytest.mark.parametrize(
    "path,match",
    BLOCKS,
    ids=[f"{p.relative_to(ROOT)}: {m['what'][:60]}" for p, m in BLOCKS],
)
def test_every_excerpt_is_current(path, match):
    expected = render(match["kind"], match["what"])
    assert match["body"].rstrip("\n") == expected, (
        f"{path.relative_to(ROOT)}: the block after {match['marker']} differs from its source; "
        "run: python tests/test_excerpts.py --write"
    )


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_code_is_pasted(guide):
    text = guide.read_text(encoding="utf-8")
    marked = {m.start("fence") for m in marked_blocks(text)}
    pasted = [
        text[: fence.start()].count("\n") + 1
        for fence in FENCE.finditer(text)
        if fence.start() not in marked and not fence.group(1).startswith(SHELL)
    ]
    assert not pasted, f"{guide.relative_to(ROOT)}: code blocks without an excerpt or output marker at lines {pasted}"


def test_an_excerpt_is_the_definition(tmp_path):
    source = "import x\n\n\nclass A:\n    @property\n    def f(self):\n        return 1\n\n    def g(self):\n"
    source += "        pass\n"
    path = tmp_path / "m.py"
    path.write_text(source, encoding="utf-8")
    assert definition(path, "A.f") == "@property\ndef f(self):\n    return 1"
    with pytest.raises(LookupError, match="defines no A.h"):
        definition(path, "A.h")


def test_a_stale_excerpt_is_found():
    text = "<!-- excerpt: src/attnkit/model/layers.py::Residual.forward -->\n```python\nold code\n```\n"
    (match,) = marked_blocks(text)
    assert match["body"] == "old code\n"
    assert "old code" not in rewrite(text) and "def forward" in rewrite(text)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_excerpts.py --write   (renders every marked block of the documents)")
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        new = rewrite(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
