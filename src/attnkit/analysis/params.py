"""Parameter accounting: every parameter of an attnkit model in exactly one row, counted and in closed form.

The closed form of each concept (attention, FFN, LayerNorm, embeddings, positions, head) is in ``attnkit.model.size``,
which also sizes a whole model from its config, before it is built. A row's ``params`` is read from the module's
parameter tensors; its ``formula_value`` is the closed form evaluated from the module's dimensions (``in_features``,
``n_heads``, ``normalized_shape``, ...), so each checks the other.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from attnkit.model.attention import MultiHeadAttention
from attnkit.model.layers import PositionwiseFeedForward
from attnkit.model.masked_lm import MaskedLMHead
from attnkit.model.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from attnkit.model.size import attention_params as _attention
from attnkit.model.size import ffn_params as _ffn
from attnkit.model.size import layer_norm_params as _layer_norm
from attnkit.model.transformer import Transformer


@dataclass
class Row:
    """One leaf concept of the model (an embedding, one attention module, one LayerNorm, ...)."""

    module: str  # dotted module path, e.g. "encoder.layers.0.self_attn"
    kind: str  # "embedding", "positional (sinusoidal)", "attention", "layer_norm", "ffn", "head", ...
    params: int  # parameters counted from the module; 0 for a weight tied to (and counted at) another row
    buffers: int  # values held in buffers (the sinusoidal table), none of them trainable
    formula: str  # the closed form in symbols, e.g. "4(d^2 + d)"
    formula_value: int  # the closed form evaluated from the module's dimensions, independently of counting
    trainable: bool  # the row has parameters and all of them require gradients
    dims: dict[str, int] = field(default_factory=dict)  # the symbols' values, e.g. {"d": 32, "h": 4, "dh": 8}
    note: str = ""  # e.g. "tied to embeddings.token"


@dataclass
class ParamReport:
    rows: list[Row]  # in module order
    total: int  # unique parameters: a tied weight counted once
    trainable: int  # unique parameters that require gradients
    buffers: int  # buffer values (not parameters)


# ---------------------------------------------------------------------------------------------------------------
# Closed forms (model/size.py), and the one only the accounting needs


def _linear(d_in: int, d_out: int, bias: bool, a: str, b: str) -> tuple[str, int]:
    """A d_in -> d_out linear map, written with the symbols ``a`` (input) and ``b`` (output)."""
    return (f"{a}*{b} + {b}" if bias else f"{a}*{b}"), d_in * d_out + (d_out if bias else 0)


# ---------------------------------------------------------------------------------------------------------------
# Counting a model


def _describe(path: str, module: nn.Module) -> tuple[str, str, int, dict[str, int]] | None:
    """(kind, formula, formula_value, dims) if ``module`` is a leaf concept, else None (look at its children)."""
    if isinstance(module, SinusoidalPositionalEncoding):
        max_len, d = module.table.shape  # a registered buffer
        return "positional (sinusoidal)", "0 (buffer max_len*d)", 0, {"max_len": max_len, "d": d}
    if isinstance(module, LearnedPositionalEmbedding):
        max_len, d = module.embedding.num_embeddings, module.embedding.embedding_dim
        return "positional (learned)", "max_len*d", max_len * d, {"max_len": max_len, "d": d}
    if isinstance(module, MultiHeadAttention):
        d, h, dh = module.q_proj.in_features, module.n_heads, module.d_head
        formula, value = _attention(d, h, dh, bias=module.q_proj.bias is not None)
        return "attention", formula, value, {"d": d, "h": h, "dh": dh}
    if isinstance(module, PositionwiseFeedForward):
        d, d_ff = module.linear1.in_features, module.linear1.out_features
        formula, value = _ffn(d, d_ff)
        return "ffn", formula, value, {"d": d, "d_ff": d_ff}
    if isinstance(module, MaskedLMHead):  # BERT's transform (dense, LayerNorm) and its own bias; E^T is the embedding's
        d, vocab = module.dense.in_features, module.bias.numel()
        dense, dense_value = _linear(d, d, module.dense.bias is not None, "d", "d")
        norm, norm_value = _layer_norm(d, module.norm.elementwise_affine, module.norm.bias is not None)
        return "mlm_head", f"{dense} + {norm} + V", dense_value + norm_value + vocab, {"d": d, "V": vocab}
    if isinstance(module, nn.LayerNorm):
        d = math.prod(module.normalized_shape)
        formula, value = _layer_norm(d, module.elementwise_affine, getattr(module, "bias", None) is not None)
        return "layer_norm", formula, value, {"d": d}
    if isinstance(module, nn.Embedding):
        n, d = module.num_embeddings, module.embedding_dim
        if path.split(".")[-1] == "token_type":
            return "embedding (token type)", "types*d", n * d, {"types": n, "d": d}
        return "embedding", "V*d", n * d, {"V": n, "d": d}
    if isinstance(module, nn.Linear):
        d_in, d_out, bias = module.in_features, module.out_features, module.bias is not None
        if path == "head":
            formula, value = _linear(d_in, d_out, bias, "d", "C")
            return "head", formula, value, {"d": d_in, "C": d_out}
        if path == "output_proj":
            formula, value = _linear(d_in, d_out, bias, "d", "V")
            return "output_projection", formula, value, {"d": d_in, "V": d_out}
        formula, value = _linear(d_in, d_out, bias, "d_in", "d_out")
        return "linear", formula, value, {"d_in": d_in, "d_out": d_out}
    return None


def _concepts(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module, tuple]]:
    """Leaf concepts in module order; a module shared by two parents is yielded at both paths."""
    for name, child in module.named_children():
        path = f"{prefix}.{name}" if prefix else name
        described = _describe(path, child)
        if described is not None:
            yield path, child, described
            continue
        if any(True for _ in child.parameters(recurse=False)) or any(True for _ in child.buffers(recurse=False)):
            raise ValueError(
                f"no parameter-accounting rule for {path} ({type(child).__name__}), which holds tensors itself"
            )
        yield from _concepts(child, path)


def parameter_table(model: nn.Module) -> ParamReport:
    """One row per leaf concept of a ``TransformerClassifier`` or ``Transformer``, in module order.

    A weight that appears under a second path (the translator's output projection, tied to the token embedding by
    §3.4) is a row with 0 params and a note naming the row that counts it. Raises ``RuntimeError`` if the rows do not
    cover every parameter exactly once.
    """
    if any(True for _ in model.parameters(recurse=False)) or any(True for _ in model.buffers(recurse=False)):
        raise ValueError(f"no parameter-accounting rule for tensors held directly by {type(model).__name__}")
    rows: list[Row] = []
    owner: dict[int, str] = {}  # id(parameter) -> the row that counts it
    seen_buffers: set[int] = set()
    for path, module, (kind, formula, value, dims) in _concepts(model):
        params = list(module.parameters())  # unique within the module
        new = [p for p in params if id(p) not in owner]
        if params and not new:
            first = owner[id(params[0])]
            rows.append(Row(path, f"{kind} (tied)", 0, 0, f"0 (tied to {first})", 0, False, dims, f"tied to {first}"))
            continue
        if len(new) != len(params):
            shared = sorted({owner[id(p)] for p in params if id(p) in owner})
            raise ValueError(f"{path} shares some but not all of its parameters with {', '.join(shared)}")
        owner.update((id(p), path) for p in params)
        new_buffers = [b for b in module.buffers() if id(b) not in seen_buffers]
        seen_buffers.update(id(b) for b in new_buffers)
        all_trainable = bool(params) and all(p.requires_grad for p in params)
        rows.append(
            Row(
                path,
                kind,
                sum(p.numel() for p in params),
                sum(b.numel() for b in new_buffers),
                formula,
                value,
                all_trainable,
                dims,
            )
        )
    if isinstance(model, Transformer) and model.output_proj is None:
        # §3.4: the pre-softmax projection is F.linear(x, embeddings.token.weight); it owns no tensor of its own.
        weight = model.embeddings.token.weight
        first = owner[id(weight)]
        rows.append(
            Row(
                "output_proj",
                "output_projection (tied)",
                0,
                0,
                f"0 (tied to {first})",
                0,
                False,
                {"V": weight.size(0), "d": weight.size(1)},
                f"tied to {first}",
            )
        )

    unique = list(model.parameters())  # deduplicated by identity: a tied weight appears once
    total = sum(p.numel() for p in unique)
    counted = sum(row.params for row in rows)
    missing = [name for name, p in model.named_parameters() if id(p) not in owner]
    if missing or counted != total:
        raise RuntimeError(
            f"parameter rows add up to {counted:,} but the model has {total:,} unique parameters"
            f" (not covered: {', '.join(missing) or 'none'})"
        )
    buffers = sum(b.numel() for b in model.buffers())
    if sum(row.buffers for row in rows) != buffers:
        raise RuntimeError(f"buffer rows add up to {sum(row.buffers for row in rows):,}, the model has {buffers:,}")
    trainable = sum(p.numel() for p in unique if p.requires_grad)
    return ParamReport(rows=rows, total=total, trainable=trainable, buffers=buffers)


def to_json(report: ParamReport) -> dict:
    """A JSON-ready dict: ``total``, ``trainable``, ``buffers`` and one dict per row."""
    rows = [
        dict(
            module=r.module,
            kind=r.kind,
            params=r.params,
            formula=r.formula,
            formula_value=r.formula_value,
            buffers=r.buffers,
            trainable=r.trainable,
            dims=dict(r.dims),
            note=r.note,
        )
        for r in report.rows
    ]
    return dict(total=report.total, trainable=report.trainable, buffers=report.buffers, rows=rows)


def format_table(report: ParamReport) -> str:
    """An aligned text table, thousands separated, ending with the totals."""
    header = ("module", "kind", "params", "formula", "= value", "where", "buffers")
    body = [
        (
            r.module,
            r.kind,
            f"{r.params:,}",
            r.formula,
            f"{r.formula_value:,}" + ("" if r.formula_value == r.params else " !"),  # "!": closed form disagrees
            " ".join(f"{k}={v}" for k, v in r.dims.items()),
            f"{r.buffers:,}",
        )
        for r in report.rows
    ]
    totals = ("total", f"{report.trainable:,} trainable", f"{report.total:,}", "", "", "", f"{report.buffers:,}")
    right = {2, 4, 6}  # numeric columns
    widths = [max(len(line[i]) for line in (header, *body, totals)) for i in range(len(header))]

    def fmt(line: tuple[str, ...]) -> str:
        cells = (cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths)))
        return "  ".join(cells).rstrip()

    rule = "-" * len(fmt(tuple("-" * w for w in widths)))
    return "\n".join([fmt(header), rule, *map(fmt, body), rule, fmt(totals)])


# ---------------------------------------------------------------------------------------------------------------
# Memory on a device


@dataclass
class MemoryEstimate:
    """What the parameters take on ``device``, before activations (which grow with the batch and the length)."""

    device: str
    weights_bytes: int  # float32 parameters and buffers: 4 bytes each
    training_bytes: int  # + a float32 gradient and Adam's two moments per trainable parameter: 16 bytes each
    device_bytes: int | None  # the device's total memory where torch (or the OS, for the CPU) says; else None


def memory_estimate(report: ParamReport, device: torch.device) -> MemoryEstimate:
    """The float32 weights and an Adam training step's parameter state (weights, gradients, two moments) in bytes,
    beside the memory ``device`` has. Mixed precision does not shrink these: autocast keeps float32 weights."""
    weights = 4 * (report.total + report.buffers)
    training = weights + 12 * report.trainable
    return MemoryEstimate(str(device), weights, training, _device_bytes(device))


def _device_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):  # not a POSIX system
            return None
    return None


def format_memory(memory: MemoryEstimate) -> str:
    """One line for the end of the table."""

    def size(n: int) -> str:
        return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"

    has = f"; {memory.device} has {size(memory.device_bytes)}" if memory.device_bytes else ""
    return (
        f"memory on {memory.device}: weights {size(memory.weights_bytes)} (float32), training with Adam "
        f"{size(memory.training_bytes)} (weights, gradients, 2 moments; activations not included){has}"
    )
