"""State-dict keys are a file format: run directories, the BERT import/export, CTranslate2 and ONNX export, the
torch.nn converters and the pickle import all name tensors by them. The golden file was captured from the models
as built before the builders took over the wiring (commit 4786351); any change to a key, its order or its shape
breaks every run directory written before it."""

import json
from pathlib import Path
from typing import Any

import pytest

from attnkit.config import ClassifierConfig, TranslatorConfig
from attnkit.model.build import build_classifier, build_translator, prepare_for_inference

GOLDEN = json.loads((Path(__file__).parent / "golden_state_dict_keys.json").read_text(encoding="utf-8"))
SMALL: dict[str, Any] = dict(vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=32)
CLASSIFIERS: dict[str, dict[str, Any]] = {
    "classifier_mean_post_sinusoidal": dict(pooling="mean", norm="post", n_classes=3),
    "classifier_cls_pre_sinusoidal": dict(pooling="cls", norm="pre", n_classes=3),
    "classifier_mean_pre_learned": dict(pooling="mean", norm="pre", positional="learned", n_classes=1),
    "classifier_cls_post_learned_token_types_embedding_norm": dict(
        pooling="cls",
        norm="post",
        positional="learned",
        n_token_types=2,
        embedding_norm=True,
        n_classes=2,
        activation="gelu",
        layer_norm_eps=1e-12,
    ),
}
TRANSLATORS: dict[str, dict[str, Any]] = {
    "translator_tied_post_sinusoidal": dict(norm="post"),
    "translator_untied_pre_learned": dict(norm="pre", positional="learned", tie_embeddings=False),
}


def _build(name: str):
    if name in CLASSIFIERS:
        return build_classifier(ClassifierConfig(**SMALL, **CLASSIFIERS[name]))
    return build_translator(TranslatorConfig(**SMALL, **TRANSLATORS[name]))


def test_golden_file_covers_every_model():
    assert set(GOLDEN) == set(CLASSIFIERS) | set(TRANSLATORS)


@pytest.mark.parametrize("name", [*CLASSIFIERS, *TRANSLATORS])
def test_state_dict_keys_and_shapes_are_the_golden_ones(name):
    model = _build(name)
    got = [[key, list(tensor.shape)] for key, tensor in model.state_dict().items()]
    assert got == GOLDEN[name]
    # The fused W^Q W^K W^V copies of inference are not state: preparing a model adds no key.
    assert list(prepare_for_inference(model).state_dict()) == [key for key, _ in GOLDEN[name]]
