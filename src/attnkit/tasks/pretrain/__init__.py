"""Pretraining an encoder on your own text with BERT's masked-language-model objective: ``corruption`` (which tokens
are chosen and how they are replaced, §3.1), ``train`` (``pretrain_encoder`` and the task the one loop runs),
``encoder`` (a pretraining run as the start of a classifier)."""

from attnkit.tasks.pretrain.corruption import MASK_TOKEN, batch_seed, choose_and_corrupt
from attnkit.tasks.pretrain.encoder import classifier_config, load_pretrained_run
from attnkit.tasks.pretrain.train import MaskedLMTask, PretrainSummary, maskable_ids, pretrain_encoder

__all__ = [
    "MASK_TOKEN",
    "MaskedLMTask",
    "PretrainSummary",
    "batch_seed",
    "choose_and_corrupt",
    "classifier_config",
    "load_pretrained_run",
    "maskable_ids",
    "pretrain_encoder",
]
