"""Properties that must hold for every input, checked on random ones (hypothesis): readers never crash, tokenizers
never crash and round-trip, a sentence's result does not depend on the batch it is in, and no mask yields NaN.

Numerical properties run with ``derandomize=True``: the same examples every run, so a near tie between two logits
cannot make a test pass on one run and fail on the next.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from attnkit.config import ClassifierConfig, TranslatorConfig
from attnkit.data.readers.labeled import read_labeled
from attnkit.data.readers.parallel import read_parallel_tsv
from attnkit.data.readers.texts import read_texts
from attnkit.decoding import greedy_decode
from attnkit.errors import InputError
from attnkit.model.attention import MultiHeadAttention, scaled_dot_product_attention
from attnkit.model.build import build_classifier, build_translator
from attnkit.model.classifier import TransformerClassifier
from attnkit.model.transformer import Transformer
from attnkit.tokenization import train_tokenizer

NUMERIC = settings(max_examples=60, deadline=None, derandomize=True)


pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------------------
# Readers: any bytes give rows or an InputError, never another exception (which the CLI shows as a traceback)

# Pieces of the formats, so that random files get past the first check often enough to reach the later ones.
FRAGMENTS = [
    b"text",
    b"label",
    b"source",
    b"target",
    b"\t",
    b",",
    b"\n",
    b"\r\n",
    b"\r",
    b" ",
    b'"',
    b'""',
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b'"text"',
    b'"label"',
    b"1",
    b"true",
    b"null",
    b"\xef\xbb\xbf",
    b"\xe9",
    b"\xc3\xa9",
    b"\x00",
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"\xe2\x80\xa8",
    b"\x0c",
    b"good film",
    b"pos",
]
FIELD = st.text(
    st.characters(codec="utf-8", exclude_characters="\t\n\r") | st.sampled_from(" \u2028\x0c\ufeff\x00"), max_size=8
)
LINE_END = st.sampled_from(["\n", "\r\n", "\r"])
BOM = st.sampled_from(["", "\ufeff"])


@st.composite
def table_text(draw):
    """A TSV that is often well formed: a header naming text and label (or not), then rows of 1 to 3 fields."""
    header = draw(st.sampled_from(["text\tlabel", "label\ttext\tid", "source\ttarget", "text", "text\ttext\tlabel"]))
    width = len(header.split("\t"))
    row = st.lists(FIELD, min_size=width, max_size=width) | st.lists(FIELD, min_size=1, max_size=3)
    rows = draw(st.lists(row.map("\t".join), max_size=5))
    end = draw(LINE_END)
    return draw(BOM) + end.join([header, *rows]) + draw(st.sampled_from(["", end]))


@st.composite
def csv_text(draw):
    header = draw(st.sampled_from(["text,label", "label,text,id", "text"]))
    rows = draw(
        st.lists(
            st.lists(
                FIELD.map(lambda f: f if draw(st.booleans()) else '"' + f.replace('"', '""') + '"'),
                min_size=1,
                max_size=3,
            ).map(",".join),
            max_size=5,
        )
    )
    return draw(BOM) + draw(LINE_END).join([header, *rows]) + "\n"


JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | FIELD,
    lambda inner: st.lists(inner, max_size=3),
    max_leaves=5,
)
JSON_RECORD = st.fixed_dictionaries({"text": FIELD, "label": FIELD | st.integers() | st.booleans()}) | st.dictionaries(
    st.sampled_from(["text", "label", "id"]), JSON_VALUE, max_size=3
)
JSONL_TEXT = st.lists(JSON_RECORD.map(json.dumps) | st.just(""), max_size=5).map("\n".join)


@st.composite
def corrupted(draw, text):
    """UTF-8 bytes of ``text``, sometimes with one byte changed."""
    data = bytearray(draw(text).encode("utf-8"))
    if data and draw(st.booleans()):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


FILE_BYTES = st.one_of(
    st.binary(max_size=300),
    st.lists(st.sampled_from(FRAGMENTS), max_size=40).map(b"".join),
    corrupted(table_text()),
    corrupted(csv_text()),
    corrupted(JSONL_TEXT),
)
READERS = {
    ".tsv": (read_labeled, read_texts, read_parallel_tsv),
    ".csv": (read_labeled, read_texts),
    ".jsonl": (read_labeled, read_texts),
    ".txt": (read_texts, read_parallel_tsv),
}
SCRATCH = Path(tempfile.mkdtemp(prefix="attnkit-properties-"))  # module-wide: hypothesis reuses one test call


@pytest.mark.parametrize("suffix", list(READERS))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=FILE_BYTES)
@example(data=b"text\tlabel\n\xef\xbb\xbfa\tb\n")
@example(data=b'{"text": "a", "label": "b"}\n[]\n')
@example(data=b'text,label\n"unclosed\n')
def test_readers_never_crash_on_any_bytes(suffix, data):
    path = SCRATCH / f"input{suffix}"
    path.write_bytes(data)
    for read in READERS[suffix]:
        try:
            rows = read(path)
        except InputError as err:
            assert str(err).startswith(f"{path}:"), err  # every message names the file
            assert "\n" not in str(err).split(": ", 1)[0]
        else:
            assert rows  # an accepted file has at least one row
            for row in rows:
                for field in row if isinstance(row, tuple) else vars(row).values():
                    if isinstance(field, str):
                        assert field and field == field.strip() and "\r" not in field


@pytest.mark.parametrize(
    "line", ['{"text": "a", "label": ' + "1" * 5000 + "}", "[" * 100_000], ids=["huge_integer", "deep_nesting"]
)
def test_jsonl_that_json_cannot_decode_is_an_input_error(line):
    # json.loads raises a plain ValueError (an integer over 4300 digits) or RecursionError (deep nesting) for these,
    # not JSONDecodeError; random bytes this small never reach them.
    path = SCRATCH / "limits.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=f"^{path}:1: "):
        read_labeled(path)


# ---------------------------------------------------------------------------------------------------------------
# Tokenizers

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A wonderful film, truly inspiring; I loved it!",
    "Terrible plot? Awful acting: a waste of time.",
    "Zebras and yaks eat hay near the river.",
] * 4
ALPHABET = sorted(set("".join(CORPUS)))
# 320: BPE reserves 256 byte-fallback ids beyond the 5 specials (lossless BPE); the word vocabulary stays far below.
TOKENIZERS = {kind: train_tokenizer(CORPUS, kind=kind, vocab_size=320, min_freq=1) for kind in ("word", "bpe")}


@pytest.mark.parametrize("kind", list(TOKENIZERS))
@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200))
@example(text="\x00\ud7ff\U0010ffff")
@example(text="ﬁ ² Ⅸ ㍻")  # NFKC expands these
def test_tokenizer_never_crashes_and_ids_stay_in_the_vocabulary(kind, text):
    tok = TOKENIZERS[kind]
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.encode_batch([text, text]) == [ids, ids]
    assert isinstance(tok.decode(ids), str)


@pytest.mark.parametrize("kind", list(TOKENIZERS))
@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(0, 199), max_size=50))
def test_any_ids_decode(kind, ids):
    assert isinstance(TOKENIZERS[kind].decode(ids), str)


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet=ALPHABET, max_size=80).map(" ".join).map(str.split).map(" ".join))
@example(text="yaks")
@example(text="!?.")
def test_bpe_round_trips_text_in_its_training_alphabet(text):
    # Single spaces between non-blank pieces: what a stripped source or target line looks like.
    tok = TOKENIZERS["bpe"]
    assert tok.decode(tok.encode(text)) == text


# ---------------------------------------------------------------------------------------------------------------
# Batch invariance

V, MAX_LEN, PAD, BOS, EOS = 30, 12, 0, 3, 4
LENGTHS = st.lists(st.one_of(st.just(1), st.just(MAX_LEN), st.integers(1, MAX_LEN)), min_size=1, max_size=6)


def _ids(lengths: list[int], seed: int) -> list[torch.Tensor]:
    """One 1-D tensor of random non-special ids per length."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(EOS + 1, V, (n,), generator=generator) for n in lengths]


