"""The training configs: what every task's training shares (``TrainConfig``: the optimizer and schedule of §5.3,
the regularization of §5.4, the budgets, checkpoints), each task's own, and the defaults of fine-tuning a pretrained
encoder.

Training configs, one per task: a key that does not apply to the task is refused, never silently ignored (by
``attnkit.config.sources.train_config_class``, which names the task the key belongs to).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnkit.config.bounds import check_fields
from attnkit.errors import InputError

# sacreBLEU's tokenizers a translator's BLEU may be scored with (evaluation/bleu.py); 13a is sacreBLEU's default.


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
    max_minutes: float = 0.0  # stop (after evaluating and saving) once this command has trained this long; 0 = none
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
        if self.pretokenize != "none" and self.tokenizer != "word":
            raise InputError(
                f"config key pretokenize={self.pretokenize} applies to tokenizer=word, not {self.tokenizer}"
            )


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


# Fine-tuning a pretrained encoder (--init-from): a small learning rate with warmup and weight decay, as users of
# BERT-family models expect (Devlin et al. 2019 use 2e-5 to 5e-5, 2 to 4 epochs); the best epoch is kept.
FINE_TUNE_TRAIN_DEFAULTS: dict = dict(lr=5e-5, warmup_ratio=0.1, weight_decay=0.01, epochs=3, patience=0, batch_size=32)
FINE_TUNE_SETTABLE_MODEL_KEYS = (
    "n_classes",
    "pooling",
    "dropout",
    "attention_dropout",
)  # the rest comes with the pretrained weights
