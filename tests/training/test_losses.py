"""The label-smoothed sequence loss equals PyTorch's cross-entropy, loss and gradients, on padded batches."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.training import losses
from attnkit.training.losses import sequence_loss, smoothed_cross_entropy

PAD = 0


@pytest.fixture
def batch():
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(5, 7, 37, generator=gen) * 3).requires_grad_()  # (B, T, V)
    targets = torch.randint(1, 37, (5, 7), generator=gen)  # (B, T)
    targets[1, 4:] = PAD
    targets[3, 1:] = PAD
    return logits, targets


# The loss's two paths (``losses.blocked_loss`` chooses by device): blocks of rows in cache (one block; blocks of 3
# rows with a ragged last one) and the fused pass that GPUs and compiled graphs take.
PATHS = {"one block": (True, 1 << 17), "blocks of 3 rows": (True, 37 * 3), "fused": (False, 1 << 17)}


@pytest.fixture(params=list(PATHS))
def path(request, monkeypatch):
    blocked, block = PATHS[request.param]
    monkeypatch.setattr(losses, "blocked_loss", lambda logits: blocked)
    monkeypatch.setattr(losses, "_BLOCK", block)
    calls: list[int] = []
    monkeypatch.setattr(losses._SmoothedCrossEntropy, "apply", _counting(losses._SmoothedCrossEntropy.apply, calls))
    yield request.param
    assert bool(calls) == blocked  # the path asked for is the one that ran


def _counting(fn, calls):
    def wrapper(*args):
        calls.append(1)
        return fn(*args)

    return wrapper


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_sequence_loss_equals_torch_cross_entropy(batch, smoothing, path):
    logits, targets = batch
    expected = F.cross_entropy(
        logits.reshape(-1, 37), targets.reshape(-1), ignore_index=PAD, label_smoothing=smoothing, reduction="sum"
    )
    (expected_grad,) = torch.autograd.grad(expected * 0.7, logits)
    loss, n_tokens = sequence_loss(logits, targets, PAD, smoothing)
    (grad,) = torch.autograd.grad(loss * 0.7, logits)
    assert n_tokens == int((targets != PAD).sum()) == 35 - 3 - 6
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-6)
    assert grad[1, 4:].abs().sum() == 0 and grad[3, 1:].abs().sum() == 0  # padded targets get no gradient


def test_all_padding_gives_zero_loss_and_gradient(path):
    logits = torch.randn(4, 9, requires_grad=True)
    loss = smoothed_cross_entropy(logits, torch.full((4,), PAD), PAD, 0.1)
    loss.backward()
    assert loss.item() == 0.0 and logits.grad is not None and logits.grad.abs().sum() == 0


def test_gradient_is_softmax_minus_smoothed_target(path):
    """dL/dz = p - q with q = (1 - eps) onehot(y) + eps / V (§5.4): the rows of the gradient sum to zero."""
    logits = torch.randn(3, 11, requires_grad=True)
    targets = torch.tensor([2, 5, 10])
    smoothed_cross_entropy(logits, targets, PAD, 0.2).backward()
    q = torch.full((3, 11), 0.2 / 11).scatter_add_(1, targets[:, None], torch.full((3, 1), 0.8))
    torch.testing.assert_close(logits.grad, logits.detach().softmax(-1) - q)
    torch.testing.assert_close(logits.grad.sum(-1), torch.zeros(3), atol=1e-6, rtol=0)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_packed_output_projection_equals_padded(smoothing):
    """Logits of the real target positions only (``positions``): same loss and same gradients as projecting every
    position and letting the loss ignore the padded ones, dropout on."""
    from attnkit.config import TranslatorConfig
    from attnkit.model.build import build_translator

    cfg = TranslatorConfig(vocab_size=41, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=16, dropout=0.1)
    torch.manual_seed(0)
    model = build_translator(cfg, pad_id=PAD).train()
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(1, 41, (3, 6), generator=gen)  # (B, S)
    tgt = torch.randint(1, 41, (3, 8), generator=gen)  # (B, T + 1)
    src[2, 3:] = PAD
    tgt[0, 5:] = PAD
    tgt[2, 2:] = PAD
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    real = tgt_out != PAD  # (B, T)

    def loss_and_grads(packed: bool):
        torch.manual_seed(2)  # the same dropout masks on both paths
        if packed:
            logits = model(src, tgt_in, positions=real)  # (N, V)
            assert logits.shape == (int(real.sum()), 41)
            loss, n = sequence_loss(logits, tgt_out[real], PAD, smoothing)
        else:
            loss, n = sequence_loss(model(src, tgt_in), tgt_out, PAD, smoothing)
        model.zero_grad()
        (loss / n).backward()
        return loss.detach(), n, {k: p.grad.clone() for k, p in model.named_parameters()}

    loss_padded, n_padded, grads_padded = loss_and_grads(packed=False)
    loss_packed, n_packed, grads_packed = loss_and_grads(packed=True)
    assert n_packed == n_padded == int(real.sum())
    torch.testing.assert_close(loss_packed, loss_padded, rtol=1e-6, atol=1e-5)
    for name, grad in grads_padded.items():
        torch.testing.assert_close(grads_packed[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_bfloat16_logits_are_read_in_float32(path):
    """bfloat16 logits give the loss of their float32 copy, and the gradient that copy's, rounded once."""
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(6, 300, generator=gen) * 4).bfloat16().requires_grad_()
    targets = torch.tensor([5, PAD, 17, 299, 1, PAD])
    loss = smoothed_cross_entropy(logits, targets, PAD, 0.1)
    (grad,) = torch.autograd.grad(loss * 0.3, logits)
    copy = logits.detach().float().requires_grad_()
    expected = F.cross_entropy(copy, targets, ignore_index=PAD, label_smoothing=0.1, reduction="sum")
    (expected_grad,) = torch.autograd.grad(expected * 0.3, copy)
    assert loss.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(grad, expected_grad.bfloat16(), rtol=0, atol=0)


def test_the_blocks_are_for_cpus_only():
    """Logits on any device but the CPU take the fused pass, a CPU's the blocks, of any vocabulary."""
    assert losses.blocked_loss(torch.empty(4, 8000)) and losses.blocked_loss(torch.empty(4, 37000))
    assert not losses.blocked_loss(torch.empty(4, 8000, device="meta"))  # any device but the CPU