def _pad(sentences: list[torch.Tensor]) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(sentences, batch_first=True, padding_value=PAD)  # (B, S)


def _classifier(pooling: str, norm: str) -> TransformerClassifier:
    with torch.random.fork_rng():
        torch.manual_seed(1)
        cfg = ClassifierConfig(
            vocab_size=V,
            d_model=16,
            n_heads=2,
            d_ff=32,
            n_layers=2,
            max_len=MAX_LEN,
            n_classes=3,
            pooling=pooling,
            norm=norm,
        )
        return build_classifier(cfg, pad_id=PAD).eval()


CLASSIFIERS = {(pooling, norm): _classifier(pooling, norm) for pooling in ("mean", "cls") for norm in ("post", "pre")}


@pytest.mark.parametrize(("pooling", "norm"), list(CLASSIFIERS))
@NUMERIC
@given(lengths=LENGTHS, seed=st.integers(0, 2**31 - 1))
@example(lengths=[1, MAX_LEN, 1], seed=0)
@example(lengths=[MAX_LEN, MAX_LEN], seed=0)
def test_classifier_logits_do_not_depend_on_the_batch(pooling, norm, lengths, seed):
    model = CLASSIFIERS[(pooling, norm)]
    sentences = _ids(lengths, seed)
    with torch.no_grad():
        batched = model(_pad(sentences))  # (B, C)
        explicit, _ = model.forward_with_attention(_pad(sentences), attn_layers=(0, 1))  # (B, C), maps requested
        for b, sentence in enumerate(sentences):
            assert_close(batched[b], model(sentence[None])[0], atol=1e-5, rtol=0)
    assert_close(explicit, batched, atol=1e-5, rtol=0)


