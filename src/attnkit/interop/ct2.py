"""attnkit translators as CTranslate2 models: the conversion, ``attnkit export ct2`` and ``--engine ct2``.

Why one file of ~430 lines: the tensor map below is the single fact the conversion, the export and the translator
all rest on (an export is the conversion saved with its vocabulary; the translator reads back what the export
wrote, with the same token list). Kept together, a change to the map and to its readers is one diff.

CTranslate2 (``ctranslate2``, an optional dependency) runs Transformer inference in C++. Its converters fill a
``ctranslate2.specs.TransformerSpec`` with weights and save it; ``attnkit_to_ct2`` fills the same specification from
an ``attnkit.model.transformer.Transformer`` (benchmarks compare the two engines on the same weights),
``export_ct2`` turns a translator run directory into a deployable CTranslate2 model directory, and ``CT2Translator``
translates text with it, tokenized and detokenized by attnkit's own tokenizer.

Where each attnkit tensor goes (D = d_model; CTranslate2 stores Linear weights as (out, in), like PyTorch):

    embeddings.token.weight (V, D)          ->  encoder.embeddings[0].weight, decoder.embeddings.weight, and
                                                decoder.projection.weight when tied (§3.4: one shared matrix)
    embeddings.scale (sqrt(D) or 1)         ->  encoder/decoder.scale_embeddings
    positional table (max_len, D)           ->  encoder/decoder.position_encodings.encodings (set explicitly:
                                                CTranslate2's built-in sinusoids put all sines before all cosines,
                                                §3.5 and attnkit interleave them)
    self_attn q_proj, k_proj, v_proj        ->  self_attention.linear[0], stacked (3D, D)
    cross_attn q_proj / k_proj, v_proj      ->  attention.linear[0] / attention.linear[1], (D, D) / (2D, D)
    *_attn.out_proj                         ->  linear[-1]
    norm1, norm2 (, norm3)                  ->  self_attention.layer_norm, (attention.layer_norm,) ffn.layer_norm
    ffn.linear1, ffn.linear2                ->  ffn.linear_0, ffn.linear_1
    encoder/decoder.final_norm (pre-LN)     ->  encoder/decoder.layer_norm

In CTranslate2's post-norm mode (``pre_norm=False``) each ``layer_norm`` is applied after the residual sum, the
paper's order; in pre-norm mode before the sub-layer, with a final LayerNorm per stack, as attnkit's pre-LN.

Decoding with CTranslate2 as ``attnkit translate`` decodes (``CT2Translator``):
    vocabulary   the tokenizer's id -> token list, so every CTranslate2 token string is exactly one attnkit id.
    source       attnkit's ids end with EOS (truncation keeps it). The export sets ``add_source_eos``, so the
                 translator passes the tokens before that EOS and CTranslate2 appends it: the same ids, EOS once.
                 ``max_input_length=0``: CTranslate2 must not cut sources; attnkit's policy already did.
    target       starts from BOS; ``min_decoding_length=0`` (CTranslate2's default 1 would forbid an immediate EOS,
                 which attnkit allows). attnkit bans ``<pad>`` after the softmax, so that scores stay the model's
                 log-probabilities; CTranslate2 can only ban before it, renormalizing them. Greedy search bans it
                 (the arg max is the same); beam search does not, so that hypotheses are ranked by the model's own
                 log-probabilities (a trained model gives ``<pad>``, never a target, a negligible probability).
    length       §6.1: at most input length (EOS included) + 50 output tokens, EOS not counted, and no more than
                 the positional table (``max_len``). CTranslate2's ``max_decoding_length`` counts the same tokens
                 but is one number per call, so sentences are grouped by their limit, one call per group.
    ranking      CTranslate2's own length penalty divides log P(Y) by |Y|^alpha, |Y| without EOS, and its beam
                 search then stops a sentence once ``beam`` hypotheses have finished; attnkit's default is GNMT's
                 ((5 + |Y|) / 6)^alpha with |Y| counting EOS (``attnkit.decoding.penalty``), and its beam search
                 stops only when no live hypothesis can overtake the best finished one. So CTranslate2 searches
                 with ``length_penalty=0`` and returns its ``beam`` finished hypotheses with their log-probabilities
                 (EOS included), and attnkit's penalty picks the best. The result is attnkit's exactly for beam 1
                 (greedy: nothing is ranked) and for alpha = 0 (lp = 1: CTranslate2 stops when the best candidate is
                 EOS, which no live hypothesis can beat). For beam > 1 and alpha > 0 CTranslate2 may stop before a
                 longer hypothesis that attnkit waits for has finished. On a toy reversal model, of 500 beam-4
                 outputs 500 were attnkit's with GNMT alpha 0.6, 498 at alpha 1; 415 with CTranslate2's own
                 ``length_penalty=0.6``; with "power" at alpha 1, which favours long outputs most, only 369.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import torch

from attnkit import __version__
from attnkit.atomic import atomic_directory, atomic_write_json
from attnkit.decoding.penalty import check_length_penalty
from attnkit.decoding.penalty import length_penalty as penalty
from attnkit.errors import InputError
from attnkit.inference.fused import FusedSelfAttention
from attnkit.model.attention import MultiHeadAttention
from attnkit.model.layers import DecoderLayer, EncoderLayer, PositionwiseFeedForward
from attnkit.model.positional import LearnedPositionalEmbedding
from attnkit.model.transformer import Embeddings, Transformer
from attnkit.tokenization.tokenizer import SPECIAL_TOKENS, Tokenizer

META = "attnkit_ct2.json"  # what attnkit adds to a CTranslate2 model directory (source run, token conventions)
TOKENIZER = "tokenizer.json"
MAX_EXTRA = 50  # §6.1: maximum output length = input length + 50
# Weight types CTranslate2 can store (``ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES``). On a CPU without
# efficient 16-bit or int16 kernels (``ctranslate2.get_supported_compute_types("cpu")``, typically int8, int8_float32
# and float32) CTranslate2 converts them when loading: 16-bit floats to float32, int16 and int8_* to int8_float32.
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise InputError("CTranslate2 is not installed (pip install ctranslate2)") from None
    return ctranslate2


# ---------------------------------------------------------------------------------------------------------------
# The conversion


def default_tokens(vocab_size: int) -> list[str]:
    """Token strings for a model without a tokenizer: attnkit's special tokens, then ``t<id>`` for every other id."""
    return [*SPECIAL_TOKENS, *(f"t{i}" for i in range(len(SPECIAL_TOKENS), vocab_size))][:vocab_size]


