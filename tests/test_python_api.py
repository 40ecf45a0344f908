"""The Python API: every name in ``attnkit.__all__`` imports from ``attnkit`` itself, ``import attnkit`` stays cheap
(no torch), the version agrees everywhere it is written, and the README's Python block runs as printed."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
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


def readme_python_block(readme: str = "README.md") -> str:
    text = (ROOT / readme).read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert blocks, f"{readme} has no ```python block"
    return blocks[0]


def test_the_korean_readme_shows_the_same_python_block():
    assert readme_python_block("README.ko.md") == readme_python_block()


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
    assert (tmp_path / "runs" / "seed000-py" / "config.json").is_file()
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


def test_the_training_entries_refuse_what_they_cannot_train_on_before_making_the_run_directory(tmp_path):
    """A path where a list of records belongs was an AssertionError with no message (and ``pretrain_encoder("some
    text")`` pretrained on the characters); a list of tuples an AttributeError; an empty list a complaint about
    batch_size=0; the other task's configs an AttributeError. Each is refused naming the argument, before
    ``out_dir`` exists."""
    import attnkit
    from attnkit.errors import InputError

    cls_cfgs = attnkit.load_config("classify", max_steps=1)
    tr_cfgs = attnkit.load_config("translate", max_steps=1)
    pt_cfgs = attnkit.load_config("pretrain", max_steps=1)
    out = tmp_path / "run"
    example, pair = attnkit.Example("a film", "pos", 1), attnkit.Pair("a film", "ein Film", 1)

    def classify(train, valid=None, cfgs=cls_cfgs):
        attnkit.train_classifier(train, valid, model_cfg=cfgs[0], train_cfg=cfgs[1], out_dir=out)

    def translate(train, valid=None, cfgs=tr_cfgs):
        attnkit.train_translator(train, valid, model_cfg=cfgs[0], train_cfg=cfgs[1], out_dir=out)

    def pretrain(texts, cfgs=pt_cfgs):
        attnkit.pretrain_encoder(texts, model_cfg=cfgs[0], train_cfg=cfgs[1], out_dir=out)

    refused = [
        (
            lambda: classify("train.tsv"),
            r"^train: expected a list of Examples, got one string \('train.tsv'\): "
            r"read the file with attnkit.read_labeled\(path\)$",
        ),
        (lambda: classify(None), r"^train: expected a list of Examples, got NoneType$"),
        (lambda: classify([]), r"^train: the list is empty; expected Examples"),
        (lambda: classify([("a film", "pos")]), r"^train item #1 is of type tuple, not Example"),
        (lambda: classify([example], "valid.tsv"), r"^valid: expected a list of Examples, got one string"),
        # As read_labeled refuses them in a file (an int label failed in the data's fingerprint, blank texts trained)
        (
            lambda: classify([attnkit.Example("a film", 1, 1)]),  # type: ignore[arg-type]
            r"^train item #1: its label is of type int, not a string \(labels are names: str\(1\)\)$",
        ),
        (lambda: classify([example, attnkit.Example("   ", "neg", 2)]), r"^train item #2: empty text$"),
        (lambda: classify([example], [attnkit.Example(None, "pos", 1)]), r"^valid item #1: its text is of type None"),  # type: ignore[arg-type]
        (lambda: translate([pair, attnkit.Pair("a film", "", 2)]), r"^train item #2: empty target$"),
        (lambda: translate("train.tsv"), r"^train: expected a list of Pairs, got one string .* attnkit.read_parallel"),
        (lambda: translate([example]), r"^train item #1 is of type Example, not Pair"),
        (lambda: translate([pair], [example]), r"^valid item #1 is of type Example, not Pair"),
        (lambda: pretrain("some text here"), r"^expected a list of texts, got one string \('some text here'\)"),
        (lambda: pretrain(["a text", ""]), r"^texts item #2 is empty$"),
        (lambda: pretrain([example]), r"^texts item #1 is of type Example, not a string$"),
    ]
    for call, message in refused:
        with pytest.raises(InputError, match=message):
            call()
    # where the examples were read from, when the caller says (the docstring promised it beside their lines)
    with pytest.raises(InputError, match=r"^train item #2 \(mine.tsv:7\): empty text$"):
        attnkit.train_classifier([example, attnkit.Example(" ", "neg", 7)], out_dir=out, train_file="mine.tsv")
    wrong_configs = [
        (lambda: classify([example], cfgs=tr_cfgs), "model_cfg is a TranslatorConfig, not a ClassifierConfig"),
        (lambda: classify([example], cfgs=(cls_cfgs[0], tr_cfgs[1])), "train_cfg is a TranslatorTrainConfig, not"),
        (lambda: translate([pair], cfgs=cls_cfgs), "model_cfg is a ClassifierConfig, not a TranslatorConfig"),
        (
            lambda: pretrain(["a text"], cfgs=(cls_cfgs, None)),
            r"model_cfg is a tuple, not a MaskedLMConfig: use the "
            r"pair model_cfg, train_cfg = attnkit.load_config\('pretrain', ...\)",
        ),
    ]
    for call, message in wrong_configs:
        with pytest.raises(TypeError, match=message):
            call()
    assert not out.exists()


def test_a_python_training_holds_its_run_lock_and_one_refused_part_way_leaves_no_directory(tmp_path):
    """The train functions take the run directory's lock, as the train commands do (a second training into it, here
    from another thread, is refused naming the first; it was only the command line's), and a training refused
    after its checks of the records (one label, fp16 on a CPU, an ``init_from`` whose architecture the configs
    contradict, a path under a file) leaves no directory behind: it left an empty one, or a config and tokenizer."""
    import dataclasses
    import threading

    from attnkit.runs import run_lock

    examples = attnkit.read_labeled(ROOT / "examples" / "seed000_train.tsv")

    def small(task: str) -> tuple:
        return attnkit.load_config(task, d_model=16, n_heads=2, d_ff=32, n_layers=1, min_freq=1, max_steps=1)

    model_cfg, train_cfg = small("classify")
    out = tmp_path / "run"

    def classify(examples=examples, model_cfg=model_cfg, train_cfg=train_cfg, out_dir=out):
        return attnkit.train_classifier(examples, model_cfg=model_cfg, train_cfg=train_cfg, out_dir=out_dir)

    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with run_lock(out):
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        with pytest.raises(attnkit.InputError, match=rf"^{out}: another training is writing this run directory"):
            classify()
    finally:
        done.set()
        holder.join()
    assert not out.exists()  # the holder made it, and removed it empty

    pairs = [attnkit.Pair("a b c", "c b a", i) for i in range(1, 9)]
    source = tmp_path / "mt"
    tr_model, tr_train = small("translate")
    attnkit.train_translator(pairs, model_cfg=tr_model, train_cfg=tr_train, out_dir=source)
    (tmp_path / "a-file").write_text("")
    refused = [
        (lambda: classify([dataclasses.replace(ex, label="pos") for ex in examples]), "1 distinct label"),
        (lambda: classify(train_cfg=dataclasses.replace(train_cfg, precision="fp16")), "train_cfg.precision=fp16"),
        (lambda: classify(out_dir=tmp_path / "a-file" / "run"), "a folder on its path is a file"),
        (
            lambda: attnkit.train_translator(
                pairs, model_cfg=dataclasses.replace(tr_model, d_model=32), out_dir=out, init_from=source
            ),
            rf"^init_from {source} fixes the architecture and tokenizer, which the configs passed set: d_model=32 "
            r"\(the weights': 16\)",
        ),
    ]
    for call, message in refused:
        with pytest.raises(attnkit.InputError, match=message):
            call()
        assert not out.exists()
    # the same configs as the source's, a new dropout: accepted
    dropout = dataclasses.replace(tr_model, dropout=0.3)
    attnkit.train_translator(pairs, model_cfg=dropout, train_cfg=tr_train, out_dir=out, init_from=source)
    assert json.loads((out / "config.json").read_text())["model"]["dropout"] == 0.3


def test_devices_are_checked_alike_and_auto_is_a_device(tmp_path):
    """``device="auto"`` is what ``--device auto`` is (the errors recommend it; it was "not a device torch knows");
    ``embed``, ``TrainContext`` and the train functions check a device as the runs do (they raised torch's
    RuntimeError, an AssertionError, or an AttributeError on a name); ``embed(batch_size=0)`` is an InputError (a
    ValueError from ``range``). The error a training can end in is public too."""
    import torch

    from attnkit.devices import check_device

    assert check_device("auto") == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    assert attnkit.TrainContext(device="cpu").device == torch.device("cpu")  # type: ignore[arg-type]
    with pytest.raises(attnkit.InputError, match=r"^device gpu: not a device torch knows; expected auto, cpu"):
        attnkit.TrainContext(device="gpu")  # type: ignore[arg-type]
    with pytest.raises(attnkit.InputError, match=r"^device gpu: not a device torch knows"):
        attnkit.embed("minilm", ["a text"], device="gpu")
    with pytest.raises(attnkit.InputError, match=r"^batch_size=0: must be an integer >= 1"):
        attnkit.embed("minilm", ["a text"], batch_size=0)
    if not torch.cuda.is_available():  # a context may describe a GPU (the tests of its decisions do); training on it
        gpu = attnkit.TrainContext(device=torch.device("cuda"))
        examples = attnkit.read_labeled(ROOT / "examples" / "seed000_train.tsv")
        with pytest.raises(attnkit.InputError, match=r"^device cuda: no CUDA device is visible to torch"):
            attnkit.train_classifier(examples, out_dir=tmp_path / "run", context=gpu)
        assert not (tmp_path / "run").exists()
    assert issubclass(attnkit.NonFiniteError, RuntimeError)


def test_the_configs_default_to_what_the_train_command_uses(tmp_path, quietly):
    """``attnkit.train_classifier(examples, out_dir=...)`` trains what ``attnkit classify train --train FILE`` trains
    (the same config.json), as a user of the Python API expects; so for each task, either config left out."""
    import attnkit
    from attnkit.config import check_task_configs, task_configs

    examples = attnkit.read_labeled(ROOT / "examples" / "seed000_train.tsv")
    attnkit.train_classifier(examples, out_dir=tmp_path / "api")
    quietly(
        "classify", "train", "--train", str(ROOT / "examples" / "seed000_train.tsv"), "--out", str(tmp_path / "cli")
    )
    assert json.loads((tmp_path / "api" / "config.json").read_text()) == json.loads(
        (tmp_path / "cli" / "config.json").read_text()
    )
    for task in ("classify", "translate", "pretrain"):
        model_cfg, train_cfg = task_configs(task, None, {})
        assert check_task_configs(task, None, None) == (model_cfg, train_cfg)
        assert check_task_configs(task, model_cfg, None)[0] is model_cfg
        assert check_task_configs(task, None, train_cfg)[1] is train_cfg


def test_resuming_from_python_checks_the_configs_and_grows_the_budget(tmp_path):
    """``resume=True`` with a larger ``max_steps`` trains on, as ``--resume --max-steps N`` does (it stopped at the
    saved budget, silently); a setting that differs from the run's is refused, naming it; a run of another task is
    an ``InputError`` (it was a ``TypeError`` from a config's constructor). What the command line prints as
    ``warning:`` reaches a Python caller as a ``UserWarning`` (it was dropped)."""
    import attnkit

    examples = attnkit.read_labeled(ROOT / "examples" / "seed000_train.tsv")
    run = tmp_path / "run"

    def train(resume: bool, **settings):
        model_cfg, train_cfg = attnkit.load_config("classify", **settings)
        return attnkit.train_classifier(examples, model_cfg=model_cfg, train_cfg=train_cfg, out_dir=run, resume=resume)

    assert train(False, max_steps=2).steps == 2
    with pytest.warns(UserWarning, match="the budget changed from 2 to 4 steps"):
        assert train(True, max_steps=4).steps == 4
    assert json.loads((run / "config.json").read_text())["train"]["max_steps"] == 4
    with pytest.raises(attnkit.InputError, match=r"lr=0\.001 differs from the run's saved lr=0\.0005"):
        train(True, max_steps=6, lr=1e-3)
    with pytest.raises(attnkit.InputError, match=r"holds a 'classify' run, not a 'pretrain' one"):
        attnkit.pretrain_encoder(["a text"] * 4, out_dir=run, resume=True)
    with pytest.warns(UserWarning, match="holds a trained run: this run replaces it"):
        train(False, max_steps=1)
    with pytest.warns(UserWarning, match="holds no saved run to resume: training starts from the beginning"):
        attnkit.train_classifier(
            examples, train_cfg=attnkit.load_config("classify", max_steps=1)[1], out_dir=tmp_path / "new", resume=True
        )


def test_dir_lists_the_public_names_not_the_modules_own_imports():
    names = dir(attnkit)
    assert set(attnkit.__all__) <= set(names)
    assert not {"importlib", "annotations", "TYPE_CHECKING"} & set(names)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_one_run_object_answers_several_threads_as_it_answers_one(tmp_path, tiny, quietly, precision):
    """A web app calls one loaded run from a pool of threads: each call gets what it gets alone (a run shares its
    model, and on a GPU its recorded graphs, across calls: nothing of a call may leak into another's)."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    import attnkit

    quietly(*tiny.translate_train(tmp_path, tmp_path / "translator", "--max-steps", "30"))
    quietly(*tiny.classify_train(tmp_path / "classifier", "--epochs", "3"))
    rng = random.Random(0)
    words = "a b c d e f g h i".split()
    batches = [[" ".join(rng.choices(words, k=rng.randint(1, 6))) for _ in range(rng.randint(1, 9))] for _ in range(24)]
    translator = attnkit.TranslatorRun(tmp_path / "translator", precision=precision)
    classifier = attnkit.ClassifierRun(tmp_path / "classifier")
    calls = [lambda b: translator.translate(b, beam=4), lambda b: translator.translate(b, beam=1), classifier.predict]
    for call in calls:
        alone = [call(batch) for batch in batches]
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(call, batches)) == alone