def _translator(norm: str) -> Transformer:
    """Untied, with a scaled-up output projection (as in tests/decoding/test_search.py): a random tied model copies
    its input forever, and peaked distributions make near ties between candidates rare. The EOS row is scaled
    further so that some outputs end with EOS before their length limit and others run to it."""
    with torch.random.fork_rng():
        torch.manual_seed(2)
        cfg = TranslatorConfig(
            vocab_size=V, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=64, norm=norm, tie_embeddings=False
        )
        model = build_translator(cfg, pad_id=PAD).eval()
        with torch.no_grad():
            model.output_proj.weight.mul_(3.0)
            model.output_proj.weight[EOS].mul_(2.0)
    return model


TRANSLATORS = {norm: _translator(norm) for norm in ("post", "pre")}
DECODE: dict[str, Any] = {"bos_id": BOS, "eos_id": EOS, "max_positions": 64, "max_extra": 8}


def _sources(lengths: list[int], seed: int) -> list[torch.Tensor]:
    sentences = _ids(lengths, seed)
    for sentence in sentences:
        sentence[-1] = EOS  # sources end with EOS, as the tokenizer pipeline makes them
    return sentences


@pytest.mark.parametrize("norm", list(TRANSLATORS))
def test_the_random_translators_are_not_degenerate(norm):
    # Otherwise batch invariance would hold trivially: some outputs stop at EOS, some at their limit, with varied
    # tokens.
    lengths = [3, 7, 12, 1] * 8
    sources = [s for seed in range(4) for s in _sources(lengths, seed)]
    outputs = greedy_decode(TRANSLATORS[norm], _pad(sources), **DECODE)
    at_limit = [len(out) == len(src) + 8 for out, src in zip(outputs, sources)]
    assert any(at_limit) and not all(at_limit)
    assert len({token for out in outputs for token in out}) >= 5


@pytest.mark.parametrize("norm", list(TRANSLATORS))
@NUMERIC
@given(lengths=LENGTHS, seed=st.integers(0, 2**31 - 1))
@example(lengths=[1, MAX_LEN, 3], seed=0)
def test_greedy_output_does_not_depend_on_the_batch(norm, lengths, seed):
    model = TRANSLATORS[norm]
    sentences = _sources(lengths, seed)
    batched = greedy_decode(model, _pad(sentences), **DECODE)
    alone = [greedy_decode(model, sentence[None], **DECODE)[0] for sentence in sentences]
    assert batched == alone
    assert all(PAD not in out and EOS not in out and BOS not in out for out in batched)


# ---------------------------------------------------------------------------------------------------------------
# Masks never yield NaN, forward or backward


@st.composite
def masks(draw, *, heads: int | None = None, square: bool = False):
    """A boolean mask, True = may attend, in one of the shapes the model uses, with fully masked query rows likely,
    and the (B, H, T, S) it broadcasts to."""
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    H = heads or draw(st.integers(1, 3))
    S = T if square else draw(st.integers(1, 4))
    shape = draw(st.sampled_from([(B, H, T, S), (B, 1, T, S), (B, 1, 1, S), (1, 1, T, S)]))
    density = draw(st.sampled_from([0.0, 0.2, 0.5, 1.0]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    mask = torch.rand(shape, generator=generator) < density
    if draw(st.booleans()):
        mask[..., 0, :] = False  # a fully masked query row (every row, for the (B, 1, 1, S) shape)
    return mask, (B, H, T, S)


@NUMERIC
@given(drawn=masks())
def test_explicit_attention_is_finite_with_any_mask(drawn):
    mask, (B, H, T, S) = drawn
    q = (torch.randn(B, H, T, 4) * 3).requires_grad_()  # large scores: softmax near saturation
    k = (torch.randn(B, H, S, 4) * 3).requires_grad_()
    v = torch.randn(B, H, S, 4).requires_grad_()
    out, weights = scaled_dot_product_attention(q, k, v, mask)  # (B, H, T, 4), (B, H, T, S)
    assert out.isfinite().all() and weights.isfinite().all()
    dead = ~mask.any(dim=-1, keepdim=True).expand(B, H, T, S)  # rows that may attend to nothing
    assert (weights[dead] == 0).all() and (out[dead[..., :1].expand_as(out)] == 0).all()
    (out.square().sum() + weights.square().sum()).backward()
    assert all(t.grad.isfinite().all() for t in (q, k, v))


@NUMERIC
@given(data=st.data(), need_weights=st.booleans(), cross=st.booleans())
def test_multi_head_attention_is_finite_with_any_mask(data, need_weights, cross):
    mask, (B, _, T, S) = data.draw(masks(heads=2, square=not cross))
    with torch.random.fork_rng():
        torch.manual_seed(3)
        mha = MultiHeadAttention(d_model=8, n_heads=2)
    query = torch.randn(B, T, 8).requires_grad_()  # (B, T, D)
    memory = torch.randn(B, S, 8).requires_grad_() if cross else None  # (B, S, D)
    out, weights, _ = mha(query, memory, mask, need_weights=need_weights)  # (B, T, D)
    assert out.isfinite().all()
    assert (weights is not None) == need_weights and (weights is None or weights.isfinite().all())
    out.square().sum().backward()
    grads = [query.grad, *(p.grad for p in mha.parameters())] + ([memory.grad] if cross else [])
    assert all(g.isfinite().all() for g in grads)