def tokenizer_tokens(tokenizer: Tokenizer) -> list[str]:
    """The token string of every id, in id order: the vocabulary CTranslate2 gets, so its strings map 1:1 to ids."""
    found = [tokenizer.backend.id_to_token(i) for i in range(tokenizer.vocab_size)]
    tokens = [token for token in found if token is not None]
    if len(tokens) != len(found) or len(set(tokens)) != len(tokens):
        raise InputError(
            "the tokenizer's ids are not one distinct token each, so CTranslate2's strings would not map back to ids"
        )
    return tokens


def attnkit_to_ct2(
    model: Transformer,
    out_dir: str | Path,
    *,
    tokens: list[str] | None = None,
    bos: str = "<bos>",
    eos: str = "<eos>",
    unk: str = "<unk>",
    add_source_eos: bool = True,
    quantization: str | None = None,
) -> Path:
    """Save ``model`` as a CTranslate2 model directory (``model.bin``, ``config.json``, ``shared_vocabulary.json``).

    Args:
        tokens: the vocabulary, token string of each id in order (default ``default_tokens``).
        bos: the decoder start token (attnkit feeds BOS at position 0); eos, unk: as in the tokenizer.
        add_source_eos: CTranslate2 appends ``eos`` to every source, as ``attnkit translate`` does; benchmarks that
            pass complete sources turn it off.
        quantization: weight type to store (None keeps float32; one of ``QUANTIZATIONS``).
            A float32 model can also be quantized when loaded, with ``Translator(compute_type=...)``.
    Returns:
        ``out_dir``.
    Raises:
        ImportError: ``ctranslate2`` is not installed.
        ValueError: the model has a structure CTranslate2's Transformer cannot express, or the vocabulary does not
            match it.
    """
    from ctranslate2.specs import common_spec, transformer_spec

    vocab_size = model.embeddings.token.num_embeddings
    tokens = default_tokens(vocab_size) if tokens is None else list(tokens)
    if len(tokens) != vocab_size:
        raise ValueError(f"{len(tokens)} tokens given for a vocabulary of {vocab_size}")
    for name, token in (("bos", bos), ("eos", eos), ("unk", unk)):
        if token not in tokens:
            raise ValueError(f"{name} token {token!r} is not in the vocabulary")

    # nn.ModuleList items are typed as Module; the stacks hold attnkit's layers.
    encoder_layers = cast("list[EncoderLayer]", model.encoder.layers)
    decoder_layers = cast("list[DecoderLayer]", model.decoder.layers)
    first = encoder_layers[0]
    attn = first.self_attn
    d_model = attn.out_proj.out_features
    if attn.n_heads * attn.d_head != d_model:
        # CTranslate2's TransformerSpec.from_config derives the head width from d_model / heads.
        raise ValueError(f"d_head={attn.d_head} with n_heads={attn.n_heads} is decoupled from d_model={d_model}")
    activations = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}  # GELU = the erf form

    spec = transformer_spec.TransformerSpec.from_config(
        (len(encoder_layers), len(decoder_layers)),
        attn.n_heads,
        pre_norm=first.residual.pre_norm,
        activation=activations[first.ffn.activation],
    )
    spec.config.layer_norm_epsilon = first.norm1.eps

    weights = _Weights()
    weights.embeddings(spec.encoder, spec.encoder.embeddings[0], model.embeddings)  # a list: one per source feature
    weights.embeddings(spec.decoder, spec.decoder.embeddings, model.embeddings)
    for layer_spec, layer in zip(spec.encoder.layer, encoder_layers):
        weights.attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
        weights.norm(layer_spec.self_attention.layer_norm, layer.norm1)
        weights.ffn(layer_spec.ffn, layer.ffn)
        weights.norm(layer_spec.ffn.layer_norm, layer.norm2)
    for layer_spec, dec_layer in zip(spec.decoder.layer, decoder_layers):
        weights.attention(layer_spec.self_attention, dec_layer.self_attn, self_attention=True)
        weights.norm(layer_spec.self_attention.layer_norm, dec_layer.norm1)
        weights.attention(layer_spec.attention, dec_layer.cross_attn, self_attention=False)
        weights.norm(layer_spec.attention.layer_norm, dec_layer.norm2)
        weights.ffn(layer_spec.ffn, dec_layer.ffn)
        weights.norm(layer_spec.ffn.layer_norm, dec_layer.norm3)
    for stack_spec, stack in ((spec.encoder, model.encoder), (spec.decoder, model.decoder)):
        if stack.final_norm is not None:
            weights.norm(stack_spec.layer_norm, stack.final_norm)
    projection = model.embeddings.token.weight if model.output_proj is None else model.output_proj.weight
    assert isinstance(projection, torch.Tensor)  # an nn.Linear's weight, or the tied embedding's
    spec.decoder.projection.weight = weights.array(projection)  # (V, D), no bias

    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.config.bos_token = bos
    spec.config.eos_token = eos
    spec.config.unk_token = unk
    spec.config.decoder_start_token = bos
    spec.config.add_source_eos = add_source_eos

    spec.validate()
    spec.optimize(quantization=quantization)  # also stores the tied matrix once (aliases equal variables)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(out_dir))
    return out_dir


