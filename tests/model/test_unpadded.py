"""The encoder on a padded batch runs its layers on the real tokens alone (``Unpadded``): outputs, attention-free
gradients and a training step equal those of the padded layout (the layers called without ``unpadded``)."""

import pytest
import torch
from torch.testing import assert_close

from attnkit.config import ClassifierConfig
from attnkit.model.build import build_classifier
from attnkit.model.masking import Unpadded, padding_mask

V, D, H, FF, N, PAD = 50, 32, 4, 64, 3, 0
NORMS = pytest.mark.parametrize("norm", ["post", "pre"])


def _model(norm: str, dropout: float = 0.0):
    cfg = ClassifierConfig(
        vocab_size=V, d_model=D, n_heads=H, d_ff=FF, n_layers=N, max_len=32, n_classes=3, norm=norm, dropout=dropout
    )
    torch.manual_seed(0)
    return build_classifier(cfg, pad_id=PAD)


def _batch() -> torch.Tensor:
    """(5, 17) ids, lengths 17, 3, 9, 1, 12: most of the batch is padding."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, V, (5, 17), generator=gen)  # (B, S)
    lengths = torch.tensor([17, 3, 9, 1, 12])
    return ids.masked_fill(torch.arange(17)[None, :] >= lengths[:, None], PAD)


def padded_reference(model, ids: torch.Tensor) -> torch.Tensor:
    """The encoder on the padded layout: every layer called on (B, S, D), as before unpadding existed."""
    mask = padding_mask(ids, PAD)  # (B, 1, 1, S)
    x = model.embeddings(ids)  # (B, S, D)
    for layer in model.encoder.layers:
        x, _ = layer(x, mask)  # (B, S, D)
    if model.encoder.final_norm is not None:
        x = model.encoder.final_norm(x)
    return x.masked_fill(~mask[:, 0, 0, :, None], 0.0)  # (B, S, D)


def test_pack_and_unpack_round_trip():
    ids = _batch()
    unpadded = Unpadded.of(padding_mask(ids, PAD))
    x = torch.randn(5, 17, 6)
    packed = unpadded.pack(x)  # (N, 6)
    assert packed.shape == (int((ids != PAD).sum()), 6)
    real = (ids != PAD)[..., None]
    assert_close(unpadded.unpack(packed), x * real, atol=0, rtol=0)


@NORMS
def test_unpadded_encoder_equals_the_padded_layout(norm):
    model = _model(norm).eval()
    ids = _batch()
    with torch.no_grad():
        hidden, _, _ = model.encode(ids)  # (B, S, D), through Unpadded
        reference = padded_reference(model, ids)
    assert_close(hidden, reference, atol=1e-5, rtol=0)


@NORMS
def test_unpadded_training_gradients_equal_the_padded_layout(norm):
    ids, labels = _batch(), torch.tensor([0, 1, 2, 1, 0])
    grads = []
    for unpadded in (True, False):
        model = _model(norm).train()  # dropout 0: the two layouts compute the same function
        hidden = model.encode(ids)[0] if unpadded else padded_reference(model, ids)  # (B, S, D)
        logits = model.head(model.pool(hidden, padding_mask(ids, PAD)))  # (B, C)
        torch.nn.functional.cross_entropy(logits, labels).backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_a_batch_without_padding_keeps_the_padded_layout(monkeypatch):
    model = _model("post").eval()
    ids = torch.randint(1, V, (3, 8))
    monkeypatch.setattr(Unpadded, "of", classmethod(lambda cls, mask: pytest.fail("packed a batch with no padding")))
    with torch.no_grad():
        model(ids)


# ---------------------------------------------------------------------------------------------------------------
# Rows made on the host (training's batches), and the layout a GPU takes


@NORMS
@pytest.mark.parametrize("on_cpu", [True, False], ids=["cpu-packs", "gpu-pads"])
def test_host_made_rows_give_the_padded_layouts_output_without_reading_the_mask(norm, on_cpu, monkeypatch):
    """With the real tokens' rows given (``real_positions``), the encoder never reads the mask (no ``bool`` of it,
    no ``nonzero``), packs on a CPU and computes the padding where a GPU would, with the same output either way."""
    from attnkit.data.batching import real_positions
    from attnkit.model import transformer

    model = _model(norm).eval()
    ids = _batch()
    rows = real_positions([17, 3, 9, 1, 12], 17)  # (N,)
    assert torch.equal(rows, padding_mask(ids, PAD).reshape(-1).nonzero().squeeze(1))
    monkeypatch.setattr(transformer, "skips_padding", lambda device: on_cpu)
    monkeypatch.setattr(Unpadded, "of", classmethod(lambda cls, mask: pytest.fail("read the mask")))
    packs: list[bool] = []
    real_from_rows = Unpadded.from_rows
    monkeypatch.setattr(
        Unpadded, "from_rows", classmethod(lambda cls, r, m: packs.append(True) or real_from_rows(r, m))
    )
    with torch.no_grad():
        hidden, _ = model.encoder(model.embeddings(ids), padding_mask(ids, PAD), rows=rows)  # (B, S, D)
        reference = padded_reference(model, ids)
    assert packs == ([True] if on_cpu else [])
    assert_close(hidden, reference, atol=1e-5, rtol=0)


def test_the_gpu_layout_never_reads_the_mask(monkeypatch):
    """Off the CPU, an encoder called without rows (inference) computes the padding: no read of the mask."""
    from attnkit.model import transformer

    model = _model("post").eval()
    ids = _batch()
    monkeypatch.setattr(transformer, "skips_padding", lambda device: False)
    monkeypatch.setattr(torch.Tensor, "__bool__", lambda self: pytest.fail("read a tensor on the host"))
    with torch.no_grad():
        hidden, _, _ = model.encode(ids)
    monkeypatch.undo()
    assert_close(hidden, padded_reference(model, ids), atol=1e-5, rtol=0)
