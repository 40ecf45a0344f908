"""The HTTP API: a FastAPI app around one served model and its batcher.

Handlers validate and tokenize in the event loop, then await the inference worker (``batcher``); they never run
the model themselves, so the loop keeps answering (health, metrics, 429s) while a batch runs. Every error a client
can cause is a 4xx with JSON ``{"error": message, "error_type": kind}``; a 500 would be a bug.

This file is the app's wiring and its route handlers only (one short handler per endpoint); the limits and input
checks are ``limits.py``, the error handlers ``http.py``, the middleware in front (API key, early 429, body limit,
headers) ``gate.py``, running a batch ``models.py``, the HTTP server and its defences against slow clients
``server.py``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import struct
import threading
from collections.abc import Callable
from dataclasses import asdict
from importlib.resources import files
from typing import Any, get_type_hints

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from attnkit.serving.auth import ApiKey
from attnkit.serving.batcher import Batcher, Draining, QueueFull
from attnkit.serving.gate import Gate, Route
from attnkit.serving.http import ApiError, error_response, install_error_handlers
from attnkit.serving.limits import Limits, check_beam, encode_inputs
from attnkit.serving.metrics import Metrics
from attnkit.serving.models import DEFAULT_BEAM, ServedModel, finite, run_batch, warm_up
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
from attnkit.serving.worker import ProcessRunner, WorkerDied

log = logging.getLogger(__name__)
STATIC = files("attnkit.serving") / "static"


def create_app(
    model: ServedModel | Callable[[], ServedModel],
    limits: Limits | None = None,
    runner: ProcessRunner | None = None,
    api_key: str | None = None,
) -> FastAPI:
    """The app for ``model`` (or a loader, run in a thread at startup: /ready answers 503 until it has loaded and
    warmed up). The inference worker starts and stops with the app's lifespan.

    ``runner``: where batches run. None: on the batcher's thread, with ``model`` itself (in-process tests). A
    ``ProcessRunner`` (what ``attnkit serve`` uses): in a child process with its own copy of the model, so that the
    model and the event loop do not share a GIL; ``model`` then serves tokenization and metadata only.

    ``api_key``: requests need it (``auth.py`` says which and how), or None: no key."""
    limits = limits or Limits()
    metrics = Metrics()
    state: dict = {"model": None, "ready": False, "load_error": None}

    def run_loaded(group: tuple, jobs: list[list[list[int]]]) -> list[Any]:
        if runner is not None:
            return runner(group, jobs)
        return run_batch(state["model"], group, jobs)

    batcher = Batcher(
        run_loaded,
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
            if runner is not None:
                runner.start()  # loads and warms up the child's copy
            else:
                warm_up(served)
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
                if runner is not None:
                    runner.close()

    app = FastAPI(
        title="attnkit",
        version=__import__("attnkit").__version__,
        lifespan=lifespan,
        description="Classify, embed, translate and look at attention with a trained attnkit model.",
    )
    app.state.batcher, app.state.metrics, app.state.limits, app.state.serving = batcher, metrics, limits, state
    app.state.runner = runner
    direct: dict[str, Route] = {}  # the inference endpoints, for Gate's direct path
    key = ApiKey(api_key) if api_key is not None else None
    app.add_middleware(Gate, limits=limits, metrics=metrics, batcher=batcher, direct=direct, api_key=key)
    install_error_handlers(app, form_paths=("/translate",))

    def post(path: str, form: Callable[[bytes, bytes], Any] | None = None, **route_options: Any):
        """``@app.post(path)``, and the handler is also answered directly by Gate (see there), with ``form``
        reading the form shape of its request where it has one."""

        def register(handler: Callable) -> Callable:
            direct[path] = Route(get_type_hints(handler)["body"], handler, form)
            return app.post(path, **route_options)(handler)

        return register

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
        except WorkerDied as err:
            state["load_error"] = str(err)  # /ready says so from now on
            raise ApiError(503, "not_ready", str(err)) from None
        finally:
            metrics.queue_size.set(batcher.queue_size())

    # -- endpoints -------------------------------------------------------------------------------------------------

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
        _, seqs, cut = encode_inputs(m, body.inputs, body.truncate, limits)
        vectors = await infer(("embed", body.pool, body.normalize), seqs)
        return JSONResponse({"model": m.name, "dim": len(vectors[0]), "vectors": vectors, "truncated": cut})

    @post("/v1/embeddings")
    async def embeddings(body: EmbeddingsRequest):
        """OpenAI's embeddings shape (unit-length vectors, mean pooling); over-long inputs are refused."""
        m = served(("classifier", "embedder"))
        _, seqs, _ = encode_inputs(m, body.input, False, limits, field="input")
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
        _, seqs, _ = encode_inputs(m, body.q, False, limits, field="q")
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
        _, seqs, _ = encode_inputs(m, body.inputs, False, limits, max_tokens=cap)
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

    # HEAD: the probes of some load balancers. One route per method, so that each operation of the OpenAPI
    # description has an operationId of its own (one route with two methods gives both the same id).
    @app.get("/health")
    @app.head("/health")
    async def health():
        """The process is alive (it may still be loading: see /ready)."""
        return {"status": "ok"}

    @app.get("/ready")
    @app.head("/ready")
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
        """The model's task and configuration, where and in what precision it runs, and every limit of the server."""
        m = served(("classifier", "embedder", "translator"))
        where = runner.inference if runner is not None else m.inference()
        return {
            "model": m.name,
            "task": m.task,
            "inference": {**where, "worker": "process" if runner is not None else "thread"},
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