class _Weights:
    """Copies attnkit tensors into specification fields, as float32 NumPy arrays detached from the model."""

    @staticmethod
    def array(tensor: torch.Tensor):
        return tensor.detach().to(torch.float32).cpu().numpy().copy()

    def embeddings(self, stack_spec, embeddings_spec, embeddings: Embeddings) -> None:
        if embeddings.token_type is not None or embeddings.norm is not None:
            raise ValueError("CTranslate2's TransformerSpec has no token-type embeddings or embedding LayerNorm")
        embeddings_spec.weight = self.array(embeddings.token.weight)  # (V, D)
        stack_spec.scale_embeddings = float(embeddings.scale)
        position = embeddings.position
        if isinstance(position, LearnedPositionalEmbedding):
            table = position.embedding.weight  # (max_len, D)
        else:
            table = position.table  # the sinusoidal buffer
        stack_spec.position_encodings.encodings = self.array(table)  # (max_len, D)

    def linear(self, linear_spec, *linears: torch.nn.Linear) -> None:
        """One Linear, or several stacked along the output dimension (fused q/k/v)."""
        linear_spec.weight = self.array(torch.cat([lin.weight for lin in linears]))  # (sum out, in)
        if linears[0].bias is not None:
            linear_spec.bias = self.array(torch.cat([lin.bias for lin in linears]))  # (sum out,)

    def attention(self, attn_spec, attn: MultiHeadAttention, *, self_attention: bool) -> None:
        if isinstance(attn, FusedSelfAttention):  # a model prepared for inference: W^Q, W^K, W^V already stacked
            self.linear(attn_spec.linear[0], attn.qkv)  # (3D, D)
        elif self_attention:
            self.linear(attn_spec.linear[0], attn.q_proj, attn.k_proj, attn.v_proj)  # (3D, D)
        else:
            self.linear(attn_spec.linear[0], attn.q_proj)  # (D, D), applied to the decoder states
            self.linear(attn_spec.linear[1], attn.k_proj, attn.v_proj)  # (2D, D), applied to the encoder output
        self.linear(attn_spec.linear[-1], attn.out_proj)

    def ffn(self, ffn_spec, ffn: PositionwiseFeedForward) -> None:
        self.linear(ffn_spec.linear_0, ffn.linear1)
        self.linear(ffn_spec.linear_1, ffn.linear2)

    def norm(self, norm_spec, norm: torch.nn.LayerNorm) -> None:
        norm_spec.gamma = self.array(norm.weight)
        norm_spec.beta = self.array(norm.bias)


