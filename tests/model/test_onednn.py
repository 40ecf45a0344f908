"""``OneDNNLinear`` (``attnkit.inference.onednn``): the products ``F.linear`` gives, on oneDNN's packed weights where
that is chosen (and as W x^T for a few rows), with a packed copy that follows every change of its parameter; the
choice itself; and a prepared translator that decodes the same tokens on either library. The oneDNN route is forced
on whatever CPU runs the tests (on an Intel CPU the default is MKL)."""

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from attnkit.config import ClassifierConfig, TranslatorConfig
from attnkit.decoding import beam_search, greedy_decode
from attnkit.errors import InputError
from attnkit.inference import onednn, prepare_for_inference, programs, quantize_for_inference
from attnkit.inference.onednn import MAX_TRANSPOSED_ROWS, MIN_WEIGHTS, OneDNNLinear
from attnkit.inference.programs import Engine
from attnkit.inference.quantize import Int8Linear
from attnkit.inference.transposed import TiedTransposedOutput
from attnkit.model.build import build_classifier, build_translator
from attnkit.model.transformer import Transformer

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")

PAD, BOS, EOS = 0, 1, 2


@pytest.fixture
def gemm(monkeypatch):
    """Choose the CPU library for the test: ``gemm("onednn")`` or ``gemm("mkl")``, as ``ATTNKIT_CPU_GEMM`` does."""

    def choose(name: str) -> None:
        monkeypatch.setenv(onednn.ENV, name)
        onednn.uses_onednn.cache_clear()

    yield choose
    onednn.uses_onednn.cache_clear()


def _linear(out_features: int = 768, in_features: int = 256) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(in_features, out_features)


@pytest.mark.parametrize("rows", [1, 2, 7, 64])
def test_a_onednn_linear_computes_what_f_linear_computes(gemm, rows):
    gemm("onednn")
    plain = _linear()
    assert plain.weight.numel() >= MIN_WEIGHTS  # large enough for oneDNN to be chosen
    module = OneDNNLinear.of(plain)
    x = torch.randn(rows, 3, 256)  # (rows, 3, in): 3 * rows rows in all
    with torch.inference_mode():
        assert_close(module(x), F.linear(x, plain.weight, plain.bias), atol=1e-5, rtol=1e-5)
    assert module.weight is plain.weight and module.bias is plain.bias  # shared, not copied


@pytest.mark.parametrize("shape", [(256, 256), (768, 256), (256, 1024)])  # (out, in)
@pytest.mark.parametrize("rows", [2, MAX_TRANSPOSED_ROWS])
def test_a_few_rows_are_multiplied_as_w_times_x_transposed_without_a_packed_copy(gemm, rows, shape):
    """From 2 to ``MAX_TRANSPOSED_ROWS`` rows the product is (W x^T)^T on MKL, any matrix size: F.linear's values,
    contiguous, and no packed copy made."""
    gemm("onednn")
    module = OneDNNLinear.of(_linear(*shape)).eval()
    x = torch.randn(rows, 1, shape[1])  # (rows, 1, in), as a decoding step's
    with torch.inference_mode():
        y = module(x)
    assert y.shape == (rows, 1, shape[0]) and y.is_contiguous()
    assert_close(y, F.linear(x, module.weight, module.bias), atol=1e-5, rtol=1e-5)
    assert module.weight not in onednn._PACKED


def test_a_matrix_held_transposed_below_onednns_size_stays_on_f_linear_at_a_few_rows(gemm):
    """A matrix held (in, out) (the tied output projection) never takes the W x^T route, and below ``MIN_WEIGHTS``
    entries not oneDNN's either, at any row count: F.linear, no packed copy."""
    gemm("onednn")
    held = torch.randn(256, 300)  # (in, out): 76,800 entries, between the two size thresholds
    assert onednn.MIN_TRANSPOSED_WEIGHTS <= held.numel() < MIN_WEIGHTS
    for rows in (4, 16):
        x = torch.randn(rows, 256)
        with torch.inference_mode():
            y = onednn.linear(x, held, None, onednn=True, transposed=True)
        assert_close(y, x @ held, atol=1e-5, rtol=1e-5)
    assert held not in onednn._PACKED


def test_a_compiled_product_of_a_few_rows_is_w_times_x_transposed_too(gemm):
    """Under ``torch.compile`` (one graph, traced with AOT autograd) the few-row route holds: F.linear's values, and
    no oneDNN product (no packed copy)."""
    gemm("onednn")
    module = OneDNNLinear.of(_linear(1024, 256)).eval()
    x = torch.randn(4, 1, 256)  # (rows, 1, in)
    torch._dynamo.reset()
    try:
        with torch.inference_mode():
            y = torch.compile(module, fullgraph=True, backend="aot_eager")(x)
    finally:
        torch._dynamo.reset()
    assert_close(y, F.linear(x, module.weight, module.bias), atol=1e-5, rtol=1e-5)
    assert module.weight not in onednn._PACKED


