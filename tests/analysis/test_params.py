"""Parameter accounting: exact counts from reference note 001 and the paper's Table 3, torchinfo, closed forms."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch import nn

from attnkit.analysis.params import Row, format_table, parameter_table, to_json
from attnkit.config import (
    CLASSIFIER_PRESETS,
    TRANSLATOR_PRESETS,
    ClassifierConfig,
    TranslatorConfig,
    build_configs,
    preset,
)
from attnkit.model.build import build_classifier, build_translator
from attnkit.model.size import classifier_params as classifier_param_formula
from attnkit.model.size import translator_params as translator_param_formula


def _classifier_cfg(name: str, **overrides) -> ClassifierConfig:
    cfg, _ = build_configs(ClassifierConfig, preset(CLASSIFIER_PRESETS, name), {}, overrides)
    return cfg


def _translator_cfg(name: str, **overrides) -> TranslatorConfig:
    cfg, _ = build_configs(TranslatorConfig, preset(TRANSLATOR_PRESETS, name), {}, overrides)
    return cfg


TINY_TRANSLATOR: dict[str, Any] = dict(vocab_size=97, d_model=16, n_heads=2, d_ff=24, n_layers=2, max_len=32)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def tiny_binary():
    return build_classifier(_classifier_cfg("tiny-binary"))


def _one(report, module: str) -> Row:
    (row,) = [r for r in report.rows if r.module == module]
    return row


def test_tiny_binary_rows_match_reference_note_001(tiny_binary):
    report = parameter_table(tiny_binary)
    assert [(r.module, r.kind, r.params) for r in report.rows] == [
        ("embeddings.token", "embedding", 976_704),  # 30522 x 32
        ("embeddings.position", "positional (sinusoidal)", 0),
        ("encoder.layers.0.self_attn", "attention", 4_224),  # 4 x (32 x 32 + 32)
        ("encoder.layers.0.ffn", "ffn", 2_112),  # 2 x (32 x 32 + 32)
        ("encoder.layers.0.norm1", "layer_norm", 64),
        ("encoder.layers.0.norm2", "layer_norm", 64),
        ("head", "head", 33),  # 32 x 1 + 1
    ]
    position = _one(report, "embeddings.position")
    assert (position.buffers, position.trainable) == (12_800, False)  # 400 x 32 values, none trainable
    assert all(r.formula_value == r.params for r in report.rows)
    assert _one(report, "encoder.layers.0.self_attn").formula == "4(d^2 + d)"
    assert (report.total, report.trainable, report.buffers) == (983_201, 983_201, 12_800)
    assert report.total == classifier_param_formula(_classifier_cfg("tiny-binary"))


def test_vocab10k_classifier_total():
    cfg = _classifier_cfg("vocab10k")
    report = parameter_table(build_classifier(cfg))
    assert report.total == 1_676_802
    assert classifier_param_formula(cfg) == 1_676_802


def test_classifier_agrees_with_torchinfo(tiny_binary):
    torchinfo = pytest.importorskip("torchinfo")
    ids = torch.randint(1, 30522, (2, 16))
    stats = torchinfo.summary(tiny_binary, input_data=ids, verbose=0)
    report = parameter_table(tiny_binary)
    assert stats.total_params == report.total
    assert stats.trainable_params == report.trainable


def test_frozen_parameters_are_counted_but_not_trainable():
    model = build_classifier(_classifier_cfg("tiny-binary"))
    model.embeddings.token.weight.requires_grad_(False)
    report = parameter_table(model)
    assert report.total == 983_201
    assert report.trainable == 983_201 - 976_704
    assert not _one(report, "embeddings.token").trainable


@pytest.mark.parametrize(("name", "total"), [("base", 63_082_496), ("big", 214_245_376)])
def test_translator_presets_match_the_paper_sized_totals(name, total):
    cfg = _translator_cfg(name)
    with torch.device("meta"):
        model = build_translator(cfg)
    report = parameter_table(model)
    assert report.total == total == translator_param_formula(cfg)
    assert report.total == sum(p.numel() for p in set(model.parameters()))
    tied = _one(report, "output_proj")
    assert (tied.kind, tied.params, tied.note) == ("output_projection (tied)", 0, "tied to embeddings.token")
    assert all(r.formula_value == r.params for r in report.rows)


def test_untied_translator_adds_exactly_one_vocabulary_matrix():
    tied = parameter_table(build_translator(TranslatorConfig(**TINY_TRANSLATOR)))
    untied = parameter_table(build_translator(TranslatorConfig(**TINY_TRANSLATOR, tie_embeddings=False)))
    V, d = TINY_TRANSLATOR["vocab_size"], TINY_TRANSLATOR["d_model"]
    assert untied.total == tied.total + V * d
    projection = _one(untied, "output_proj")
    assert (projection.kind, projection.params, projection.formula) == ("output_projection", V * d, "d*V")


def test_tied_translator_against_unique_parameters():
    model = build_translator(TranslatorConfig(**TINY_TRANSLATOR))
    report = parameter_table(model)
    unique = {id(p): p.numel() for _, p in model.named_parameters(remove_duplicate=False)}
    assert report.total == sum(unique.values()) == sum(r.params for r in report.rows)


def test_weight_tied_by_sharing_the_parameter_becomes_a_tied_row():
    model = build_translator(TranslatorConfig(**TINY_TRANSLATOR, tie_embeddings=False))
    model.output_proj.weight = model.embeddings.token.weight  # the other common way of tying
    report = parameter_table(model)
    row = _one(report, "output_proj")
    assert (row.params, row.note) == (0, "tied to embeddings.token")
    assert report.total == parameter_table(build_translator(TranslatorConfig(**TINY_TRANSLATOR))).total


@pytest.mark.parametrize(
    "overrides",
    [
        dict(d_model=64, n_heads=8, d_head=4),  # Table 3 row (B)-style: d_head decoupled from d_model / h
        dict(d_model=64, n_heads=2, d_head=48),
        dict(norm="pre", positional="learned"),
        dict(n_token_types=2, embedding_norm=True, n_classes=5, pooling="cls"),
    ],
)
def test_classifier_rows_and_totals_match_closed_forms(overrides):
    cfg = ClassifierConfig(
        vocab_size=101,
        d_model=overrides.pop("d_model", 32),
        n_heads=overrides.pop("n_heads", 4),
        d_ff=40,
        n_layers=2,
        max_len=24,
        **overrides,
    )
    report = parameter_table(build_classifier(cfg))
    assert [r.module for r in report.rows if r.formula_value != r.params] == []
    assert report.total == classifier_param_formula(cfg)


def test_decoupled_head_dim_uses_the_general_formula():
    cfg = TranslatorConfig(**{**TINY_TRANSLATOR, "d_model": 64, "n_heads": 8}, d_head=4)
    report = parameter_table(build_translator(cfg))
    attention = [r for r in report.rows if r.kind == "attention"]
    assert len(attention) == 3 * 2  # encoder self, decoder self and cross, two layers
    d, h, dh = 64, 8, 4
    for row in attention:
        assert row.formula == "3(d*h*dh + h*dh) + h*dh*d + d"
        assert row.params == row.formula_value == 3 * (d * h * dh + h * dh) + h * dh * d + d
    assert report.total == translator_param_formula(cfg)


def test_pre_norm_translator_counts_both_final_norms():
    cfg = TranslatorConfig(**TINY_TRANSLATOR, norm="pre", positional="learned")
    report = parameter_table(build_translator(cfg))
    assert {"encoder.final_norm", "decoder.final_norm"} <= {r.module for r in report.rows}
    assert report.total == translator_param_formula(cfg)


def test_module_without_a_rule_is_an_error():
    model = build_classifier(_classifier_cfg("tiny-binary"))
    model.extra = nn.Conv1d(4, 4, 3)
    with pytest.raises(ValueError, match="extra"):
        parameter_table(model)


def test_json_and_text_table(tiny_binary):
    report = parameter_table(tiny_binary)
    data = json.loads(json.dumps(to_json(report)))
    assert (data["total"], data["trainable"], data["buffers"]) == (983_201, 983_201, 12_800)
    assert {"module", "kind", "params", "formula", "formula_value", "buffers"} <= set(data["rows"][0])
    text = format_table(report)
    lines = text.splitlines()
    assert lines[-1].startswith("total") and "983,201" in lines[-1] and "12,800" in lines[-1]
    assert "976,704" in text
    assert len({len(line) for line in lines[:2]}) == 1  # header and rule are aligned