# ---------------------------------------------------------------------------------------------------------------
# A run directory as a CTranslate2 model directory


def export_ct2(run_dir: str | Path, out_dir: str | Path, *, quantization: str | None = None) -> Path:
    """Write the translator run at ``run_dir`` as a CTranslate2 model directory at ``out_dir``.

    The directory holds CTranslate2's files (``model.bin``, ``config.json``, ``shared_vocabulary.json``), attnkit's
    ``tokenizer.json`` and ``attnkit_ct2.json`` (the source run, the quantization, the token-id conventions, the
    length policy and the tokenizer's fingerprint). It is built under a temporary name beside ``out_dir`` and
    renamed into place, so it appears complete or not at all; an earlier export at ``out_dir`` is replaced.

    Args:
        quantization: weight type to store, one of ``QUANTIZATIONS`` (None keeps float32).
    Raises:
        InputError: CTranslate2 is missing, the quantization is unknown, the run is not a readable translator or
            has a structure CTranslate2 cannot express, or ``out_dir`` is something other than an earlier export.
    """
    from attnkit import runs
    from attnkit.tasks.translate import TranslatorRun

    _ctranslate2()
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise InputError(f"quantization {quantization!r}; expected one of {', '.join(QUANTIZATIONS)}")
    run = TranslatorRun(run_dir)  # checks the files against the manifest and that the run is a translator
    tokenizer = run.tokenizer
    tokens = tokenizer_tokens(tokenizer)
    if len(tokens) != run.model_cfg.vocab_size:
        raise InputError(f"{run.run_dir}: the tokenizer has {len(tokens)} tokens, the model {run.model_cfg.vocab_size}")
    if tokenizer.bos_id is None or tokenizer.eos_id is None:
        raise InputError(f"{run.run_dir}: the tokenizer has no BOS or EOS token, which a translator needs")
    meta = {
        "format": "attnkit-ct2/1",
        "attnkit_version": __version__,
        "source_run": str(run.run_dir.resolve()),
        "source_manifest_sha256": runs.sha256_file(run.run_dir / runs.MANIFEST),
        "quantization": quantization or "float32",
        "tokenizer": tokenizer.meta(),  # kind, special-token roles, fingerprint (checked when the export is loaded)
        "tokens": {
            "vocabulary": "the tokenizer's token of each id, in id order (shared by source and target)",
            "vocab_size": len(tokens),
            "pad_id": tokenizer.pad_id,
            "unk_id": tokenizer.unk_id,
            "bos_id": tokenizer.bos_id,
            "eos_id": tokenizer.eos_id,
            "decoder_start_token": tokens[tokenizer.bos_id],
            "add_source_eos": True,  # pass a source's tokens without its EOS; CTranslate2 appends it
        },
        "decoding": {"max_len": run.model_cfg.max_len, "max_len_policy": run.max_len_policy, "max_extra": MAX_EXTRA},
    }

    out_dir = Path(out_dir)
    _check_out(out_dir)
    with atomic_directory(out_dir) as work:
        try:
            attnkit_to_ct2(
                run.model,
                work,
                tokens=tokens,
                bos=tokens[tokenizer.bos_id],
                eos=tokens[tokenizer.eos_id],
                unk=tokens[tokenizer.unk_id],
                add_source_eos=True,
                quantization=quantization,
            )
        except ValueError as err:
            raise InputError(f"{run.run_dir}: cannot be expressed as a CTranslate2 Transformer ({err})") from None
        tokenizer.save(work / TOKENIZER)
        atomic_write_json(work / META, meta)
    return out_dir


