"""The documentation is checked like code: README.md, README.ko.md, CHANGELOG.md and every page under docs/ (the
Korean ones included).

- every ``attnkit ...`` command in a code block parses with the CLI's own parser (parsed, never executed), and its
  ``--set`` keys are config keys; an ``attnkit ...`` span in running text is often a fragment (`attnkit average`,
  `attnkit convert --trust-pickle`), so there only its sub-commands and option names are checked;
- every file a document names (a repository path in backticks, a Markdown link, an image) exists;
- every code reference written ``path::name`` (``src/attnkit/model/attention.py::MultiHeadAttention.forward``)
  names a file that exists and a class, function or assignment defined in it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from attnkit.cli import build_parser
from attnkit.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "README.ko.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Generated from the parser itself (tests/test_reference.py): its usage lines are argparse's templates, not commands.
USAGE_DOCS = {ROOT / "docs" / "reference" / "cli.md"}
# Top-level folders of the repository: a backticked path that starts with one of these must exist.
REPO_DIRS = ("src/", "tests/", "docs/", "benchmarks/", "examples/", "configs/", ".ci/")

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)*)`(?!`)")  # an inline span may run over a line break
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE_REF = re.compile(r"`([\w./-]+\.py)::([\w.]+)`")
DIR_ALTERNATIVES = "|".join(re.escape(d) for d in REPO_DIRS)
PATH = re.compile(rf"`((?:{DIR_ALTERNATIVES})[\w./-]*)`")


def doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return FENCE.sub("", text)


# ---------------------------------------------------------------------------------------------------------------
# Commands


def join_continuations(block: str) -> list[str]:
    """Lines of a shell block with backslash continuations joined and comments dropped."""
    lines, current = [], ""
    for raw in block.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    if current:
        lines.append(current)
    return lines


def attnkit_argvs(command_line: str) -> list[list[str]]:
    """The argument vectors of every ``attnkit`` invocation in one shell line.

    Handles ``a && b``, ``a | b``, ``echo ... | attnkit ...``, ``< file`` / ``> file`` redirections, trailing
    ``# comments`` and ``python -m attnkit`` / ``torchrun ... -m attnkit``.
    """
    if not re.search(r"(^|[\s|&;])attnkit(\s|$)", command_line):
        return []  # not a command line (a layout listing, a Python snippet): nothing to parse
    lexer = shlex.shlex(command_line, posix=True, punctuation_chars="|&;<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    argvs: list[list[str]] = []
    current: list[str] = []
    for token in tokens + [";"]:
        if token and set(token) <= set("|&;"):
            argvs.append(current)
            current = []
        else:
            current.append(token)
    found = []
    for words in argvs:
        # Drop redirections and their targets: `attnkit ... < file`, `> out`.
        cleaned, skip = [], False
        for word in words:
            if skip:
                skip = False
                continue
            if set(word) <= set("<>"):
                skip = True
                continue
            cleaned.append(word)
        if cleaned and cleaned[0] == "attnkit":
            found.append(cleaned[1:])
        elif (
            "-m" in cleaned and cleaned.index("-m") + 1 < len(cleaned) and cleaned[cleaned.index("-m") + 1] == "attnkit"
        ):
            found.append(cleaned[cleaned.index("-m") + 2 :])
    return found


def documented_commands() -> list[tuple[str, list[str], bool]]:
    """(where, argv, complete): complete for code blocks, False for fragments in running text."""
    commands = []
    for path in DOCS:
        if path in USAGE_DOCS:
            continue
        text = path.read_text(encoding="utf-8")
        for block in FENCE.findall(text):
            for line in join_continuations(block):
                line = line.strip()
                line = line.removeprefix("$ ")
                commands += [(f"{doc_id(path)}: {line}", argv, True) for argv in attnkit_argvs(line)]
        # Spans in running text, except templates with [optional] parts, a|b alternatives or an ellipsis.
        for span in INLINE.findall(prose(text)):
            span = " ".join(span.split())
            if span.startswith("attnkit ") and not re.search(r"[\[\]|…]|\.\.\.", span):
                commands += [(f"{doc_id(path)}: `{span}`", argv, False) for argv in attnkit_argvs(span)]
    return commands


def relaxed(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` with nothing required and no value types, for fragments such as `attnkit average --last N`:
    an unknown sub-command or option still fails."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                relaxed(sub)
            action.required = False  # `attnkit export` names the group, in running text
            continue
        action.required = False
        action.type = None
        if action.nargs == "+":
            action.nargs = "*"
    return parser


COMMANDS = documented_commands()


def config_keys() -> set[str]:
    from attnkit import config

    keys: set[str] = set()
    for cls in (
        config.ClassifierConfig,
        config.TranslatorConfig,
        config.ClassifierTrainConfig,
        config.TranslatorTrainConfig,
        config.MaskedLMConfig,
        config.PretrainTrainConfig,
    ):
        keys |= {f.name for f in dataclasses.fields(cls)}
    return keys


def test_the_documents_contain_commands():
    # The extraction itself can fail silently (a regex that matches nothing): the README alone has dozens.
    assert len(COMMANDS) > 30
    assert any(argv[:2] == ["translate", "run"] for _, argv, complete in COMMANDS if complete)  # behind `echo ... |`
    assert any(argv[:1] == ["ablate"] for _, argv, complete in COMMANDS if complete)  # across backslash continuations


@pytest.mark.parametrize("where,argv,complete", COMMANDS, ids=[w[:90] for w, _, _ in COMMANDS])
def test_documented_command_parses(where, argv, complete):
    if where.startswith("docs/bad-inputs.md"):
        return  # its rows are bad on purpose, some in their very arguments: tests/test_bad_inputs.py runs each one
    parser = build_parser() if complete else relaxed(build_parser())
    try:
        args = parser.parse_args(argv)
    except (InputError, SystemExit) as err:
        pytest.fail(f"{where}\n  does not parse: {err}")
    unknown = [
        pair.partition("=")[0]
        for pair in getattr(args, "overrides", []) or []
        if pair.partition("=")[0] not in config_keys()
    ]
    assert not unknown, f"{where}\n  --set keys that are not config keys: {unknown}"


def test_the_command_check_rejects_a_broken_command():
    # The check above must be able to fail: the guide once showed `plot attention` without its required --out.
    (argv,) = attnkit_argvs("attnkit plot attention --model RUN TEXT")
    with pytest.raises(InputError, match="--out"):
        build_parser().parse_args(argv)
    with pytest.raises(InputError, match="--colour"):  # a fragment with an option that does not exist
        relaxed(build_parser()).parse_args(["average", "--colour", "red"])
    relaxed(build_parser()).parse_args(["average", "--last", "N"])  # a fragment with a placeholder


def test_command_extraction():
    line = 'echo "In the beginning." | attnkit translate run --model r && attnkit average --last 5 --out a r  # note'
    assert attnkit_argvs(line) == [["translate", "run", "--model", "r"], ["average", "--last", "5", "--out", "a", "r"]]
    assert attnkit_argvs("attnkit classify predict --model r < examples/x.txt") == [
        ["classify", "predict", "--model", "r"]
    ]
    assert attnkit_argvs("torchrun --nproc-per-node 2 -m attnkit params --task classify") == [
        ["params", "--task", "classify"]
    ]
    assert join_continuations("attnkit ablate \\\n  --grid a=1 \\\n  --out d\nnext") == [
        "attnkit ablate    --grid a=1    --out d",
        "next",
    ]


# ---------------------------------------------------------------------------------------------------------------
# Files and figures


def referenced_paths() -> list[tuple[str, Path]]:
    refs = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            refs.append((f"{doc_id(path)}: ({target})", (path.parent / target.split("#")[0]).resolve()))
        for target in PATH.findall(prose(text)):
            refs.append((f"{doc_id(path)}: `{target}`", ROOT / target))
        for script in re.findall(rf"python ((?:{DIR_ALTERNATIVES})[\w./-]+\.py)", text):
            refs.append((f"{doc_id(path)}: python {script}", ROOT / script))
    return refs


PATHS = referenced_paths()


def test_the_documents_reference_files():
    assert len(PATHS) > 20
    assert any(p.suffix == ".png" for _, p in PATHS)


@pytest.mark.parametrize("where,target", PATHS, ids=[w[:90] for w, _ in PATHS])
def test_referenced_file_exists(where, target):
    assert target.exists(), f"{where}: {target} does not exist"
    assert ROOT in target.resolve().parents or target.resolve() == ROOT, f"{where}: points outside the repository"


# ---------------------------------------------------------------------------------------------------------------
# Code references: `path::name`


def defined_names(source: str) -> set[str]:
    """Top-level functions, classes and assignments, and ``Class.member`` for what classes define."""
    names: set[str] = set()

    def targets(node: ast.stmt) -> list[str]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return [node.name]
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        return []

    for node in ast.parse(source).body:
        names.update(targets(node))
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                names.update(f"{node.name}.{name}" for name in targets(member))
    return names


def code_references() -> list[tuple[str, str, str]]:
    refs = []
    for path in DOCS:
        for file, name in CODE_REF.findall(path.read_text(encoding="utf-8")):
            refs.append((f"{doc_id(path)}: `{file}::{name}`", file, name))
    return refs


CODE_REFS = code_references()


def test_the_documents_contain_code_references():
    assert len(CODE_REFS) > 10


@pytest.mark.parametrize("where,file,name", CODE_REFS, ids=[w[:90] for w, _, _ in CODE_REFS])
def test_code_reference_resolves(where, file, name):
    path = ROOT / file
    assert path.is_file(), f"{where}: no file {file}"
    assert name in defined_names(path.read_text(encoding="utf-8")), f"{where}: {file} defines no {name}"


def test_code_reference_check_can_fail():
    source = "class A:\n    def f(self):\n        pass\nX = 1\ndef g():\n    pass\n"
    assert defined_names(source) == {"A", "A.f", "X", "g"}


# ---------------------------------------------------------------------------------------------------------------
# The Korean guide is the English guide, whole


def guide_outline(path: Path) -> dict[str, object]:
    text = path.read_text(encoding="utf-8")
    headings = re.findall(r"^## (.*)$", text, re.MULTILINE)
    commands = sorted(
        " ".join(argv)
        for block in FENCE.findall(text)
        for line in join_continuations(block)
        for argv in attnkit_argvs(line)
    )
    return {
        "sections": len(headings),
        "section numbers": [re.findall(r"§[\d.]+", h) for h in headings],
        "figures": sorted(Path(target).name for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)),
        "code references": sorted(set(CODE_REF.findall(text))),
        "excerpts": re.findall(r"<!-- (?:excerpt|output): .+? -->", text),
        "commands": commands,
    }


def test_the_korean_guide_has_every_section_of_the_english_guide():
    # Same sections in the same order (the § numbers of their headings), the same figures, code references, excerpts
    # and commands: a section added to one guide and not the other fails here.
    english, korean = guide_outline(ROOT / "docs" / "guide.md"), guide_outline(ROOT / "docs" / "ko" / "guide.md")
    for key, value in english.items():
        assert korean[key] == value, f"docs/ko/guide.md differs from docs/guide.md in its {key}"


def test_the_readme_is_a_front_door():
    # Issue 30: a newcomer reads it in five minutes; the rest lives in docs/ (the site). The two commands, the Python
    # API and the quickstart come first, and the Korean README is linked from the first lines.
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[:3] == ["## Two commands", "## Python", "## Quickstart: the 20 sentences of the reference note"]
    assert "README.ko.md" in "\n".join(lines[:5])


def test_the_commands_page_lists_every_config_key():
    """docs/commands.md names the keys `--set` takes, by hand and grouped; a key added to a config and not there
    fails here (seven had drifted out of it: compile, cuda_graphs, the BERT keys, the pretraining ones)."""
    from attnkit.config import TASK_TRAIN_CONFIGS, ClassifierConfig, MaskedLMConfig, TranslatorConfig

    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"\w+", text[text.index("Config keys for `--set`") : text.index("Over-long inputs")]))
    configs = (ClassifierConfig, TranslatorConfig, MaskedLMConfig, *TASK_TRAIN_CONFIGS.values())
    keys = {field.name for config in configs for field in dataclasses.fields(config)}
    assert sorted(keys - listed) == []
