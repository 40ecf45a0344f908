"""The HTTP API: a FastAPI app around one served model and its batcher.

Handlers validate and tokenize in the event loop, then await the inference worker (``batcher``); they never run
the model themselves, so the loop keeps answering (health, metrics, 429s) while a batch runs. Every error a client
can cause is a 4xx with JSON ``{"error": message, "error_type": kind}``; a 500 would be a bug.

This file is the app's wiring only: the model's loading and warm-up, the batcher and the lifespan that starts and
stops both, the middleware and error handlers, and the two helpers every handler uses (``served``, ``infer``). The
inference endpoints are ``routes.py``, the probes, /info and the metrics ``probes.py``; the limits and input checks
``limits.py``, the error handlers ``http.py``, the middleware in front (API key, early 429, body limit, headers)
``gate.py``, the model ``models.py`` and running a batch on it ``execute.py``, the HTTP server and its defences
against slow clients ``server.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from importlib.resources import files
from typing import Any, get_type_hints

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from attnkit.serving.auth import ApiKey
from attnkit.serving.batcher import Batcher, Draining, QueueFull
from attnkit.serving.execute import run_batch, warm_up
from attnkit.serving.gate import Gate, Route
from attnkit.serving.http import ApiError, install_error_handlers
from attnkit.serving.limits import Limits
from attnkit.serving.metrics import Metrics
from attnkit.serving.models import ServedModel
from attnkit.serving.probes import add_probes
from attnkit.serving.routes import add_task_routes
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
        redirect_slashes=False,  # /v1/classify/ is a 404 like any unknown path, not a redirect built from Host
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
                400, "wrong_model", f"this endpoint needs {_a(' or '.join(tasks))}; the server runs {_a(m.task)}"
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

    # -- endpoints: inference (routes.py), probes and metrics (probes.py), the playground --------------------------

    add_task_routes(post, served=served, infer=infer, limits=limits)
    add_probes(app, state=state, batcher=batcher, metrics=metrics, limits=limits, runner=runner, served=served)

    @app.get("/", include_in_schema=False)
    async def playground():
        return FileResponse(str(STATIC / "index.html"))

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    _state_beam_limit(app, limits)
    return app


def _state_beam_limit(app: FastAPI, limits: Limits) -> None:
    """This server's beam limit (``--max-beam``) as the ``maximum`` of the fields it bounds, wherever the OpenAPI
    document has them (the JSON bodies and the form): the request models leave them open, as the limit is the
    server's."""
    bounds = {"beam": limits.max_beam, "n_best": limits.max_beam, "alternatives": limits.max_beam - 1}
    build = app.openapi

    def bound(node: Any) -> None:
        if isinstance(node, dict):
            properties = node.get("properties")
            for name, field in properties.items() if isinstance(properties, dict) else ():
                if name in bounds and field.get("type") == "integer":
                    field["maximum"] = bounds[name]
            for value in node.values():
                bound(value)
        elif isinstance(node, list):
            for value in node:
                bound(value)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            bound(build())  # FastAPI builds the document once and keeps it in app.openapi_schema
        return build()

    app.openapi = openapi  # type: ignore[method-assign]


def _a(noun: str) -> str:
    """``noun`` with its indefinite article: a classifier, an embedder."""
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"
