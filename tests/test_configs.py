"""The recipe files in configs/: each is the recipe its documents measured, each trains, ``--set`` overrides a key of
the file, and a bad file is one ``error:`` line naming the file, the line and the key.

Each file trains here at a tiny budget: ``--set`` shrinks the model and the step budget and leaves every other key
(optimizer, schedule, loss, batching, checkpoints) as the file has it. The data are the quickstart's 20 sentences and
a few made-up sentence pairs, so that CI needs no download.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnkit.cli import main
from attnkit.config import load_config_file, parse_overrides, task_configs
from attnkit.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
TASK = {"quickstart": "classify", "rt-polarity": "classify"}  # the rest are translators
SEED_TSV = ROOT / "examples" / "seed000_train.tsv"

# The recipes as the documents gave them before they were files: a file must reproduce its command exactly, or the
# figures measured with the command would not belong to it.
COMMANDS = {
    "quickstart": (None, []),  # the classifier's defaults
    "rt-polarity": (None, ["dropout=0.3", "label_smoothing=0.1", "weight_decay=0.1"]),
    "bible": (
        "small",
        ["max_steps=4700", "schedule=linear", "lr=1e-3", "warmup_steps=300", "checkpoint_every=250", "max_minutes=58"],
    ),
    "paper-base": (
        "base",
        ["max_steps=100000", "max_tokens=12500", "accum_steps=4", "schedule=noam", "warmup_steps=4000"]
        + ["checkpoint_every=1500", "keep_last=5"],
    ),
    "paper-big": (
        "big",
        ["max_steps=300000", "max_tokens=12500", "accum_steps=4", "schedule=noam", "warmup_steps=4000"]
        + ["checkpoint_every=1500", "keep_last=20"],
    ),
}
TINY_MODEL = ["d_model=16", "n_heads=2", "d_ff=32", "n_layers=1", "min_freq=1"]


def task_of(config: Path) -> str:
    return TASK.get(config.stem, "translate")


def test_every_recipe_is_known():
    assert [c.stem for c in CONFIGS] == sorted(COMMANDS)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.stem)
def test_a_recipe_file_is_the_command_it_replaces(config):
    task = task_of(config)
    preset_name, pairs = COMMANDS[config.stem]
    from_file = task_configs(task, None, load_config_file(config, task))
    from_command = task_configs(task, preset_name, dict(parse_overrides(pairs)))
    assert from_file == from_command


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.stem)
def test_every_key_of_a_recipe_cites_or_explains(config):
    # A recipe is documentation: its first lines say what it is and the command that uses it.
    text = config.read_text(encoding="utf-8")
    assert text.startswith("# "), f"{config.name}: no comment heading"
    assert f"--config configs/{config.name}" in text, f"{config.name}: no command using it"


@pytest.fixture
def pairs(tmp_path) -> Path:
    words = "the a word light day night god man land water".split()
    lines = ["source\ttarget"]
    for i in range(24):
        sentence = " ".join(words[(i + k) % len(words)] for k in range(3 + i % 4))
        lines.append(f"{sentence}\t{sentence.upper()}")
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.stem)
def test_every_recipe_trains(config, pairs, tmp_path, capsys):
    out = tmp_path / "run"
    if task_of(config) == "classify":
        argv = ["classify", "train", "--train", SEED_TSV, "--config", config, "--out", out, "--quiet"]
        tiny = [*TINY_MODEL, "epochs=1"]
    else:
        argv = ["translate", "train", "--train", pairs, "--valid", pairs, "--config", config, "--out", out, "--quiet"]
        tiny = [*TINY_MODEL, "vocab_size=300", "max_steps=2", "warmup_steps=1", "max_tokens=256", "eval_every=2"]
    code = main([str(a) for a in argv] + ["--set", *tiny])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    saved = json.loads((out / "config.json").read_text(encoding="utf-8"))
    recipe = load_config_file(config, task_of(config))
    # The file's keys are the run's, except those --set shrank and those the run resolves from its data: the
    # vocabulary size reached; under 100 examples, a batch of at most a quarter of the set and every epoch run.
    skipped = {pair.partition("=")[0] for pair in tiny} | {"vocab_size", "batch_size", "patience"}
    for key, value in recipe.items():
        if key not in skipped:
            section = "model" if key in saved["model"] else "train"
            assert saved[section][key] == value, key


def test_set_overrides_a_key_of_the_file_and_keeps_the_rest(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        ["classify", "train", "--train", str(SEED_TSV), "--config", str(ROOT / "configs" / "rt-polarity.yaml")]
        + ["--out", str(out), "--quiet", "--epochs", "1", "--set", *TINY_MODEL, "dropout=0.2"]
    )
    assert code == 0, capsys.readouterr().err
    saved = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert saved["model"]["dropout"] == 0.2  # --set wins over the file's 0.3
    assert saved["train"]["label_smoothing"] == 0.1  # the file's, where --set says nothing
    assert saved["train"]["weight_decay"] == 0.1
    assert saved["train"]["epochs"] == 1  # the flag wins over the file's 20


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "text,message",
    [
        ("d_model: 64\ncolour: red\n", r"recipe.yaml:2: unknown config key 'colour'; valid keys: accum_steps, "),
        ("max_tokens: 100\n", r"recipe.yaml:1: config key 'max_tokens' does not apply to classify training"),
        ("d_model: 64\nd_model: 32\n", r"recipe.yaml:2: config key 'd_model' is given twice"),
        ("d_model: 1.5\n", r"recipe.yaml:1: config key d_model=1.5 is not a valid int"),
        ("dropout: true\n", r"recipe.yaml:1: config key dropout=True is not a valid float"),
        ("tie: [1, 2]\n", r"recipe.yaml:1: unknown config key 'tie'"),
        ("pooling: [mean]\n", r"recipe.yaml:1: config key 'pooling' takes one value"),
        ("d_model: abc\n", r"recipe.yaml:1: config key d_model='abc' is not a valid int"),
        # a string key's choices (it lost the file and the line: checked when the config was built)
        ("d_model: 64\ntokenizer: WORD\n", r"recipe.yaml:2: config key tokenizer='WORD'; expected one of word, bpe"),
        ("norm: PRE\n", r"recipe.yaml:1: config key norm='PRE'; expected one of post, pre"),
        ("- d_model\n", r"recipe.yaml: expected a mapping of config keys"),
        ("d_model: [\n", r"recipe.yaml: not valid YAML"),
    ],
)
def test_a_bad_recipe_names_the_file_the_line_and_the_key(tmp_path, text, message):
    with pytest.raises(InputError, match=message.replace("[", r"\[")):
        load_config_file(write(tmp_path, text), "classify")


def test_values_take_their_key_type(tmp_path):
    # YAML reads 1e-3 as a string (it wants 1.0e-3): parsed as --set parses it. An int is a valid float.
    text = "lr: 1e-3\nweight_decay: 0\nd_head: null\nscale_embeddings: no\n"
    recipe = load_config_file(write(tmp_path, text), "classify")
    assert recipe == {"lr": 1e-3, "weight_decay": 0.0, "d_head": None, "scale_embeddings": False}
    assert isinstance(recipe["weight_decay"], float)
    assert load_config_file(write(tmp_path, "# nothing but a comment\n"), "classify") == {}


def test_a_missing_recipe_is_one_error_line_naming_the_shipped_ones(tmp_path, capsys):
    code = main(["params", "--task", "classify", "--config", str(tmp_path / "nowhere.yaml")])
    _, err = capsys.readouterr()
    names = "bible, paper-base, paper-big, quickstart, rt-polarity"
    assert code == 2
    assert err.splitlines() == [
        f"error: {tmp_path / 'nowhere.yaml'}: no such config file (attnkit's own recipes, by name: {names})"
    ]


def test_the_recipes_ship_with_the_package_and_are_taken_by_name(tmp_path, monkeypatch, capsys):
    """``configs/`` of a checkout is the package's ``attnkit/configs`` (a link), which the wheel installs, so that
    ``--config rt-polarity`` and ``load_config("classify", "quickstart")`` work anywhere (a path to ``configs/``
    works only in a checkout: installed elsewhere, "quickstart: no such config file"). A file of that name in the
    working directory would still be read first, as a path."""
    import attnkit
    from attnkit.config.sources import RECIPES

    assert (ROOT / "configs").resolve() == RECIPES.resolve() and {p.name for p in CONFIGS} == {
        p.name for p in RECIPES.glob("*.yaml")
    }
    monkeypatch.chdir(tmp_path)  # away from the checkout
    assert attnkit.load_config("classify", "quickstart") == attnkit.load_config("classify", RECIPES / "quickstart.yaml")
    out = tmp_path / "run"
    argv = ["classify", "train", "--train", str(SEED_TSV), "--config", "rt-polarity", "--out", str(out), "--quiet"]
    assert main([*argv, "--max-steps", "1", "--set", *TINY_MODEL]) == 0, capsys.readouterr().err
    assert json.loads((out / "config.json").read_text(encoding="utf-8"))["train"]["label_smoothing"] == 0.1
    (tmp_path / "quickstart").write_text("epochs: 3\n", encoding="utf-8")
    assert attnkit.load_config("classify", "quickstart")[1].epochs == 3
