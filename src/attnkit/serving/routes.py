"""The inference endpoints of the HTTP API, one short handler each: a request's texts are checked and encoded
(``limits.py``), run by the inference worker as one group of the batcher (``execute.py``), and its outputs shaped
into the response. attnkit's own shapes (``/v1/classify``, ``/v1/embed``, ``/v1/translate``, ``/v1/attention``),
and two other servers' shapes so that their clients work unchanged: OpenAI's ``/v1/embeddings`` and LibreTranslate's
``/translate`` (its form and its ``api_key`` field are read in ``schemas.py`` and ``auth.py``).

``create_app`` (``app.py``) gives the handlers the model (``served``: 503 while it loads, 400 on an endpoint of
another task) and the batcher (``infer``: 429, 503 or 504 when it cannot answer).
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.responses import JSONResponse

from attnkit.serving.execute import DEFAULT_BEAM
from attnkit.serving.http import ApiError
from attnkit.serving.limits import Limits, check_beam, encode_inputs
from attnkit.serving.models import ServedModel
from attnkit.serving.schemas import (
    FORM,
    AttentionRequest,
    ClassifyRequest,
    EmbeddingsRequest,
    EmbedRequest,
    LibreTranslateForm,
    LibreTranslateRequest,
    TranslateRequest,
    libretranslate_form,
)

# ``create_app``'s ``post(path, form=None, **route_options)``: a decorator that registers a handler.
Post = Callable[..., Callable[[Callable], Callable]]


def finite(x: float) -> float | None:
    """JSON has no inf/NaN: a score of -inf (impossible output) is sent as null."""
    return x if math.isfinite(x) else None


def add_task_routes(
    post: Post,
    *,
    served: Callable[[str | tuple[str, ...]], ServedModel],
    infer: Callable[[tuple, list[list[int]]], Awaitable[Any]],
    limits: Limits,
) -> None:
    """Register the inference endpoints with ``post``, in the order the API's description lists them."""

    @post("/v1/classify")
    async def classify(body: ClassifyRequest):
        """Labels and class probabilities, the objects `attnkit classify predict` prints."""
        m = served("classifier")
        texts, seqs, cut = encode_inputs(m, body.inputs, body.truncate, limits)
        probs = await infer(("classify",), seqs)
        labels = m.labels or []
        results = []
        for text, ids, row, was_cut in zip(texts, seqs, probs, cut):
            best = max(range(len(row)), key=row.__getitem__)
            results.append(
                {
                    "text": text,
                    "label": labels[best],
                    "probs": dict(zip(labels, row)),
                    "tokens": [m.tokenizer.backend.id_to_token(i) for i in ids],
                    "truncated": was_cut,
                }
            )
        return JSONResponse({"model": m.name, "results": results})

    @post("/v1/embed")
    async def embed(body: EmbedRequest):
        """Sentence vectors, as `attnkit embed` computes them."""
        m = served(("classifier", "embedder"))
        if body.pool == "cls" and m.tokenizer.cls_id is None:  # the first position is the first word's
            raise ApiError(422, "invalid_request", "pool: 'cls' takes the [CLS] token, which this model does not have")
        _, seqs, cut = encode_inputs(m, body.inputs, body.truncate, limits)
        vectors = await infer(("embed", body.pool, body.normalize), seqs)
        return JSONResponse({"model": m.name, "dim": len(vectors[0]), "vectors": vectors, "truncated": cut})

    @post("/v1/embeddings")
    async def embeddings(body: EmbeddingsRequest):
        """OpenAI's embeddings shape (unit-length vectors, mean pooling); over-long inputs are refused."""
        m = served(("classifier", "embedder"))
        _, seqs, _ = encode_inputs(m, body.input, None, limits, field="input")
        vectors = await infer(("embed", "mean", True), seqs)
        if body.dimensions is not None and body.dimensions != len(vectors[0]):
            raise ApiError(422, "invalid_request", f"dimensions: the model's vectors have {len(vectors[0])}")
        n_tokens = sum(len(s) for s in seqs)

        def encoded(v: list[float]) -> list[float] | str:
            if body.encoding_format == "base64":  # little-endian float32, as OpenAI sends them
                return base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode()
            return v

        return JSONResponse(
            {
                "object": "list",
                "model": body.model or m.name,
                "data": [{"object": "embedding", "index": i, "embedding": encoded(v)} for i, v in enumerate(vectors)],
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            }
        )

    @post("/v1/translate")
    async def translate(body: TranslateRequest):
        """Translations (the best one is what `attnkit translate run` prints) with the n-best list: raw summed
        log-probabilities and the length-penalised scores they are ranked by (§6.1)."""
        m = served("translator")
        check_beam(body.beam, body.n_best, limits)
        texts, seqs, cut = encode_inputs(m, body.inputs, body.truncate, limits)
        nbest = await infer(("translate", body.beam, body.alpha, body.length_penalty, body.n_best), seqs)
        results = []
        for text, cands, was_cut in zip(texts, nbest, cut):
            listed = [
                {
                    "translation": c.translation,
                    "score": finite(c.score),
                    "normalized_score": finite(c.normalized_score),
                    "eos": c.eos,
                }
                for c in cands
            ]
            results.append(
                {
                    "text": text,
                    "translation": listed[0]["translation"],
                    "score": listed[0]["score"],
                    "normalized_score": listed[0]["normalized_score"],
                    "n_best": listed,
                    "truncated": was_cut,
                }
            )
        return JSONResponse({"model": m.name, "results": results})

    # Gate reads the form; FastAPI's schema only describes it (the form shape carries one text).
    form_body = {"content": {FORM: {"schema": LibreTranslateForm.model_json_schema()}}}

    @post("/translate", form=libretranslate_form, openapi_extra={"requestBody": form_body})
    async def libretranslate(body: LibreTranslateRequest):
        """LibreTranslate's shape: ``{"q": ..., "source": ..., "target": ...}`` -> ``{"translatedText": ...}``, as
        JSON, or as a form (``application/x-www-form-urlencoded`` or the query string) as its client libraries
        send it."""
        m = served("translator")
        if body.alternatives + 1 > limits.max_beam:  # named as the client named it, not as the beam it becomes
            limit = limits.max_beam - 1
            raise ApiError(
                422, "invalid_request", f"alternatives: {body.alternatives} is over this server's limit of {limit}"
            )
        beam = max(DEFAULT_BEAM, body.alternatives + 1)
        check_beam(beam, body.alternatives + 1, limits)
        _, seqs, _ = encode_inputs(m, body.q, None, limits, field="q")
        nbest = await infer(("translate", beam, 0.6, "gnmt", body.alternatives + 1), seqs)
        best = [cands[0].translation for cands in nbest]
        alts = [[c.translation for c in cands[1:]] for cands in nbest]
        single = isinstance(body.q, str)
        out: dict = {"translatedText": best[0] if single else best}
        if body.alternatives:
            out["alternatives"] = alts[0] if single else alts
        return JSONResponse(out)

    @post("/v1/attention")
    async def attention(body: AttentionRequest):
        """Attention maps ``[layer][head][query][key]`` for one input: encoder self-attention, and for a translator
        also decoder self- and cross-attention of its greedy translation (§3.2.3)."""
        m = served(("classifier", "embedder", "translator"))
        cap = min(limits.attention_max_tokens, m.max_len)
        _, seqs, _ = encode_inputs(m, body.inputs, None, limits, max_tokens=cap)
        maps = await infer(("attention",), seqs)  # one dict: an attention request has one input
        out = {
            "model": m.name,
            "task": m.task,
            "n_layers": m.n_layers,
            "n_heads": m.n_heads,
            "tokens": [m.tokenizer.backend.id_to_token(i) for i in seqs[0]],
            **maps,
        }
        if m.task == "classifier":
            (probs,) = await infer(("classify",), seqs)
            out["probs"] = dict(zip(m.labels or [], probs))
        return JSONResponse(out)
