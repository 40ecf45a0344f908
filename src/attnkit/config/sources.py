"""Where a config comes from: a task's preset, a recipe file (``configs/*.yaml``, ``--config``), ``--set`` overrides,
and the saved configuration of a run being resumed.

Every key a user sets passes through here: its value parsed (a ``--set`` string) or type-checked (a YAML scalar)
against its field, then routed to the config that has it, the model's or the task's training (``train_config_class``:
a key of another task is refused naming that task). ``load_config`` and ``task_configs`` make the pair a training
starts from; ``check_resume_settings`` says what a resumed run may be given.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import fields
from pathlib import Path

from attnkit.config.bounds import check_choice, check_number, field_types
from attnkit.config.models import PRESET_ALIASES, TASK_PRESETS, ClassifierConfig, MaskedLMConfig
from attnkit.config.training import TASK_TRAIN_CONFIGS, TrainConfig
from attnkit.errors import InputError


def train_config_class(task: str, key: str) -> type[TrainConfig]:
    """The training config of ``task``; ``key`` (being set) is refused, naming the task, when it belongs to another
    task's training or model config and to none of ``task``'s."""
    cls = TASK_TRAIN_CONFIGS[task]
    if key in {f.name for f in fields(cls)} | {f.name for f in fields(TASK_PRESETS[task][0])}:
        return cls
    for part, configs in (("training", TASK_TRAIN_CONFIGS), ("models", {t: p[0] for t, p in TASK_PRESETS.items()})):
        owners = [name for name, other in configs.items() if key in {f.name for f in fields(other)}]
        if owners:
            raise InputError(f"config key {key!r} does not apply to {task} {part} (it is a {' / '.join(owners)} key)")
    return cls


# ---------------------------------------------------------------------------------------------------------------
# Overrides: "--set key=value" and YAML files


def _parse_value(cls: type, key: str, raw: str) -> object:
    """Turn the string ``raw`` into the type of field ``key`` of ``cls``."""
    options = field_types(cls)[key]
    if type(None) in options and raw.lower() in ("none", "null", ""):
        return None
    target = next(t for t in options if t is not type(None))
    try:
        if target is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if target is int:
            return int(raw)
        if target is float:
            return float(raw)
        return str(raw)
    except ValueError:
        raise InputError(f"config key {key}={raw!r} is not a valid {target.__name__}") from None


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """``["d_model=64", "dropout=0.3"]`` -> ``{"d_model": "64", "dropout": "0.3"}``; malformed pairs are errors."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set expects key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


# The recipes shipped with attnkit (``configs/`` of a checkout links here), taken by name: ``--config rt-polarity``.
RECIPES = Path(__file__).resolve().parents[1] / "configs"


def recipe_path(spec: str | Path) -> Path:
    """The recipe file ``spec`` names: a path, or, where no such file exists, a bare name (no folder, no suffix) of a
    recipe shipped with attnkit (``rt-polarity`` is its ``configs/rt-polarity.yaml``, installed or not)."""
    path = Path(spec)
    shipped = RECIPES / f"{path.name}.yaml"
    if not path.exists() and path.parent == Path(".") and not path.suffix and shipped.is_file():
        return shipped
    return path


def load_config_file(path: str | Path, task: str) -> dict[str, object]:
    """The config keys of a recipe file (``--config FILE``, or the name of one of ``configs/*.yaml``) for ``task``,
    each value checked.

    A recipe is a flat YAML mapping of the keys ``--set`` takes (model and training keys alike). A key the task does
    not have, a key given twice, a nested value or a value of the wrong type is an ``InputError`` naming the file,
    the line and the key, before anything is trained.
    """
    import yaml

    path = recipe_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        names = ", ".join(sorted(recipe.stem for recipe in RECIPES.glob("*.yaml")))
        raise InputError(f"{path}: no such config file (attnkit's own recipes, by name: {names})") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a config file") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)  # nodes, for the line of each key
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise InputError(f"{path}: not valid YAML ({' '.join(str(err).split())})") from None
    if root is None:
        return {}  # an empty file (or comments only): no keys
    if not isinstance(root, yaml.MappingNode) or not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping of config keys (key: value, one a line)")
    model_cls, _, _ = TASK_PRESETS[task]
    train_cls = TASK_TRAIN_CONFIGS[task]
    model_keys, train_keys = {f.name for f in fields(model_cls)}, {f.name for f in fields(train_cls)}
    seen: set[str] = set()
    for key_node, value_node in root.value:
        key, where = str(key_node.value), f"{path}:{key_node.start_mark.line + 1}"
        try:
            if key in seen:
                raise InputError(f"config key {key!r} is given twice")
            seen.add(key)
            if key not in model_keys | train_keys:
                train_config_class(task, key)  # a key of another task: named as such
                valid = ", ".join(sorted(model_keys | train_keys))
                raise InputError(f"unknown config key {key!r}; valid keys: {valid}")
            if not isinstance(value_node, yaml.ScalarNode):
                raise InputError(f"config key {key!r} takes one value, not a list or a mapping")
            data[key] = _check_value(model_cls if key in model_keys else train_cls, key, data[key])
            check_number(key, data[key])  # here, where the error can name the line
            check_choice(key, data[key])
        except InputError as err:
            raise InputError(f"{where}: {err}") from None
    return {str(key): value for key, value in data.items()}