@pytest.mark.parametrize("bias", [True, False])
def test_a_compiled_product_of_one_row_is_written_out_as_a_sum(gemm, bias):
    """Under ``torch.compile`` one row is multiplied as the sum it is (elementwise products summed over the input,
    which Inductor makes one loop over W's rows): no library product in the graph, F.linear's values. Eager, it
    stays F.linear (an (out, in) temporary would cost more than the product)."""
    from torch._dynamo.testing import EagerAndRecordGraphs

    gemm("onednn")
    module = OneDNNLinear.of(_linear(768, 256)).eval()
    if not bias:
        module.register_parameter("bias", None)
    x = torch.randn(1, 1, 256)  # (rows, 1, in), one sentence's decoding step
    backend = EagerAndRecordGraphs()
    torch._dynamo.reset()
    try:
        with torch.inference_mode():
            y = torch.compile(module, fullgraph=True, backend=backend)(x)
    finally:
        torch._dynamo.reset()
    targets = {str(node.target) for graph in backend.graphs for node in graph.graph.nodes}
    assert not {t for t in targets if "linear" in t or "mm" in t}, targets
    assert_close(y, F.linear(x, module.weight, module.bias), atol=1e-5, rtol=1e-5)
    assert y.shape == (1, 1, 768)


def test_a_model_made_under_inference_mode_multiplies_without_a_packed_copy(gemm):
    """Parameters made under ``torch.inference_mode`` are inference tensors, which keep no version counter: no packed
    copy (it could not follow them), F.linear's values, at a row count that would take oneDNN's route."""
    gemm("onednn")
    with torch.inference_mode():
        module = OneDNNLinear.of(_linear())
        x = torch.randn(64, 256)
        y = module(x)
    assert module.weight.is_inference() and module.weight not in onednn._PACKED
    assert_close(y, F.linear(x, module.weight, module.bias), atol=1e-5, rtol=1e-5)


def test_the_packed_copy_follows_its_parameter(gemm):
    """Packed once, used again while the parameter is unchanged, made again after an in-place change, a load, or a
    cast; a deep copy packs its own."""
    gemm("onednn")
    module = OneDNNLinear.of(_linear()).eval()
    x = torch.randn(MAX_TRANSPOSED_ROWS + 8, 256)  # past the few rows multiplied as W x^T

    def check(m: nn.Linear) -> None:
        with torch.inference_mode():
            assert_close(m(x.to(m.weight.dtype)), F.linear(x.to(m.weight.dtype), m.weight, m.bias), atol=1e-5, rtol=0)

    check(module)
    packed = onednn._PACKED[module.weight][1]
    check(module)
    assert onednn._PACKED[module.weight][1] is packed  # reused
    with torch.no_grad():
        module.weight.mul_(-2.0)
    check(module)
    module.load_state_dict(_linear().state_dict())
    check(module)
    twin = copy.deepcopy(module)
    check(twin)
    assert onednn._PACKED[twin.weight][1] is not onednn._PACKED[module.weight][1]
    check(module.double())  # float64: F.linear's product


def test_training_through_a_onednn_linear_takes_f_linear_and_its_gradients(gemm):
    gemm("onednn")
    plain = _linear()
    module = OneDNNLinear.of(copy.deepcopy(plain))
    x = torch.randn(8, 256)
    module(x).square().sum().backward()
    plain(x).square().sum().backward()
    assert module.weight.grad is not None and plain.weight.grad is not None
    assert_close(module.weight.grad, plain.weight.grad, atol=1e-4, rtol=1e-5)


def test_the_library_is_chosen_by_cpu_vendor_unless_attnkit_cpu_gemm_says(gemm, monkeypatch):
    monkeypatch.delenv(onednn.ENV, raising=False)
    for vendor, expected in (("AuthenticAMD", True), ("GenuineIntel", False), ("", False)):
        monkeypatch.setattr(onednn, "_cpu_vendor", lambda vendor=vendor: vendor)
        onednn.uses_onednn.cache_clear()
        assert onednn.uses_onednn() is expected, vendor
    gemm("mkl")
    assert not onednn.uses_onednn()
    gemm("onednn")
    assert onednn.uses_onednn()
    gemm("blas")
    with pytest.raises(InputError, match="ATTNKIT_CPU_GEMM='blas'"):
        onednn.uses_onednn()


def _prepared(cfg: TranslatorConfig) -> Transformer:
    torch.manual_seed(0)
    model = build_translator(cfg, pad_id=PAD)
    with torch.no_grad():
        model.embeddings.token.weight.mul_(8.0)  # confident logits: near ties are rare
    return prepare_for_inference(model)


def _sources(cfg: TranslatorConfig) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(EOS + 1, cfg.vocab_size, (5, 11), generator=gen)  # (B, S)
    src[1, 6:] = PAD
    src[3, 2:] = PAD
    return src


