"""Configuration: frozen dataclasses for the model and for training, presets, YAML files, checked overrides.

Modules never see these objects: ``attnkit.model.build`` maps a config to module arguments, in one place.
Every impossible value raises ``InputError`` (a ``ValueError``) naming the key and the value.

- ``models``: the model configs (the paper's hyperparameters, each field citing its section) and the presets;
- ``training``: the training configs, one per task (§5.3, §5.4), and the fine-tuning defaults;
- ``bounds``: the values each key accepts (``BOUNDS``), checked for every config however it was made;
- ``sources``: presets, recipe files and ``--set`` overrides made into configs, each key routed to its config, and
  what a resumed run may be given.

The names below are importable from here (``from attnkit.config import TranslatorConfig``).
"""

from attnkit.config.bounds import (
    BLEU_TOKENIZERS,
    BOUNDS,
    INT64_MAX,
    MAX_THREADS,
    SIZE_CEILING,
    Bound,
    check_fields,
    check_number,
)
from attnkit.config.models import (
    CLASSIFIER_PRESETS,
    PRESET_ALIASES,
    TASK_PRESETS,
    TRANSLATOR_PRESETS,
    ClassifierConfig,
    MaskedLMConfig,
    TransformerConfig,
    TranslatorConfig,
)
from attnkit.config.sources import (
    BUDGET_KEYS,
    budget_grows,
    build_configs,
    check_resume_settings,
    check_task_configs,
    load_config,
    load_config_file,
    parse_overrides,
    preset,
    preset_shape,
    task_configs,
    task_of,
    train_config_class,
)
from attnkit.config.training import (
    FINE_TUNE_SETTABLE_MODEL_KEYS,
    FINE_TUNE_TRAIN_DEFAULTS,
    TASK_TRAIN_CONFIGS,
    ClassifierTrainConfig,
    PretrainTrainConfig,
    TrainConfig,
    TranslatorTrainConfig,
)

__all__ = [
    "BLEU_TOKENIZERS",
    "BOUNDS",
    "BUDGET_KEYS",
    "CLASSIFIER_PRESETS",
    "FINE_TUNE_SETTABLE_MODEL_KEYS",
    "FINE_TUNE_TRAIN_DEFAULTS",
    "INT64_MAX",
    "MAX_THREADS",
    "PRESET_ALIASES",
    "SIZE_CEILING",
    "TASK_PRESETS",
    "TASK_TRAIN_CONFIGS",
    "TRANSLATOR_PRESETS",
    "Bound",
    "ClassifierConfig",
    "ClassifierTrainConfig",
    "MaskedLMConfig",
    "PretrainTrainConfig",
    "TrainConfig",
    "TransformerConfig",
    "TranslatorConfig",
    "TranslatorTrainConfig",
    "budget_grows",
    "build_configs",
    "check_fields",
    "check_number",
    "check_resume_settings",
    "check_task_configs",
    "load_config",
    "load_config_file",
    "parse_overrides",
    "preset",
    "preset_shape",
    "task_configs",
    "task_of",
    "train_config_class",
]