def load_config(task: str, path: str | Path | None = None, *, preset: str | None = None, **overrides: object) -> tuple:
    """(model config, training config) of ``task`` ("classify", "translate" or "pretrain") as a train command builds
    them: the ``preset`` (default: the task's), the recipe file ``path`` (``configs/*.yaml``, as ``--config``), then
    ``overrides`` (as ``--set``: ``load_config("classify", "configs/rt-polarity.yaml", epochs=5)``)."""
    if task not in TASK_PRESETS:
        raise InputError(f"unknown task {task!r}; expected one of {', '.join(TASK_PRESETS)}")
    settings = load_config_file(path, task) if path is not None else {}
    settings.update(overrides)
    return task_configs(task, preset, settings)


def _check_value(cls: type, key: str, value: object) -> object:
    """A YAML value for field ``key`` of ``cls``: strings are parsed as ``--set`` parses them (YAML reads ``1e-3``
    as a string), other scalars must have the field's type (an int is a valid float, a bool is not a number)."""
    if isinstance(value, str):
        return _parse_value(cls, key, value)
    hint = typing.get_type_hints(cls)[key]
    options = (
        typing.get_args(hint)
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        else (hint,)
    )
    if value is None and type(None) in options:
        return None
    target = next(t for t in options if t is not type(None))
    if target is bool and isinstance(value, bool):
        return value
    if target is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if target is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise InputError(f"config key {key}={value!r} is not a valid {target.__name__}")


def task_of(model_cls: type) -> str:
    """The task a model config belongs to: "classify", "translate" or "pretrain"."""
    if issubclass(model_cls, MaskedLMConfig):
        return "pretrain"
    return "classify" if issubclass(model_cls, ClassifierConfig) else "translate"


def build_configs(model_cls: type, model_base: dict, train_base: dict, overrides: dict[str, object]):
    """Apply ``overrides`` (strings from ``--set`` or typed values from YAML) on top of the two bases: the model
    config and the training config of the model's task.

    Each key goes to whichever of the two has it; a key of the other task's training is refused naming the key and
    the task, any other unknown key lists the valid keys.
    """
    task = task_of(model_cls)
    train_cls = TASK_TRAIN_CONFIGS[task]
    model_keys = {f.name for f in fields(model_cls)}
    train_keys = {f.name for f in fields(train_cls)}
    model_kwargs, train_kwargs = dict(model_base), dict(train_base)
    for key, value in overrides.items():
        if key in model_keys:
            target_cls, target = model_cls, model_kwargs
        elif key in train_keys:
            target_cls, target = train_cls, train_kwargs
        else:
            train_config_class(task, key)  # a key of the other task: named as such
            valid = ", ".join(sorted(model_keys | train_keys))
            raise InputError(f"unknown config key {key!r}; valid keys: {valid}")
        target[key] = _parse_value(target_cls, key, value) if isinstance(value, str) else value
    return model_cls(**model_kwargs), train_cls(**train_kwargs)


# The budgets a resumed run may be given more of: its schedule is then planned again over the new number of steps.
BUDGET_KEYS = ("epochs", "max_steps", "max_minutes")


def budget_grows(key: str, old: float, new: float) -> bool:
    """``new`` allows at least as much training as ``old`` (for max_steps and max_minutes, 0 means no limit)."""
    if key != "epochs" and (old == 0 or new == 0):
        return new == 0
    return new >= old


