"""attnkit: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017), from scratch on PyTorch.

The Python API: train, load and run models with the names below, all importable from ``attnkit`` itself::

    import attnkit

    model_cfg, train_cfg = attnkit.load_config("classify", "configs/quickstart.yaml")
    examples = attnkit.read_labeled("examples/seed000_train.tsv")
    attnkit.train_classifier(examples, model_cfg=model_cfg, train_cfg=train_cfg, out_dir="runs/seed000")
    print(attnkit.ClassifierRun("runs/seed000").predict(["A gorgeous, moving film."]))

The names are imported lazily (PEP 562): ``import attnkit`` imports neither torch nor any submodule, so the command
line starts fast; the first use of a name imports the module that defines it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.2.0"

# Each public name and the module that defines it; attnkit/classify.py and attnkit/translate.py re-export some of
# them as well (``from attnkit.classify import ClassifierRun``).
_EXPORTS: dict[str, str] = {
    # A trained run directory: predict, translate, evaluate
    "ClassifierRun": "attnkit.tasks.classify.predict",
    "Prediction": "attnkit.tasks.classify.predict",
    "TranslatorRun": "attnkit.tasks.translate.predict",
    "load_run": "attnkit.runs.load",
    # Training: each writes a run directory the rest of attnkit reads
    "train_classifier": "attnkit.tasks.classify.train",
    "train_translator": "attnkit.tasks.translate.train",
    "pretrain_encoder": "attnkit.tasks.pretrain.train",
    # Pretrained encoders: a BERT folder, "minilm" or a pretrain run, to fine-tune from or to embed with
    "load_pretrained": "attnkit.interop.bert.load",
    "embed": "attnkit.interop.bert.load",
    # Configs: presets, recipe files (configs/*.yaml) and overrides, checked
    "load_config": "attnkit.config.sources",
    "ClassifierConfig": "attnkit.config.models",
    "TranslatorConfig": "attnkit.config.models",
    "MaskedLMConfig": "attnkit.config.models",
    "ClassifierTrainConfig": "attnkit.config.training",
    "TranslatorTrainConfig": "attnkit.config.training",
    "PretrainTrainConfig": "attnkit.config.training",
    # Data: files and the dataset recipes
    "read_labeled": "attnkit.data.readers.labeled",
    "read_parallel_tsv": "attnkit.data.readers.parallel",
    "read_parallel_files": "attnkit.data.readers.parallel",
    "Example": "attnkit.data.readers.labeled",
    "Pair": "attnkit.data.readers.parallel",
    "fetch": "attnkit.data.recipes",
    # Builders (config -> modules) and the models they build
    "build_classifier": "attnkit.model.build",
    "build_translator": "attnkit.model.build",
    "build_masked_lm": "attnkit.model.build",
    "Transformer": "attnkit.model.transformer",
    "TransformerClassifier": "attnkit.model.classifier",
    # Decoding a built translator (§6.1): token ids in, token ids out
    "greedy_decode": "attnkit.decoding.greedy",
    "beam_search": "attnkit.decoding.beam",
    # Where a training runs: the device (default the CPU) and, under torchrun, this process's rank
    "TrainContext": "attnkit.training.task",
    # The errors: bad input (a ValueError), and a training that diverged (a RuntimeError; skip_nonfinite=true skips
    # such steps instead)
    "InputError": "attnkit.errors",
    "NonFiniteError": "attnkit.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> object:
    """The public name ``name``, imported from its module on first use (PEP 562) and kept."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'attnkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain attribute lookup
    return value


def __dir__() -> list[str]:
    """What tab completion offers: the public names and the module's dunders, not its own imports (``importlib``,
    ``annotations``, ``TYPE_CHECKING``) nor the submodules loaded so far."""
    return sorted({name for name in globals() if name.startswith("__")} | set(__all__))


if TYPE_CHECKING:  # what type checkers and editors see; at run time, __getattr__ above
    from attnkit.config.models import ClassifierConfig, MaskedLMConfig, TranslatorConfig
    from attnkit.config.sources import load_config
    from attnkit.config.training import ClassifierTrainConfig, PretrainTrainConfig, TranslatorTrainConfig
    from attnkit.data.readers.labeled import Example, read_labeled
    from attnkit.data.readers.parallel import Pair, read_parallel_files, read_parallel_tsv
    from attnkit.data.recipes import fetch
    from attnkit.decoding.beam import beam_search
    from attnkit.decoding.greedy import greedy_decode
    from attnkit.errors import InputError, NonFiniteError
    from attnkit.interop.bert.load import embed, load_pretrained
    from attnkit.model.build import build_classifier, build_masked_lm, build_translator
    from attnkit.model.classifier import TransformerClassifier
    from attnkit.model.transformer import Transformer
    from attnkit.runs.load import load_run
    from attnkit.tasks.classify.predict import ClassifierRun, Prediction
    from attnkit.tasks.classify.train import train_classifier
    from attnkit.tasks.pretrain.train import pretrain_encoder
    from attnkit.tasks.translate.predict import TranslatorRun
    from attnkit.tasks.translate.train import train_translator
    from attnkit.training.task import TrainContext