# Large enough that its matrices go to oneDNN (every one but the 256 x 256 ones); tied.
WIDE = TranslatorConfig(vocab_size=600, d_model=256, n_heads=4, d_ff=512, n_layers=2, max_len=64)
SEARCH: dict[str, Any] = dict(bos_id=BOS, eos_id=EOS, max_positions=WIDE.max_len, max_extra=10)


def test_a_prepared_translator_decodes_the_same_tokens_on_either_library(gemm):
    """Greedy and beam search give the tokens that MKL's products give, for a batch with and without padding."""
    src = _sources(WIDE)
    results = {}
    for name in ("mkl", "onednn"):
        gemm(name)  # read when the model is prepared
        model = _prepared(WIDE)
        linears = [m for m in model.modules() if isinstance(m, OneDNNLinear)]
        # Every linear layer: 4 per encoder layer (the fused Q K V, W^O, the FFN's two), 8 per decoder layer.
        assert len(linears) == 2 * 4 + 2 * 8 and all(m.onednn == (name == "onednn") for m in linears)
        assert isinstance(model.output_proj, TiedTransposedOutput) and model.output_proj.onednn == (name == "onednn")
        results[name] = [
            (greedy_decode(model, part, **SEARCH), beam_search(model, part, beam_size=4, **SEARCH))
            for part in (src, src[[0, 2, 4]])  # padded, and not
        ]
    assert results["onednn"] == results["mkl"]
    assert any(results["mkl"][0][0])  # the outputs say something


def test_a_compiled_step_multiplies_on_onednn_without_a_graph_break(gemm, monkeypatch):
    """The compiled beam step (4 rows a sentence: the tied output projection on oneDNN's route, the other products
    as W x^T) compiles whole (``fullgraph=True``), runs oneDNN's product inside the program, and decodes the eager
    step's tokens. The source is one token, so that the encoder (one row) never takes that route itself."""
    gemm("onednn")
    monkeypatch.setattr(programs, "STEPS_PER_PROGRAM", 2)  # several steps a program, at half the compiling time
    cfg = TranslatorConfig(**{**WIDE.__dict__, "n_layers": 1})
    model, src = _prepared(cfg), _sources(cfg)[:1, :1]  # (1, 1)
    calls = []
    packed = onednn._packed
    monkeypatch.setattr(onednn, "_packed", lambda *args: calls.append(1) or packed(*args))  # read at each product
    torch._dynamo.reset()
    try:
        compiled = beam_search(model, src, beam_size=4, engine=Engine("compiled"), **SEARCH)
    finally:
        torch._dynamo.reset()
    assert calls  # the compiled program called oneDNN's product
    assert compiled == beam_search(model, src, beam_size=4, engine=Engine("eager"), **SEARCH)


def test_quantizing_a_prepared_model_rounds_its_onednn_linears_to_int8():
    cfg = TranslatorConfig(vocab_size=64, d_model=32, n_heads=2, d_ff=64, n_layers=1, max_len=16)
    model = quantize_for_inference(prepare_for_inference(build_translator(cfg, pad_id=PAD)))
    assert not any(type(m) is OneDNNLinear for m in model.modules())
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == 4 + 8


def test_an_exported_program_holds_the_papers_product_not_attnkits_operator(gemm):
    """``attnkit export onnx`` exports the prepared classifier of a run: on a machine that routes its products to
    oneDNN, the ONNX graph still holds only standard operators, and computes what the model computes."""
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    gemm("onednn")
    cfg = ClassifierConfig(vocab_size=300, d_model=256, n_heads=4, d_ff=512, n_layers=1, max_len=32, n_classes=2)
    torch.manual_seed(0)
    model = prepare_for_inference(build_classifier(cfg, pad_id=PAD))
    ids = torch.randint(EOS + 1, cfg.vocab_size, (2, 8))  # (B, S)
    ids[1, 5:] = PAD
    dims = {"ids": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq", max=cfg.max_len)}}
    with torch.no_grad():
        program = torch.onnx.export(model, (ids,), input_names=["ids"], dynamo=True, dynamic_shapes=dims)
        expected = model(ids)
    assert program is not None
    nodes = program.model_proto.graph.node
    assert all(node.domain in ("", "ai.onnx", "pkg.onnxscript.torch_lib.common") for node in nodes), {
        node.domain for node in nodes
    }
    session = ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"ids": ids.numpy()})
    assert_close(torch.from_numpy(logits), expected, atol=1e-4, rtol=1e-4)


def test_a_traced_program_holds_the_papers_product_too(gemm):
    gemm("onednn")
    layer = OneDNNLinear.of(_linear()).eval()
    x = torch.randn(4, 256)
    with torch.no_grad():
        traced = torch.jit.trace(layer, (x,))
        graph = str(traced.graph)
        assert "aten::linear" in graph and "mkldnn::" not in graph and "attnkit::" not in graph, graph
        assert_close(traced(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=0)
