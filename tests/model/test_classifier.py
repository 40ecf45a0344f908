"""The encoder classifier: padding invariance, fully padded rows, masked mean pooling, exact parameter counts."""

import pytest
import torch
from torch.testing import assert_close

from attnkit.config import CLASSIFIER_PRESETS, ClassifierConfig, preset
from attnkit.model.build import build_classifier
from attnkit.model.classifier import TransformerClassifier

V, D, H, FF, N, MAX_LEN, PAD = 40, 16, 2, 32, 2, 32, 0
POOLINGS = pytest.mark.parametrize("pooling", ["mean", "cls"])
NORMS = pytest.mark.parametrize("norm", ["post", "pre"])


def _model(**overrides) -> TransformerClassifier:
    kwargs = dict(vocab_size=V, d_model=D, n_heads=H, d_ff=FF, n_layers=N, max_len=MAX_LEN, n_classes=3)
    return build_classifier(ClassifierConfig(**{**kwargs, **overrides}), pad_id=PAD).eval()


def _pad(sentences: list[torch.Tensor]) -> torch.Tensor:
    """Right-pad 1-D id tensors with PAD into one (B, S) batch."""
    return torch.nn.utils.rnn.pad_sequence(sentences, batch_first=True, padding_value=PAD)


@POOLINGS
@NORMS
def test_logits_do_not_depend_on_batch_padding(pooling, norm):
    model = _model(pooling=pooling, norm=norm)
    sentence = torch.randint(1, V, (5,))
    batch = _pad([sentence, torch.randint(1, V, (9,)), torch.randint(1, V, (12,))])  # (3, 12)
    with torch.no_grad():
        alone = model(sentence[None])  # (1, C)
        batched = model(batch)  # (3, C)
    assert_close(batched[:1], alone, atol=1e-5, rtol=0)


@POOLINGS
@NORMS
def test_fully_padded_row_is_finite(pooling, norm):
    model = _model(pooling=pooling, norm=norm)
    ids = _pad([torch.randint(1, V, (6,)), torch.randint(1, V, (2,))])
    ids = torch.cat([ids, torch.full((1, ids.size(1)), PAD)])  # (3, 6), the last row all padding
    with torch.no_grad():
        hidden, _, _ = model.encode(ids)
        logits = model(ids)
        # The explicit attention path (maps requested for every layer) must be just as safe.
        logits_explicit, maps = model.forward_with_attention(ids, attn_layers=tuple(range(N)))
    assert hidden.isfinite().all()  # includes the padded positions of rows 1 and 2
    assert logits.isfinite().all() and logits_explicit.isfinite().all()
    assert set(maps.encoder_self) == set(range(N)) and not maps.decoder_self and not maps.cross
    assert all(m.isfinite().all() for m in maps.encoder_self.values())
    assert_close(logits_explicit, logits, atol=1e-6, rtol=0)


@NORMS
def test_mean_pooling_ignores_padding(norm):
    model = _model(pooling="mean", norm=norm)
    ids = _pad([torch.randint(1, V, (4,)), torch.randint(1, V, (7,))])  # row 0 has 3 pad positions
    with torch.no_grad():
        hidden_before, _, _ = model.encode(ids)
        logits_before = model(ids)
        model.embeddings.token.weight[PAD] = torch.randn(D) * 10  # a very different pad embedding
        hidden_after, _, _ = model.encode(ids)
        logits_after = model(ids)
        # The encoder leaves zeros at padded positions; pooling must ignore whatever is there.
        mask = (ids != PAD)[:, None, None, :]
        garbage = hidden_after.clone()
        garbage[0, 4:] = torch.randn(3, D) * 10
        pooled, pooled_garbage = model.pool(hidden_after, mask), model.pool(garbage, mask)
    assert (hidden_after[0, 4:] == 0).all() and (hidden_before[0, 4:] == 0).all()
    assert_close(pooled_garbage, pooled, atol=1e-6, rtol=0)
    assert_close(hidden_after[:, :4], hidden_before[:, :4], atol=1e-5, rtol=0)
    assert_close(logits_after, logits_before, atol=1e-5, rtol=0)


def test_seed000_parameter_count():
    # 10,000 x 128 embeddings + 2 x (4 x (128^2 + 128) attention + 128 x 512 + 512 + 512 x 128 + 128 FFN
    # + 2 x 256 LayerNorm) + 128 x 2 + 2 head = 1,280,000 + 396,544 + 258; sinusoids add nothing.
    model = build_classifier(ClassifierConfig(**preset(CLASSIFIER_PRESETS, "vocab10k")))
    assert sum(p.numel() for p in model.parameters()) == 1_676_802


def test_single_logit_head():
    model = _model(n_classes=1)
    assert model(torch.randint(1, V, (4, 6))).shape == (4, 1)
