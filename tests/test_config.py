"""Every number of every config is checked where the config is made: finite, inside its range, of its type; so a
NaN learning rate or an absurd size is an error line naming the key, however the config was given."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest

from attnkit.config import (
    BOUNDS,
    TASK_PRESETS,
    TASK_TRAIN_CONFIGS,
    ClassifierConfig,
    ClassifierTrainConfig,
    TranslatorConfig,
    build_configs,
    load_config_file,
)
from attnkit.errors import InputError

CONFIGS = [cls for cls, _, _ in TASK_PRESETS.values()] + list(TASK_TRAIN_CONFIGS.values())
NUMBERS = sorted(
    {(cls, f.name) for cls in CONFIGS for f in fields(cls) if isinstance(getattr(cls(), f.name), (int, float))}
    - {(cls, f.name) for cls in CONFIGS for f in fields(cls) if isinstance(getattr(cls(), f.name), bool)},
    key=lambda pair: (pair[0].__name__, pair[1]),
)


def test_every_number_of_every_config_has_a_range():
    assert NUMBERS and {key for _, key in NUMBERS} <= set(BOUNDS)
    assert set(BOUNDS) <= {f.name for cls in CONFIGS for f in fields(cls)}, "a bound for a key no config has"


@pytest.mark.parametrize(("cls", "key"), NUMBERS, ids=[f"{cls.__name__}.{key}" for cls, key in NUMBERS])
def test_each_number_is_refused_outside_its_range_and_when_not_finite(cls, key):
    bound = BOUNDS[key]
    default = getattr(cls(), key)
    assert bound.admits(default)
    below = bound.low if bound.low_open else bound.low - (1 if isinstance(default, int) else 1e-9)
    outside = [below] + ([bound.high if bound.high_open else bound.high + 1] if bound.high != math.inf else [])
    if isinstance(default, float):
        outside += [math.nan, math.inf, -math.inf]
    for value in outside:
        with pytest.raises(InputError, match=f"^config key {key}="):
            cls(**{key: type(default)(value) if not math.isnan(value) and not math.isinf(value) else value})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lr": "nan"}, "config key lr=nan must be a finite number"),
        ({"beta1": "1"}, r"config key beta1=1.0 must be in \[0, 1\)"),
        ({"beta2": 2}, r"config key beta2=2 must be in \[0, 1\)"),  # a YAML number
        ({"epochs": True}, "config key epochs=True is not a valid int"),  # a YAML boolean is not a count
        ({"lr": [1e-3]}, r"config key lr=\[0.001\] is not a valid float"),
        ({"max_len": "100000000"}, r"max_len=100000000 must be in \[1, 65,536\] \(attnkit's ceiling"),
        ({"d_head": 0}, r"config key d_head=0 must be in \[1, 65,536\]$"),  # the ceiling's reason only above it
    ],
)
def test_values_from_set_and_from_yaml_are_checked_alike(overrides, message):
    with pytest.raises(InputError, match=message):
        build_configs(ClassifierConfig, {}, {}, overrides)


def test_a_yaml_nan_is_refused_and_a_yaml_exponent_is_a_number(tmp_path):
    (tmp_path / "nan.yaml").write_text("lr: .nan\n")
    with pytest.raises(InputError, match="lr=nan must be a finite number"):
        build_configs(ClassifierConfig, {}, {}, load_config_file(tmp_path / "nan.yaml", "classify"))
    (tmp_path / "exp.yaml").write_text("lr: 1e-3\n")  # PyYAML reads this as a string
    _, train = build_configs(ClassifierConfig, {}, {}, load_config_file(tmp_path / "exp.yaml", "classify"))
    assert train.lr == 1e-3


def test_a_config_path_that_is_a_directory_is_an_input_error(tmp_path):
    # It was an IsADirectoryError from pathlib (``load_config("classify", "configs")``).
    (tmp_path / "configs").mkdir()
    with pytest.raises(InputError, match=r"configs: is a directory, not a config file$"):
        load_config_file(tmp_path / "configs", "classify")


def test_integers_are_accepted_where_floats_are_and_none_where_optional():
    assert ClassifierTrainConfig(lr=1).lr == 1
    assert TranslatorConfig(d_head=None).d_head is None