def check_resume_settings(saved: dict, requested: dict[str, object], model_cls: type) -> dict[str, object]:
    """A resumed run continues with its saved configuration: ``requested`` settings (``--set`` strings or typed flag
    values) equal to the saved ones are accepted, a differing one is refused naming the key and both values. The
    budgets (``BUDGET_KEYS``) may grow: returns those that do, with their new values.

    ``saved`` is the run's config.json. Two keys are resolved by the run itself and compared accordingly:
    ``vocab_size`` is the tokenizer's upper bound (the saved value is the size reached), ``n_classes=0`` means
    "one per label".
    """
    model_keys = {f.name for f in fields(model_cls)}
    grown: dict[str, object] = {}
    for key, value in requested.items():
        if key in model_keys:
            section, cls = "model", model_cls
        else:
            section, cls = "train", train_config_class(task_of(model_cls), key)
        if key not in {f.name for f in fields(cls)}:
            raise InputError(f"unknown config key {key!r}")
        value = _parse_value(cls, key, value) if isinstance(value, str) else value
        old = saved.get(section, {}).get(key)
        if key == "vocab_size" and isinstance(old, int) and isinstance(value, int) and value >= old:
            continue
        if key == "n_classes" and value == 0:
            continue
        if value == old:
            continue
        if key in BUDGET_KEYS and isinstance(old, (int, float)) and isinstance(value, (int, float)):
            if budget_grows(key, old, value):
                grown[key] = value
                continue
            raise InputError(
                f"--resume: {key}={value!r} is a smaller budget than the run's saved {key}={old!r}"
                f"{' (no limit)' if old == 0 else ''}; a resumed run's {', '.join(BUDGET_KEYS)} may grow, not shrink"
            )
        raise InputError(
            f"--resume: {key}={value!r} differs from the run's saved {key}={old!r}; a resumed run continues with "
            f"its saved configuration (drop the setting, or train into a new --out); only its "
            f"{', '.join(BUDGET_KEYS)} may grow"
        )
    return grown


def task_configs(
    task: str, preset_name: str | None, overrides: dict[str, object], train_base: dict | None = None
) -> tuple:
    """(model config, training config) of ``task``: its preset (classify: ``default``, translate: ``small``, unless
    ``preset_name``) under ``train_base`` and ``overrides``, each value checked."""
    if task not in TASK_PRESETS:
        raise InputError(f"unknown task {task!r}; expected one of {', '.join(TASK_PRESETS)}")
    model_cls, presets, default = TASK_PRESETS[task]
    return build_configs(model_cls, preset(presets, preset_name or default), train_base or {}, overrides)


def check_task_configs(task: str, model_cfg: object, train_cfg: object) -> tuple:
    """(model_cfg, train_cfg) for a training of ``task``: either one None is the task's default (as a train command
    builds it with no ``--config`` or ``--set``); another task's config, a dict, or the pair ``load_config``
    returns is a ``TypeError`` naming the argument, before a training starts from it."""
    defaults = task_configs(task, None, {}) if model_cfg is None or train_cfg is None else (None, None)
    model_cfg = defaults[0] if model_cfg is None else model_cfg
    train_cfg = defaults[1] if train_cfg is None else train_cfg
    for name, value, cls in (
        ("model_cfg", model_cfg, TASK_PRESETS[task][0]),
        ("train_cfg", train_cfg, TASK_TRAIN_CONFIGS[task]),
    ):
        if not isinstance(value, cls):
            raise TypeError(
                f"{name} is a {type(value).__name__}, not a {cls.__name__}: use the pair "
                f"model_cfg, train_cfg = attnkit.load_config({task!r}, ...)"
            )
    return model_cfg, train_cfg


def preset_shape(model_cls: type, presets: dict[str, dict], name: str) -> dict[str, object]:
    """Every model key that preset ``name`` stands for: its own keys over the task's defaults (``default`` is the
    defaults: {} as overrides, but a whole shape to compare a run's with)."""
    return dataclasses.asdict(model_cls(**preset(presets, name)))


def preset(presets: dict[str, dict], name: str) -> dict:
    """The overrides that preset ``name`` (or an alias of it) stands for."""
    if name not in presets and PRESET_ALIASES.get(name) in presets:
        name = PRESET_ALIASES[name]
    if name not in presets:
        raise InputError(f"unknown preset {name!r}; choose one of {', '.join(presets)}")
    return dict(presets[name])
