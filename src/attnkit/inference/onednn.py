"""Linear layers whose CPU products of a few rows run on oneDNN with the weight packed once, swapped in for
``nn.Linear`` at inference.

PyTorch multiplies float32 activations by a weight matrix through MKL's sgemm. Where a product has a few rows (a
decoding step has one per sentence and beam) and the CPU is not Intel's, MKL is slow: on an AMD EPYC its time grows
almost in proportion to the rows while the weights are read once, and oneDNN, with the weight reordered once into
its blocked layout (``torch.ops.mkldnn``, the kernels Inductor uses), took a fraction of it from two rows up
(docs/performance.md). CTranslate2 makes the same choice: it runs MKL on Intel CPUs only and oneDNN elsewhere
(``mayiuse_mkl`` in its ``cpu/backend.cc``).

``OneDNNLinear`` is an ``nn.Linear`` (same parameters, same state-dict keys) whose forward pass takes that route
for float32 products on a CPU, without autograd, of at least ``MIN_ROWS`` rows by a matrix of at least
``MIN_WEIGHTS`` entries (below either, oneDNN's fixed cost per call outweighs what it saves), where
``uses_onednn()``; everything else is ``F.linear``. From ``MIN_ROWS`` to ``MAX_TRANSPOSED_ROWS`` rows (a decoding
step of one sentence in a beam of 4, or of a few sentences), eager or compiled, it computes the product transposed
instead, W x^T on MKL, which on those CPUs runs a matrix by a few columns fast where it runs a few rows by a matrix
slowly: faster than oneDNN too there, and with no packed copy. A single row in a compiled step (one sentence,
greedy) is written out as the sum it is, which Inductor makes one loop over the matrix's rows on every thread, with
the bias added in; the library's product of one row ran on one thread at about half the memory bandwidth.

The packed copy is made at the first product and kept outside the module, keyed by the parameter, and made again
once the parameter's storage or version changes (``.to()``, ``load_state_dict``, an optimizer step), so it is never
stale; it costs as much memory as the weights it packs. A compiled step takes the same routes, oneDNN's through an
operator of attnkit's own that Inductor calls as it is; an exported or traced program (ONNX, ``torch.export``,
``torch.jit.trace``) does not: it holds ``F.linear``, which other runtimes know.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.weak import WeakIdKeyDictionary

from attnkit.errors import InputError

MIN_ROWS = 2  # a single row runs faster on MKL's matrix-vector product
MIN_WEIGHTS = 1 << 17  # a (256, 256) matrix (65,536 entries) ran faster on MKL than on oneDNN at every row count
MAX_TRANSPOSED_ROWS = 8  # up to this many rows, W x^T on MKL beat both x W^T and oneDNN (docs/performance.md)
MIN_TRANSPOSED_WEIGHTS = 1 << 16  # ... for matrices from (256, 256) up, the smallest measured
ENV = "ATTNKIT_CPU_GEMM"  # "onednn" or "mkl": overrides the choice by CPU vendor


@functools.cache
def uses_onednn() -> bool:
    """Whether float32 products of a few rows go to oneDNN on this machine: ``ATTNKIT_CPU_GEMM`` where set, else on
    every x86 CPU whose vendor is not Intel (as CTranslate2 decides), where PyTorch was built with oneDNN."""
    chosen = os.environ.get(ENV, "").strip().lower()
    if chosen not in ("", "onednn", "mkl"):
        raise InputError(f"{ENV}={chosen!r}: expected onednn or mkl")
    if not torch.backends.mkldnn.is_available():
        return False
    if chosen:
        return chosen == "onednn"
    return _cpu_vendor() not in ("GenuineIntel", "")


def _cpu_vendor() -> str:
    """The CPU's vendor string (``AuthenticAMD``, ``GenuineIntel``), or "" where /proc/cpuinfo does not say."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith("vendor_id"):
            return line.partition(":")[2].strip()
    return ""


# parameter -> ((its storage, its version), the packed (out, in) matrix), by identity; an entry goes with its
# parameter
_PACKED = WeakIdKeyDictionary()


def _packed(parameter: Tensor, transposed: bool) -> Tensor:
    """``parameter`` (out, in), or (in, out) where ``transposed``, reordered for oneDNN; cached until it changes."""
    key = (parameter.data_ptr(), parameter._version)
    held = _PACKED.get(parameter)
    if held is None or held[0] != key:
        weight = parameter.detach()
        weight = (weight.t() if transposed else weight).contiguous()  # (out, in)
        held = (key, torch.ops.mkldnn._reorder_linear_weight(weight, None))
        _PACKED[parameter] = held
    return held[1]


