"""Configuration: frozen dataclasses for the model and for training, presets, YAML files, checked overrides.

Modules never see these objects: ``attnkit.model.build`` maps a config to module arguments, in one place.
Every impossible value raises ``InputError`` (a ``ValueError``) naming the key and the value.

Why one file of ~550 lines: every key a user can set is declared here, with the values it may take (``BOUNDS``,
checked for every config however it was made), next to the one parser of ``--set`` / YAML values and the rule that
routes a key to its config (model, or the task's training); split, the question "which keys exist, what may they
hold and where do they go" would be answered in several places.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path

from attnkit.errors import InputError


@dataclass(frozen=True)
class TransformerConfig:
    """What the encoder (and decoder) of every attnkit model share. Defaults are a small CPU-sized model."""

    vocab_size: int = 10000  # size of the (shared) vocabulary; for training, the tokenizer's maximum size
    d_model: int = 128  # width of every sub-layer output (§3.1)
    n_heads: int = 4  # h, parallel attention heads (§3.2.2)
    d_head: int | None = None  # d_k = d_v per head; None = d_model / n_heads, as in the paper
    d_ff: int = 512  # inner width of the feed-forward network (§3.3)
    n_layers: int = 2  # N, identical layers in the encoder (and in the decoder)
    max_len: int = 128  # longest sequence (in tokens) the positional encoding covers
    dropout: float = 0.1  # P_drop on sub-layer outputs and on embedding + position sums (§5.4)
    attention_dropout: float = 0.0  # dropout on attention weights: BERT-family fine-tuning; the paper uses none
    norm: str = "post"  # "post": LayerNorm(x + Sublayer(x)) as in the paper; "pre": x + Sublayer(LayerNorm(x))
    positional: str = "sinusoidal"  # "sinusoidal" (§3.5) or "learned" (Table 3, row E)
    activation: str = "relu"  # FFN non-linearity: "relu" (eq. 2) or "gelu"
    scale_embeddings: bool = True  # multiply embeddings by sqrt(d_model) (§3.4)
    layer_norm_eps: float = 1e-5  # LayerNorm epsilon (PyTorch's default; BERT uses 1e-12)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.d_head is None and self.d_model % self.n_heads != 0:
            raise InputError(
                f"config: d_model={self.d_model} is not divisible by n_heads={self.n_heads} "
                "(set d_head to decouple them)"
            )
        _check_choice("norm", self.norm, ("post", "pre"))
        _check_choice("positional", self.positional, ("sinusoidal", "learned"))
        _check_choice("activation", self.activation, ("relu", "gelu"))


@dataclass(frozen=True)
class ClassifierConfig(TransformerConfig):
    """A text classifier. The defaults: d_model 128, 4 heads, d_ff 512, 2 layers (the ``vocab10k`` preset's shape)."""

    n_classes: int = 0  # C; 0 = one per label seen in training; 1 = a single logit for a binary task (sigmoid)
    pooling: str = "mean"  # "mean": masked mean over real tokens; "cls": the first token (a CLS token is prepended)
    n_token_types: int = 0  # BERT-family token-type (segment) embeddings; 0 = none, as in the paper
    embedding_norm: bool = False  # BERT-family LayerNorm after embeddings + positions

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_choice("pooling", self.pooling, ("mean", "cls"))


@dataclass(frozen=True)
class TranslatorConfig(TransformerConfig):
    """The encoder-decoder of Figure 1 with a shared vocabulary. The defaults are the CPU-sized ``small`` preset."""

    vocab_size: int = 8000
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    n_layers: int = 3
    max_len: int = 256
    tie_embeddings: bool = True  # share source/target embeddings and the pre-softmax projection (§3.4)


@dataclass(frozen=True)
class MaskedLMConfig(TransformerConfig):
    """An encoder pretrained with BERT's masked-language-model objective (Devlin et al. 2019, §3.1 Task #1).

    BERT-shaped by default (learned positions, no sqrt(d_model) scale, a LayerNorm after the embeddings, GELU,
    one token type), so that `attnkit export hf` writes it as a BERT folder and `classify train --init-from`
    fine-tunes it as it fine-tunes MiniLM."""

    vocab_size: int = 8000  # the tokenizer's maximum size, <mask> included
    positional: str = "learned"  # BERT's learned absolute positions (Table 3, row E)
    scale_embeddings: bool = False  # BERT does not scale its embeddings
    activation: str = "gelu"  # BERT's FFN uses the exact (erf) GELU
    n_token_types: int = 1  # one segment: single texts, no next-sentence pairs (BERT has 2)
    embedding_norm: bool = True  # BERT's LayerNorm after embeddings + positions
    layer_norm_eps: float = 1e-12  # BERT's


# ---------------------------------------------------------------------------------------------------------------
# Training configs, one per task: a key that does not apply to the task is refused, never silently ignored.


# sacreBLEU's tokenizers a translator's BLEU may be scored with (evaluation/bleu.py); 13a is sacreBLEU's default.
BLEU_TOKENIZERS = ("13a", "ko-mecab", "ja-mecab", "zh", "intl", "char")


@dataclass(frozen=True)
class TrainConfig:
    """What every task's training shares: the optimizer, the schedule, the budgets, checkpoints. The one loop
    (``attnkit.training.loop.fit``) reads only these keys; each task's config adds its own."""

    optimizer: str = "adamw"  # "adam" or "adamw" (decoupled weight decay)
    lr: float = 5e-4  # peak learning rate (schedules "linear" and "constant"); "noam" uses lr_factor instead
    lr_factor: float = 1.0  # "noam": lr = lr_factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (eq. 3)
    # "linear": warmup then linear decay to 0 at the planned last step; "noam": eq. 3; "constant": warmup then flat;
    # "auto": "linear" when a step budget (max_steps) is set, else "noam" (the paper's, for open-ended runs)
    schedule: str = "linear"
    warmup_steps: int = 0  # 0 = sized by the loop: warmup_ratio of the planned steps ("noam": 4,000, §5.3)
    warmup_ratio: float = 0.1  # share of the planned steps spent warming up when warmup_steps is 0
    beta1: float = 0.9
    beta2: float = 0.98  # §5.3 uses beta2 = 0.98
    adam_eps: float = 1e-9  # §5.3
    weight_decay: float = 0.01
    label_smoothing: float = 0.0  # epsilon_ls (§5.4 uses 0.1 for translation)
    clip_norm: float = 1.0  # max gradient norm; 0 = no clipping
    accum_steps: int = 1  # consecutive batches whose gradients make one optimizer step (loss over all their units)
    epochs: int = 20  # upper bound on passes over the training data
    max_steps: int = 0  # optimizer steps; 0 = no limit beyond epochs
    max_minutes: float = 0.0  # stop (after evaluating and saving) once training has run this long; 0 = no limit
    eval_every: int = 0  # evaluate every N steps; 0 = at the end of each epoch (and always at the end of training)
    patience: int = 4  # stop after this many evaluations without improvement; 0 = never stop early
    checkpoint_every: int = 500  # save the training state (and a step checkpoint, if keep_last) every N steps
    keep_last: int = 0  # step checkpoints kept in RUN/checkpoints (for `attnkit average`); 0 = none
    skip_nonfinite: bool = False  # a batch with a NaN/inf loss or gradient: False = stop the run, True = skip it
    # "fp32"; "bf16": bfloat16 autocast for the forward pass (GPUs, CPUs with AMX / AVX512-BF16); "fp16": float16
    # autocast with a gradient scaler (CUDA only)
    precision: str = "fp32"
    tf32: bool = True  # CUDA: float32 matrix multiplications on TF32 tensor cores (Ampere and newer); ignored elsewhere
    # torch.compile the forward pass and loss of a batch into fused kernels (training.kernels). Off by default: the
    # first steps pay 30-90 s of compilation, which a long run on a GPU earns back (docs/gpu.md) and a CPU does not
    compile: bool = False
    # Each training step replayed from CUDA graphs recorded once per batch shape (batches padded to a bounded set of
    # shapes) instead of launched kernel by kernel from Python (training.graphs): translation on one CUDA process,
    # one batch a step, fp32 or bf16. None (default): wherever it can; true: insist (an error names what is missing);
    # false: never
    cuda_graphs: bool | None = None
    tensorboard: bool = False  # also log every metric to RUN/tensorboard (needs `pip install tensorboard`)
    tokenizer: str = "word"  # "word" (lower-cased words and punctuation), "bpe" (lossless) or "wordpiece"
    # "morphemes": the word vocabulary's units are Korean morphemes (MeCab-ko, `pip install 'attnkit[ko]'`); "none"
    pretokenize: str = "none"
    min_freq: int = 2  # word/subword vocabulary: minimum count to get an id
    max_len_policy: str = "truncate"  # over-long inputs: "truncate" (counted and reported) or "error"
    seed: int = 0

    def __post_init__(self) -> None:
        check_fields(self)
        _check_choice("optimizer", self.optimizer, ("adam", "adamw"))
        _check_choice("schedule", self.schedule, ("linear", "noam", "constant", "auto"))
        _check_choice("tokenizer", self.tokenizer, ("word", "bpe", "wordpiece"))
        _check_choice("pretokenize", self.pretokenize, ("none", "morphemes"))
        if self.pretokenize != "none" and self.tokenizer != "word":
            raise InputError(
                f"config key pretokenize={self.pretokenize} applies to tokenizer=word, not {self.tokenizer}"
            )
        _check_choice("max_len_policy", self.max_len_policy, ("truncate", "error"))
        _check_choice("precision", self.precision, ("fp32", "bf16", "fp16"))


@dataclass(frozen=True)
class ClassifierTrainConfig(TrainConfig):
    """Training a classifier: sentence batches, best epoch by validation accuracy, early stopping."""

    batch_size: int = 32  # sentences per batch
    bucket_factor: int = 50  # batches cut from length-sorted pools of bucket_factor batches; 1 = random
    layer_lr_decay: float = 1.0  # layer i of N (from the top) learns at lr * layer_lr_decay^i; 1 = one lr


@dataclass(frozen=True)
class TranslatorTrainConfig(TrainConfig):
    """Training a translator: the paper's recipe (§5.3, §5.4) by default, token-budget batches, the last K
    checkpoints kept for averaging (§6.1), the best by validation BLEU (or loss) as the model."""

    optimizer: str = "adam"
    lr: float = 1e-3  # peak of the "linear" schedule that a step budget selects (schedule "auto")
    schedule: str = "auto"
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 0.0
    epochs: int = 1000
    eval_every: int = 500
    patience: int = 0
    keep_last: int = 5  # the paper averages the last 5 checkpoints (§6.1)
    tokenizer: str = "bpe"
    max_tokens: int = 4096  # source + target tokens per batch (padding included)
    valid_bleu: bool = True  # greedy-decode the validation set at each evaluation; BLEU then decides the best
    # sacreBLEU's tokenizer for that BLEU: "13a" (its default), "ko-mecab" (Korean targets; `attnkit[ko]`),
    # "ja-mecab", "zh", "intl" or "char"
    bleu_tokenize: str = "13a"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_choice("bleu_tokenize", self.bleu_tokenize, BLEU_TOKENIZERS)


@dataclass(frozen=True)
class PretrainTrainConfig(TrainConfig):
    """Pretraining an encoder with the masked-language-model objective on plain text: sentence batches, the loss
    over the chosen tokens only, the best evaluation by held-out masked-token loss."""

    # A subword vocabulary learnt from the text (with a leading <cls>). BPE, because the `tokenizers` library's
    # WordPiece trainer numbers its "##" pieces in hash-map order, so two trainings on the same text can differ
    # (huggingface/tokenizers#1794) and a run would not reproduce; its BPE trainer without that prefix does not.
    tokenizer: str = "bpe"
    batch_size: int = 64  # texts per batch
    bucket_factor: int = 50  # batches cut from length-sorted pools of bucket_factor batches; 1 = random
    mask_prob: float = 0.15  # share of each text's tokens chosen for prediction (BERT §3.1: 15%)
    valid_fraction: float = 0.05  # share of the lines held out to measure masked-token loss and accuracy; 0 = none
    epochs: int = 10
    patience: int = 0  # pretraining is judged by its last epochs; 0 = never stop early


TASK_TRAIN_CONFIGS: dict[str, type[TrainConfig]] = {
    "classify": ClassifierTrainConfig,
    "translate": TranslatorTrainConfig,
    "pretrain": PretrainTrainConfig,
}


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
# The values every number of a config may take, checked in one place (``check_fields``) for every config, however
# it was made: --set, a YAML file, a run directory's config.json, or Python.

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


def _field_types(cls: type) -> dict[str, tuple[type, ...]]:
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
    ``BOUNDS``. Called by each config's ``__post_init__``, so no config with a NaN or an absurd size can exist."""
    kinds_of = _field_types(type(config))
    for f in fields(config):
        key, value, kinds = f.name, getattr(config, f.name), kinds_of[f.name]
        if not _has_type(value, kinds):
            expected = " or ".join("None" if kind is type(None) else kind.__name__ for kind in kinds)
            raise InputError(f"config key {key}={value!r} is not a valid {expected}")
        check_number(key, value)


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


def _check_choice(key: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InputError(f"config key {key}={value!r}; expected one of {', '.join(choices)}")


# ---------------------------------------------------------------------------------------------------------------
# Presets

CLASSIFIER_PRESETS: dict[str, dict] = {
    "default": {},
    # The default shape with a fixed 10,000-token vocabulary and 2 classes (d_model 128, 4 heads, d_ff 512, 2 layers).
    "vocab10k": dict(vocab_size=10000, d_model=128, n_heads=4, d_ff=512, n_layers=2, n_classes=2),
    # A tiny binary classifier on BERT's 30,522-token vocabulary: d_model 32, one layer, [CLS] pooling, one logit.
    "tiny-binary": dict(
        vocab_size=30522, d_model=32, n_heads=4, d_ff=32, n_layers=1, max_len=400, n_classes=1, pooling="cls"
    ),
}
# Earlier names, still accepted and not listed: the reference notes these shapes came from were numbered.
PRESET_ALIASES = {"seed000": "vocab10k", "seed001": "tiny-binary"}

TRANSLATOR_PRESETS: dict[str, dict] = {
    "small": {},  # d_model 256, 4 heads, d_ff 1024, 3 + 3 layers: trainable on a CPU in an hour
    "base": dict(d_model=512, n_heads=8, d_ff=2048, n_layers=6, dropout=0.1, vocab_size=37000),  # Table 3, "base"
    "big": dict(d_model=1024, n_heads=16, d_ff=4096, n_layers=6, dropout=0.3, vocab_size=37000),  # Table 3, "big"
}

# Each task's model config class, its presets and the preset used when none is named.
TASK_PRESETS: dict[str, tuple[type, dict[str, dict], str]] = {
    "classify": (ClassifierConfig, CLASSIFIER_PRESETS, "default"),
    "translate": (TranslatorConfig, TRANSLATOR_PRESETS, "small"),
    "pretrain": (MaskedLMConfig, {"default": {}}, "default"),
}


# Fine-tuning a pretrained encoder (--init-from): a small learning rate with warmup and weight decay, as users of
# BERT-family models expect (Devlin et al. 2019 use 2e-5 to 5e-5, 2 to 4 epochs); the best epoch is kept.
FINE_TUNE_TRAIN_DEFAULTS: dict = dict(lr=5e-5, warmup_ratio=0.1, weight_decay=0.01, epochs=3, patience=0, batch_size=32)
FINE_TUNE_SETTABLE_MODEL_KEYS = (
    "n_classes",
    "pooling",
    "dropout",
    "attention_dropout",
)  # the rest comes with the pretrained weights


# ---------------------------------------------------------------------------------------------------------------
# Overrides: "--set key=value" and YAML files


def _parse_value(cls: type, key: str, raw: str) -> object:
    """Turn the string ``raw`` into the type of field ``key`` of ``cls``."""
    options = _field_types(cls)[key]
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


def load_config_file(path: str | Path, task: str) -> dict[str, object]:
    """The config keys of a recipe file (``configs/*.yaml``, ``--config FILE``) for ``task``, each value checked.

    A recipe is a flat YAML mapping of the keys ``--set`` takes (model and training keys alike). A key the task does
    not have, a key given twice, a nested value or a value of the wrong type is an ``InputError`` naming the file,
    the line and the key, before anything is trained.
    """
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such config file") from None
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


def check_task_configs(task: str, model_cfg: object, train_cfg: object) -> None:
    """A ``TypeError`` naming the argument when ``model_cfg`` or ``train_cfg`` is not ``task``'s config (another
    task's, a dict, or the pair ``load_config`` returns), before a training starts from it."""
    for name, value, cls in (
        ("model_cfg", model_cfg, TASK_PRESETS[task][0]),
        ("train_cfg", train_cfg, TASK_TRAIN_CONFIGS[task]),
    ):
        if not isinstance(value, cls):
            raise TypeError(
                f"{name} is a {type(value).__name__}, not a {cls.__name__}: use the pair "
                f"model_cfg, train_cfg = attnkit.load_config({task!r}, ...)"
            )


def preset(presets: dict[str, dict], name: str) -> dict:
    """The overrides that preset ``name`` (or an alias of it) stands for."""
    if name not in presets and PRESET_ALIASES.get(name) in presets:
        name = PRESET_ALIASES[name]
    if name not in presets:
        raise InputError(f"unknown preset {name!r}; choose one of {', '.join(presets)}")
    return dict(presets[name])
