"""A model's size from its config alone (``model.size``) is what its builder allocates: checked against the built
modules over many shapes, since a run directory whose weights file does not hold that many numbers is refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.config import ClassifierConfig, MaskedLMConfig, TranslatorConfig
from attnkit.model.build import build_classifier, build_masked_lm, build_translator
from attnkit.model.size import model_size

BUILDERS = {ClassifierConfig: build_classifier, TranslatorConfig: build_translator, MaskedLMConfig: build_masked_lm}


@st.composite
def configs(draw):
    cls = draw(st.sampled_from(list(BUILDERS)))
    n_heads = draw(st.integers(1, 4))
    shape = dict(
        vocab_size=draw(st.integers(6, 40)),
        n_heads=n_heads,
        d_model=n_heads * draw(st.integers(1, 4)),
        d_head=draw(st.none() | st.integers(1, 5)),
        d_ff=draw(st.integers(1, 24)),
        n_layers=draw(st.integers(1, 3)),
        max_len=draw(st.integers(1, 20)),
        norm=draw(st.sampled_from(["post", "pre"])),
        positional=draw(st.sampled_from(["sinusoidal", "learned"])),
    )
    if cls is TranslatorConfig:
        shape["tie_embeddings"] = draw(st.booleans())
    else:
        shape["n_token_types"] = draw(st.integers(0, 2))
        shape["embedding_norm"] = draw(st.booleans())
    if cls is ClassifierConfig:
        shape["n_classes"] = draw(st.integers(0, 4))
        shape["pooling"] = draw(st.sampled_from(["mean", "cls"]))
    return cls(**shape)


@settings(max_examples=60, deadline=None)
@given(configs())
def test_the_size_from_the_config_is_what_the_builder_allocates(cfg):
    model = BUILDERS[type(cfg)](cfg)
    saved = model.state_dict()  # what a run's weights file holds
    size = model_size(cfg)
    assert size.params == sum(t.numel() for t in saved.values()) == sum(p.numel() for p in model.parameters())
    assert size.buffers == sum(b.numel() for name, b in model.named_buffers() if name not in saved)


@pytest.mark.parametrize("cls", list(BUILDERS))
def test_the_default_configs(cls):
    model = BUILDERS[cls](cls())
    assert model_size(cls()).params == sum(p.numel() for p in model.parameters())


def test_training_bytes_count_a_gradient_and_two_adam_moments_per_parameter():
    size = model_size(TranslatorConfig(vocab_size=100, d_model=8, n_heads=2, d_ff=8, n_layers=1, max_len=10))
    assert size.weights_bytes == 4 * (size.params + 80)  # the sinusoidal table: max_len x d_model
    assert size.training_bytes == size.weights_bytes + 3 * 4 * size.params