def _product(x: Tensor, parameter: Tensor, bias: Tensor | None, transposed: bool) -> Tensor:
    """x (rows, in) times the weight (``parameter``, or its transpose), plus ``bias``, on oneDNN's packed copy of
    it. Returns (rows, out). An inference tensor (a model made under ``torch.inference_mode``) keeps no version
    counter, so a packed copy could not tell that it went stale: F.linear multiplies by it instead."""
    if parameter.is_inference():
        return F.linear(x, parameter.t() if transposed else parameter, bias)  # (rows, out)
    return torch.ops.mkldnn._linear_pointwise(x, _packed(parameter, transposed), bias, "none", [], "")


# The same product as an operator of its own, which a compiled step calls as it is: Inductor cannot lower oneDNN's
# product on weights that are the program's inputs rather than constants. Eager calls skip the operator's dispatch.
_product_op = torch.library.custom_op("attnkit::onednn_linear", _product, mutates_args=())


@_product_op.register_fake
def _(x: Tensor, parameter: Tensor, bias: Tensor | None, transposed: bool) -> Tensor:
    return x.new_empty(x.size(0), parameter.size(1) if transposed else parameter.size(0))  # (rows, out)


def linear(x: Tensor, parameter: Tensor, bias: Tensor | None, *, onednn: bool, transposed: bool = False) -> Tensor:
    """``F.linear(x, weight, bias)`` for x (..., in), with ``weight`` = ``parameter`` (out, in), or its transpose
    where ``parameter`` is held (in, out); on the route that pays for its rows where ``onednn`` (``uses_onednn()``,
    read when the module was made): module docstring."""
    weight = parameter.t() if transposed else parameter  # (out, in)
    out_features, in_features = weight.shape
    rows = x.numel() // in_features
    if (
        torch.compiler.is_exporting()  # an exported program (ONNX, torch.export) holds the paper's product
        or torch.jit.is_tracing()  # and so does a traced one, which would keep the packed copy as a constant
        or x.dtype != torch.float32
        or not x.is_cpu
        or (torch.is_grad_enabled() and (parameter.requires_grad or x.requires_grad))
        or not onednn
    ):
        return F.linear(x, weight, bias)  # (..., out)
    flat = x.reshape(rows, in_features)  # (rows, in)
    if rows == 1 and not transposed and torch.compiler.is_compiling():
        y = _reduced_product(flat, weight, bias)  # (rows, out)
    elif rows <= MAX_TRANSPOSED_ROWS and not transposed:
        if rows < MIN_ROWS or weight.numel() < MIN_TRANSPOSED_WEIGHTS:
            return F.linear(x, weight, bias)  # (..., out)
        y = _transposed_product(flat, weight, bias)  # (rows, out)
    else:
        if rows < MIN_ROWS or weight.numel() < MIN_WEIGHTS:
            return F.linear(x, weight, bias)  # (..., out)
        product = _product_op if torch.compiler.is_compiling() else _product
        y = product(flat, parameter, bias, transposed)  # (rows, out)
    return y.view(*x.shape[:-1], out_features)  # (..., out)


def _reduced_product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (1, in) W^T + b written as the sum it is, y_j = sum_i W_ji x_i + b_j, for a compiled step: Inductor makes
    it one loop over W's rows, each read once, with the bias added in. Returns (1, out)."""
    y = (weight * x).sum(-1)[None]  # (1, out)
    return y if bias is None else y + bias


def _transposed_product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (rows, in) W^T + b computed as (W x^T)^T: MKL's product of a tall matrix by a few columns is the fast one
    where its product of a few rows by a wide matrix is not (non-Intel CPUs). Returns (rows, out), contiguous."""
    y = torch.mm(weight, x.t()).t()  # (rows, out), a transposed view of (out, rows)
    return (y if bias is None else y + bias).contiguous()


class OneDNNLinear(nn.Linear):
    """An ``nn.Linear`` whose inference products of a few rows run on oneDNN where that pays (module docstring):
    the same parameters and state-dict keys, the same values to float32 rounding. Whether this machine takes that
    route (``uses_onednn()``) is read once, when the module is made (``onednn``)."""

    onednn: bool

    @classmethod
    def of(cls, module: nn.Linear) -> OneDNNLinear:
        """A ``OneDNNLinear`` that holds ``module``'s parameters (shared, not copied)."""
        new = cls(module.in_features, module.out_features, bias=module.bias is not None, device="meta")
        new.weight = module.weight
        new.bias = module.bias
        new.onednn = uses_onednn()  # an attribute: a compiled step reads it as a constant
        new.train(module.training)
        return new

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias, onednn=self.onednn)  # (..., out_features)


def use_onednn_(module: nn.Module) -> int:
    """Replace, in place, every plain ``nn.Linear`` under ``module`` by a ``OneDNNLinear`` holding its parameters;
    returns how many were replaced."""
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, OneDNNLinear.of(child))
                replaced += 1
    return replaced