def _check_out(out_dir: Path) -> None:
    """Refuse to replace anything but an empty directory or an earlier export (never a run or unrelated files)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / META).is_file():
        raise InputError(f"{out_dir}: exists and is not an attnkit CTranslate2 export; choose a new --out")


# ---------------------------------------------------------------------------------------------------------------
# Translating with an export


class CT2Translator:
    """An exported translator run by CTranslate2 (on the CPU, or a GPU with its CUDA build), with attnkit's tokenizer
    and decoding conventions.

    Args:
        model_dir: a directory written by ``export_ct2``.
        compute_type: CTranslate2's compute type; "default" keeps the stored weight type (converted when the CPU
            has no kernels for it), "int8" quantizes a float32 export when loading.
        threads: CTranslate2's ``intra_threads`` (0 = its default).
        device: ``cpu`` or ``cuda:N`` (CTranslate2 has no MPS backend).
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        compute_type: str = "default",
        threads: int = 0,
        device: torch.device | None = None,
    ):
        from attnkit.runs import read_json

        ctranslate2 = _ctranslate2()
        model_dir = Path(model_dir)
        if not (model_dir / META).is_file():
            raise InputError(
                f"{model_dir}: not an attnkit CTranslate2 export (no {META}); write one with `attnkit export ct2`"
            )
        meta = read_json(model_dir / META)
        try:
            self.tokenizer = Tokenizer.load(model_dir / TOKENIZER, meta["tokenizer"])
            self.max_len = int(meta["decoding"]["max_len"])
            self.max_len_policy = meta["decoding"]["max_len_policy"]
            self.max_extra = int(meta["decoding"]["max_extra"])
        except InputError:
            raise
        except (KeyError, TypeError, ValueError) as err:
            raise InputError(f"{model_dir / META}: missing or malformed key ({err})") from None
        self.tokens = tokenizer_tokens(self.tokenizer)  # id -> token
        self.ids = {token: i for i, token in enumerate(self.tokens)}  # token -> id
        device = device or torch.device("cpu")
        if device.type not in ("cpu", "cuda"):
            raise InputError(f"--engine ct2 runs on cpu or cuda, not {device}")
        if device.type == "cuda" and ctranslate2.get_cuda_device_count() == 0:
            raise InputError(f"--engine ct2 --device {device}: this CTranslate2 build sees no CUDA device")
        try:
            self.translator = ctranslate2.Translator(
                str(model_dir),
                device=device.type,
                device_index=device.index or 0,
                compute_type=compute_type,
                intra_threads=threads,
            )
        except (RuntimeError, ValueError) as err:
            raise InputError(f"{model_dir}: CTranslate2 cannot load it ({err})") from None
        self.model_dir = model_dir
        self.meta = meta

    def encode_sources(self, texts: list[str]) -> tuple[list[list[int]], int]:
        """Source ids (+ EOS), truncated (and counted) or refused exactly as ``TranslatorRun`` does."""
        from attnkit.tasks.translate import encode_sources

        return encode_sources(self.tokenizer, texts, self.max_len, self.max_len_policy)

    def translate_ids(
        self,
        sources: list[list[int]],
        *,
        beam: int = 4,
        alpha: float = 0.6,
        length_penalty: str = "gnmt",
        batch_size: int = 32,
    ) -> list[list[int]]:
        """Output ids (no BOS, no EOS) of encoded sources (each ending with EOS), in input order.

        beam 1 is greedy search; beam > 1 is beam search ranked by attnkit's ``length_penalty`` (the module
        docstring says when the result is exactly ``attnkit.decoding.corpus.translate_ids``'s).
        """
        check_length_penalty(length_penalty, alpha)
        if beam < 1 or batch_size < 1:
            raise InputError(f"beam={beam} and batch_size={batch_size} must be >= 1")
        eos = self.tokenizer.eos_id
        by_limit: dict[int, list[int]] = {}
        for i, src in enumerate(sources):
            if not src or src[-1] != eos:
                raise ValueError(f"source #{i + 1} does not end with EOS (id {eos})")
            # §6.1: input length + 50 tokens, within the positional table (attnkit.decoding.limits.output_limits).
            by_limit.setdefault(max(1, min(len(src) + self.max_extra, self.max_len)), []).append(i)
        out: list[list[int]] = [[] for _ in sources]
        for limit, rows in by_limit.items():
            results = self.translator.translate_batch(
                [[self.tokens[t] for t in sources[i][:-1]] for i in rows],  # CTranslate2 appends the EOS
                max_batch_size=batch_size,
                beam_size=beam,
                num_hypotheses=beam,
                length_penalty=0,
                return_scores=beam > 1,
                return_end_token=True,
                max_decoding_length=limit,
                min_decoding_length=0,
                max_input_length=0,
                suppress_sequences=[[self.tokens[self.tokenizer.pad_id]]] if beam == 1 else None,
            )
            for i, result in zip(rows, results):
                out[i] = self._best(result, kind=length_penalty, alpha=alpha)
        return out

    def _best(self, result, *, kind: str, alpha: float) -> list[int]:
        """The finished hypothesis with the best log P(Y) / lp(|Y|), |Y| counting EOS when it was emitted (as
        attnkit's beam search ranks), without its EOS."""
        hyps = [[self.ids[token] for token in tokens] for tokens in result.hypotheses]  # (n, |Y|) ids, EOS included
        if len(hyps) > 1:
            normalized = [score / penalty(len(ids), kind=kind, alpha=alpha) for ids, score in zip(hyps, result.scores)]
            hyps = [hyps[max(range(len(hyps)), key=normalized.__getitem__)]]
        best = hyps[0]
        return best[:-1] if best and best[-1] == self.tokenizer.eos_id else best

    def translate(
        self, texts: list[str], *, beam: int = 4, alpha: float = 0.6, length_penalty: str = "gnmt", batch_size: int = 32
    ) -> tuple[list[str], int]:
        """Detokenized translations in input order, and how many sources were truncated."""
        ids, n_truncated = self.encode_sources(texts)
        hyps = self.translate_ids(ids, beam=beam, alpha=alpha, length_penalty=length_penalty, batch_size=batch_size)
        return self.tokenizer.decode_batch(hyps), n_truncated
