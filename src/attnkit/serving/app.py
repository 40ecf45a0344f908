"""The HTTP API: a FastAPI app around one served model and its batcher.

Handlers validate and tokenize in the event loop, then await the inference worker (``batcher``); they never run
the model themselves, so the loop keeps answering (health, metrics, 429s) while a batch runs. Every error a client
can cause is a 4xx with JSON ``{"error": message, "error_type": kind}``; a 500 would be a bug.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import struct
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.resources import files
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnkit.serving.batcher import Batcher, Draining, QueueFull, padding_bounded
from attnkit.serving.http import ApiError, Gate, error_response, validation_message
from attnkit.serving.metrics import Metrics
from attnkit.serving.models import ServedModel, finite
from attnkit.serving.schemas import (
    AttentionRequest,
    ClassifyRequest,
    EmbeddingsRequest,
    EmbedRequest,
    LibreTranslateRequest,
    TranslateRequest,
)

log = logging.getLogger(__name__)
STATIC = files("attnkit.serving") / "static"


@dataclass(frozen=True)
class Limits:
    """Every limit of the server (``GET /info`` lists them, so clients can chunk their inputs)."""

    max_body_bytes: int = 1_000_000  # request body (413)
    max_inputs: int = 64  # texts per request (413)
    max_chars: int = 10_000  # characters per text (422 unless truncate)
    max_queue: int = 64  # requests waiting for the worker (429 beyond)
    max_batch_tokens: int = 8192  # padded tokens (longest x inputs) per batch
    max_batch_inputs: int = 64  # inputs per batch
    max_wait_ms: float = 0.0  # wait this long for a batch to fill (0: run as soon as the worker is free)
    timeout_s: float = 30.0  # per request, queue included (504)
    max_beam: int = 8  # beam and n_best (422 beyond)
    attention_max_tokens: int = 64  # /v1/attention input length (422 beyond): the maps grow as its square
    batching: bool = True  # False: one request at a time (the load benchmark's baseline)


def create_app(model: ServedModel | Callable[[], ServedModel], limits: Limits | None = None) -> FastAPI:
    """The app for ``model`` (or a loader, run in a thread at startup: /ready answers 503 until it has loaded and
    warmed up). The inference worker starts and stops with the app's lifespan."""
    limits = limits or Limits()
    metrics = Metrics()
    state: dict = {"model": None, "ready": False, "load_error": None}

    def run_batch(group: tuple, jobs: list[list[list[int]]]) -> list[Any]:
        served: ServedModel = state["model"]
        kind = group[0]
        if kind == "attention":
            return [served.attention(seqs[0]) for seqs in jobs]  # type: ignore[attr-defined]
        flat = [seq for seqs in jobs for seq in seqs]
        order = sorted(range(len(flat)), key=lambda i: len(flat[i]))  # sort by length: little padding
        sorted_seqs = [flat[i] for i in order]
        outs: list[Any] = []
        for part in padding_bounded(sorted_seqs):
            if kind == "classify":
                outs += served.classify(part)  # type: ignore[attr-defined]
            elif kind == "embed":
                outs += served.embed(part, pool=group[1], normalize=group[2])  # type: ignore[attr-defined]
            else:
                _, beam, alpha, penalty, n_best = group
                outs += served.translate(part, beam=beam, alpha=alpha, length_penalty=penalty, n_best=n_best)  # type: ignore[attr-defined]
        by_input: list[object] = [None] * len(flat)
        for i, out in zip(order, outs):
            by_input[i] = out
        results, start = [], 0
        for seqs in jobs:
            results.append(by_input[start : start + len(seqs)])
            start += len(seqs)
        return results

    batcher = Batcher(
        run_batch,
        max_queue=limits.max_queue,
        max_batch_tokens=limits.max_batch_tokens,
        max_batch_inputs=limits.max_batch_inputs,
        max_wait_s=limits.max_wait_ms / 1000,
        batching=limits.batching,
        on_batch=metrics.observe_batch,
    )

    def load_and_warm() -> None:
        try:
            served = model() if callable(model) and not isinstance(model, ServedModel) else model
            state["model"] = served
            warm = [served.token_ids("hello world")]
            group = {
                "classifier": ("classify",),
                "embedder": ("embed", "mean", False),
                "translator": ("translate", 1, 0.6, "gnmt", 1),
            }[served.task]
            run_batch(group, [warm])  # the first call pays for lazy initialisation, not a client
            state["ready"] = True
            log.info("model %s (%s) loaded and warmed up", served.name, served.task)
        except Exception as err:  # reported by /ready; the server stays up to say so
            log.exception("loading the model failed")
            state["load_error"] = str(err)

    loader = threading.Thread(target=load_and_warm, name="attnkit-load", daemon=True)
    lifespans = [0]  # nested lifespans (an in-process test client inside another): start once, stop at the last exit

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        lifespans[0] += 1
        if lifespans[0] == 1 and not loader.is_alive() and not state["ready"]:
            batcher.start()
            loader.start()
        try:
            yield
        finally:
            lifespans[0] -= 1
            if lifespans[0] == 0:
                batcher.stop()
                loader.join(timeout=5)

    app = FastAPI(
        title="attnkit",
        version=__import__("attnkit").__version__,
        lifespan=lifespan,
        description="Classify, embed, translate and look at attention with a trained attnkit model.",
    )
    app.state.batcher, app.state.metrics, app.state.limits, app.state.serving = batcher, metrics, limits, state
    app.add_middleware(Gate, limit=limits.max_body_bytes, metrics=metrics, batcher=batcher)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError):
        return error_response(err.status, err.error_type, err.message, err.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        return error_response(422, "invalid_request", validation_message(err))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException):
        kinds = {404: "not_found", 405: "method_not_allowed"}
        message = {
            404: f"no such endpoint: {request.url.path}",
            405: f"{request.method} is not allowed on {request.url.path}",
        }.get(err.status_code, str(err.detail))
        return error_response(
            err.status_code, kinds.get(err.status_code, "http_error"), message, getattr(err, "headers", None)
        )

    @app.exception_handler(Exception)
    async def _bug(request: Request, err: Exception):
        log.exception("unexpected error on %s", request.url.path)
        return error_response(500, "internal_error", "internal server error (a bug: see the server log)")

    # -- helpers ---------------------------------------------------------------------------------------------------

    def served(task: str | tuple[str, ...]) -> ServedModel:
        if state["load_error"]:
            raise ApiError(503, "not_ready", f"the model failed to load: {state['load_error']}")
        if not state["ready"]:
            raise ApiError(503, "not_ready", "the model is still loading", {"Retry-After": "1"})
        m: ServedModel = state["model"]
        tasks = (task,) if isinstance(task, str) else task
        if m.task not in tasks:
            raise ApiError(
                400, "wrong_model", f"this endpoint needs a {' or '.join(tasks)}; the server runs a {m.task}"
            )
        return m

    def encode(
        m: ServedModel, inputs: str | list[str], truncate: bool, field: str = "inputs", max_tokens: int | None = None
    ) -> tuple[list[str], list[list[int]], list[bool]]:
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        if not texts:
            raise ApiError(422, "invalid_request", f"{field}: give at least one text")
        if len(texts) > limits.max_inputs:
            raise ApiError(
                413, "too_many_inputs", f"{field}: {len(texts)} texts; at most {limits.max_inputs} per request"
            )
        cap = max_tokens or m.max_len
        seqs, cut = [], []
        for i, text in enumerate(texts):
            where = f"{field}[{i}]" if not isinstance(inputs, str) else field
            if not text.strip():
                raise ApiError(422, "empty_input", f"{where} is empty")
            was_cut = False
            if len(text) > limits.max_chars:
                if not truncate:
                    raise ApiError(
                        422,
                        "input_too_long",
                        f"{where} has {len(text)} characters; at most "
                        f'{limits.max_chars} (send "truncate": true to cut it)',
                    )
                text, was_cut = text[: limits.max_chars], True
            ids = m.token_ids(text)
            if len(ids) > cap:
                if not truncate or max_tokens is not None:
                    hint = "" if max_tokens is not None else ' (send "truncate": true to cut it)'
                    raise ApiError(422, "input_too_long", f"{where} has {len(ids)} tokens; the limit is {cap}{hint}")
                ids, was_cut = m.truncate(ids), True
            texts[i] = text
            seqs.append(ids)
            cut.append(was_cut)
        return texts, seqs, cut

    async def infer(group: tuple, seqs: list[list[int]]) -> Any:
        metrics.queue_size.set(batcher.queue_size())
        try:
            return await batcher.submit(group, seqs, limits.timeout_s)
        except QueueFull:
            raise ApiError(
                429,
                "queue_full",
                f"the server is busy ({limits.max_queue} requests queued); retry shortly",
                {"Retry-After": "1"},
            ) from None
        except Draining:
            raise ApiError(503, "shutting_down", "the server is shutting down") from None
        except asyncio.TimeoutError:
            raise ApiError(504, "timeout", f"no answer within {limits.timeout_s:g} s") from None
        finally:
            metrics.queue_size.set(batcher.queue_size())

    # -- endpoints -------------------------------------------------------------------------------------------------

    @app.post("/v1/classify")
    async def classify(body: ClassifyRequest):
        """Labels and class probabilities, the objects `attnkit classify predict` prints."""
        m = served("classifier")
        texts, seqs, cut = encode(m, body.inputs, body.truncate)
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

    @app.post("/v1/embed")
    async def embed(body: EmbedRequest):
        """Sentence vectors, as `attnkit embed` computes them."""
        m = served(("classifier", "embedder"))
        _, seqs, cut = encode(m, body.inputs, body.truncate)
        vectors = await infer(("embed", body.pool, body.normalize), seqs)
        return JSONResponse({"model": m.name, "dim": len(vectors[0]), "vectors": vectors, "truncated": cut})

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingsRequest):
        """OpenAI's embeddings shape (unit-length vectors, mean pooling); over-long inputs are refused."""
        m = served(("classifier", "embedder"))
        _, seqs, _ = encode(m, body.input, False, field="input")
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

    def check_beam(beam: int, n_best: int) -> None:
        if beam > limits.max_beam:
            raise ApiError(422, "invalid_request", f"beam: {beam} is over this server's limit of {limits.max_beam}")
        if n_best > beam:
            raise ApiError(422, "invalid_request", f"n_best={n_best} must be <= beam={beam}")

    @app.post("/v1/translate")
    async def translate(body: TranslateRequest):
        """Translations (the best one is what `attnkit translate run` prints) with the n-best list: raw summed
        log-probabilities and the length-penalised scores they are ranked by (§6.1)."""
        m = served("translator")
        check_beam(body.beam, body.n_best)
        texts, seqs, cut = encode(m, body.inputs, body.truncate)
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

    @app.post("/translate")
    async def libretranslate(body: LibreTranslateRequest):
        """LibreTranslate's shape: ``{"q": ..., "source": ..., "target": ...}`` -> ``{"translatedText": ...}``."""
        m = served("translator")
        beam = max(4, body.alternatives + 1)
        check_beam(beam, body.alternatives + 1)
        _, seqs, _ = encode(m, body.q, False, field="q")
        nbest = await infer(("translate", beam, 0.6, "gnmt", body.alternatives + 1), seqs)
        best = [cands[0].translation for cands in nbest]
        alts = [[c.translation for c in cands[1:]] for cands in nbest]
        single = isinstance(body.q, str)
        out: dict = {"translatedText": best[0] if single else best}
        if body.alternatives:
            out["alternatives"] = alts[0] if single else alts
        return JSONResponse(out)

    @app.post("/v1/attention")
    async def attention(body: AttentionRequest):
        """Attention maps ``[layer][head][query][key]`` for one input: encoder self-attention, and for a translator
        also decoder self- and cross-attention of its greedy translation (§3.2.3)."""
        m = served(("classifier", "embedder", "translator"))
        cap = min(limits.attention_max_tokens, m.max_len)
        _, seqs, _ = encode(m, body.inputs, False, max_tokens=cap)
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

    @app.get("/health")
    async def health():
        """The process is alive (it may still be loading: see /ready)."""
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        """200 once the model is loaded and warmed up; 503 before, on a failed load, and while shutting down."""
        if state["load_error"]:
            return error_response(503, "not_ready", f"the model failed to load: {state['load_error']}")
        if not state["ready"]:
            return error_response(503, "not_ready", "the model is still loading", {"Retry-After": "1"})
        if batcher._draining:
            return error_response(503, "shutting_down", "the server is shutting down")
        return {"status": "ready"}

    @app.get("/info")
    async def info():
        """The model's task and configuration, and every limit of the server."""
        m = served(("classifier", "embedder", "translator"))
        return {
            "model": m.name,
            "task": m.task,
            "labels": m.labels,
            "max_len": m.max_len,
            "n_layers": m.n_layers,
            "n_heads": m.n_heads,
            "config": m.config(),
            "limits": {
                **asdict(limits),
                "max_tokens": m.max_len,
                "attention_max_tokens": min(limits.attention_max_tokens, m.max_len),
            },
            "version": app.version,
        }

    @app.get("/metrics", include_in_schema=False)
    async def prometheus():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        metrics.queue_size.set(batcher.queue_size())
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def playground():
        return FileResponse(str(STATIC / "index.html"))

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    return app
