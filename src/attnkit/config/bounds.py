"""Which values each config key accepts: its field's type; for a number, a range (``BOUNDS``); for a string, one of
its choices (``CHOICES``).

The values every number of a config may take, checked in one place (``check_fields``) for every config, however it
was made: --set, a YAML file, a run directory's config.json, or Python. Each config's ``__post_init__`` calls it, so
an impossible value is an ``InputError`` naming the key and the value before any config holds it.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass, fields

from attnkit.errors import InputError

INT64_MAX = 2**63 - 1  # every integer key is stored and used as a 64-bit integer (seeds, counts, tensor sizes)
MAX_THREADS = 1024  # CPU threads a command takes (--threads): more than any CPU has cores; libgomp crashed at 100,000
# Model sizes have ceilings far above any model attnkit trains (Table 3's "big": d_model 1024, d_ff 4096, 6 layers;
# the largest vocabularies in use hold about 256,000 tokens), so that a typo or an untrusted run directory cannot
# make attnkit allocate without bound: a run's weights must also hold the model its config describes (runs/load.py),
# and a training must fit the device's memory (training/run_setup.py), both sized by model/size.py.
SIZE_CEILING = "attnkit's ceiling for it, far above any model it trains"


@dataclass(frozen=True)
class Bound:
    """The numbers a config key accepts: ``low`` to ``high``, each end included unless it is marked open."""

    low: float
    high: float = INT64_MAX
    low_open: bool = False
    high_open: bool = False
    why: str = ""  # said when a value above ``high`` is refused

    def admits(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        if self.high in (INT64_MAX, math.inf):
            return ("positive" if self.low_open else ">= 0") if self.low == 0 else f">= {_number(self.low)}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{_number(self.low)}, {_number(self.high)}{right}"


def _number(x: float) -> str:
    return f"{int(x):,}" if x == int(x) and abs(x) >= 1000 else f"{x:g}"


_FRACTION = Bound(0.0, 1.0, high_open=True)  # [0, 1): a share of something that must leave some of it
_POSITIVE = Bound(0.0, math.inf, low_open=True)
_NON_NEGATIVE = Bound(0.0, math.inf)
_COUNT = Bound(1)  # integers >= 1
_OPTIONAL = Bound(0)  # integers >= 0, where 0 means none, or no limit
BOUNDS: dict[str, Bound] = {
    # Model configs
    "vocab_size": Bound(1, 2**24, why=SIZE_CEILING),
    "d_model": Bound(1, 2**16, why=SIZE_CEILING),
    "n_heads": Bound(1, 2**12, why=SIZE_CEILING),
    "d_head": Bound(1, 2**16, why=SIZE_CEILING),
    "d_ff": Bound(1, 2**18, why=SIZE_CEILING),
    "n_layers": Bound(1, 2**10, why=SIZE_CEILING),
    # Attention's time and memory grow with the square of the length.
    "max_len": Bound(1, 2**16, why=f"{SIZE_CEILING}; longer texts are truncated, as max_len_policy says"),
    "n_classes": Bound(0, 2**20, why=SIZE_CEILING),
    "n_token_types": Bound(0, 2**10, why=SIZE_CEILING),
    "dropout": _FRACTION,
    "attention_dropout": _FRACTION,
    "layer_norm_eps": _POSITIVE,
    # Training configs
    "lr": _POSITIVE,
    "lr_factor": _POSITIVE,
    "beta1": _FRACTION,  # Adam's decay rates of its moment estimates: in [0, 1) (Kingma & Ba 2015, Algorithm 1)
    "beta2": _FRACTION,
    "adam_eps": _POSITIVE,
    "weight_decay": _NON_NEGATIVE,
    "label_smoothing": _FRACTION,
    "clip_norm": _NON_NEGATIVE,
    "warmup_ratio": _FRACTION,
    "max_minutes": _NON_NEGATIVE,
    "layer_lr_decay": Bound(0.0, 1.0, low_open=True),
    "mask_prob": Bound(0.0, 1.0, low_open=True, high_open=True),
    "valid_fraction": _FRACTION,
    **dict.fromkeys(("accum_steps", "epochs", "min_freq", "checkpoint_every", "batch_size", "bucket_factor"), _COUNT),
    "max_tokens": _COUNT,
    **dict.fromkeys(("warmup_steps", "max_steps", "patience", "eval_every", "keep_last", "seed"), _OPTIONAL),
}


def field_types(cls: type) -> dict[str, tuple[type, ...]]:
    """Each field of config class ``cls`` -> the types its value may have (``int | None`` -> (int, NoneType))."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        out[name] = typing.get_args(hint) if union else (hint,)
    return out


def _has_type(value: object, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # a bool is an int to Python, never a number to a config
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return any(isinstance(value, kind) for kind in kinds if kind is not bool)


def check_fields(config: typing.Any) -> None:
    """Every field of ``config`` (a config dataclass) has its declared type; every number is finite and inside its
    ``BOUNDS``; every string key holds one of its ``CHOICES``. Called by each config's ``__post_init__``, so no
    config with a NaN or an absurd size can exist."""
    kinds_of = field_types(type(config))
    for f in fields(config):
        key, value, kinds = f.name, getattr(config, f.name), kinds_of[f.name]
        if not _has_type(value, kinds):
            expected = " or ".join("None" if kind is type(None) else kind.__name__ for kind in kinds)
            raise InputError(f"config key {key}={value!r} is not a valid {expected}")
        check_number(key, value)
        check_choice(key, value)


def check_number(key: str, value: object) -> None:
    """A number set for config key ``key`` is finite and inside ``BOUNDS[key]`` (anything else passes: its type is
    checked apart)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if not math.isfinite(value):
        raise InputError(f"config key {key}={value} must be a finite number")
    bound = BOUNDS[key]
    if not bound.admits(value):
        if value > bound.high and bound.high == INT64_MAX:
            raise InputError(
                f"config key {key}={value} must be at most {INT64_MAX:,} (it is stored as a 64-bit integer)"
            )
        why = f" ({bound.why})" if bound.why and value > bound.high else ""
        raise InputError(f"config key {key}={value} must be {bound}{why}")


BLEU_TOKENIZERS = ("13a", "ko-mecab", "ja-mecab", "zh", "intl", "char")  # sacreBLEU's tokenizers attnkit offers
CHOICES: dict[str, tuple[str, ...]] = {  # the string keys, each with the values it takes
    "norm": ("post", "pre"),
    "positional": ("sinusoidal", "learned"),
    "activation": ("relu", "gelu"),
    "pooling": ("mean", "cls"),
    "optimizer": ("adam", "adamw"),
    "schedule": ("linear", "noam", "constant", "auto"),
    "tokenizer": ("word", "bpe", "wordpiece"),
    "pretokenize": ("none", "morphemes"),
    "max_len_policy": ("truncate", "error"),
    "precision": ("fp32", "bf16", "fp16"),
    "bleu_tokenize": BLEU_TOKENIZERS,
}


def check_choice(key: str, value: object) -> None:
    """The value set for config key ``key`` is one of its ``CHOICES`` (anything passes for a key without)."""
    if key in CHOICES and value not in CHOICES[key]:
        raise InputError(f"config key {key}={value!r}; expected one of {', '.join(CHOICES[key])}")
