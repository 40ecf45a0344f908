"""The Python API: every name in ``attnkit.__all__`` imports from ``attnkit`` itself, ``import attnkit`` stays cheap
(no torch), the version agrees everywhere it is written, and the README's Python block runs as printed."""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import attnkit

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", [n for n in attnkit.__all__ if n != "__version__"])
def test_every_public_name_is_the_object_its_module_defines(name):
    value = getattr(attnkit, name)
    module = importlib.import_module(attnkit._EXPORTS[name])
    assert value is getattr(module, name)
    assert name in dir(attnkit)


def test_the_issue_names_are_public():
    for name in ("ClassifierRun", "TranslatorRun", "train_classifier", "train_translator", "load_config"):
        assert name in attnkit.__all__


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'ClassifierRunn'"):
        attnkit.ClassifierRunn  # noqa: B018


def test_import_attnkit_is_lazy():
    # The command line imports attnkit for every command, --help included: the package itself must not pull torch.
    code = "import sys, attnkit; print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('attnkit.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_version_is_the_same_everywhere():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    version = re.search(r'^version = "(.*)"$', pyproject, re.MULTILINE)
    assert version is not None and version[1] == attnkit.__version__
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", changelog, re.MULTILINE)
    assert released and released[0] == attnkit.__version__, "the newest CHANGELOG.md entry is not this version"


def readme_python_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert blocks, "README.md has no ```python block"
    return blocks[0]


def test_the_readme_python_block_runs(tmp_path, monkeypatch):
    # In a fresh directory holding the files the block names, exactly as a reader would paste it.
    for name in ("examples/seed000_train.tsv", "configs/quickstart.yaml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    block = readme_python_block()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})
    assert (tmp_path / "runs" / "seed000" / "config.json").is_file()
    lines = out.getvalue().splitlines()
    assert lines, "the block printed nothing"
    for line in lines:  # one prediction a line: a label of the training set and its probabilities
        label, _, probs = line.partition(" ")
        assert label in ("negative", "positive"), line
        assert abs(sum(eval(probs).values()) - 1) < 1e-5, line  # noqa: S307 - a dict the block printed


def test_one_string_is_refused_not_read_as_a_list_of_characters(tmp_path):
    """``ClassifierRun.predict("a film")`` iterated the string: its second "text", a space, was "input text #2 is
    empty". Every entry point that reads texts takes a list and says so for one string; an empty text is named."""
    import attnkit
    from attnkit.errors import InputError, check_texts

    model_cfg, train_cfg = attnkit.load_config("classify", ROOT / "configs" / "quickstart.yaml", max_steps=2)
    examples = attnkit.read_labeled(ROOT / "examples" / "seed000_train.tsv")
    attnkit.train_classifier(examples, None, model_cfg=model_cfg, train_cfg=train_cfg, out_dir=tmp_path / "run")
    run = attnkit.ClassifierRun(tmp_path / "run")
    with pytest.raises(InputError, match=r"expected a list of texts, got one string \('a film'\): pass \[text\]"):
        run.predict("a film")  # type: ignore[arg-type]
    assert [p.label for p in run.predict(["a film"])] == [run.predict(("a film",))[0].label]  # type: ignore[arg-type]
    with pytest.raises(InputError, match="input text #2 is empty"):
        run.predict(["a film", "  "])
    with pytest.raises(InputError, match="source line 1 is of type int, not a string"):
        check_texts([3], "source line {}")  # type: ignore[list-item]
