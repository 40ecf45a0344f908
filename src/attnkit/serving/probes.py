"""The endpoints that answer about the server rather than run its model: the probes of load balancers and
orchestrators (``/health``: the process is alive; ``/ready``: the model is loaded and warmed up), ``/info`` (the model
and every limit, so that clients can chunk their inputs) and the Prometheus metrics (``/metrics``, ``metrics.py``).
None of them waits for the inference worker: they answer while a batch runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

from fastapi import FastAPI
from fastapi.responses import Response

from attnkit.serving.batcher import Batcher
from attnkit.serving.http import error_response
from attnkit.serving.limits import Limits
from attnkit.serving.metrics import Metrics
from attnkit.serving.models import ServedModel
from attnkit.serving.worker import ProcessRunner


def add_probes(
    app: FastAPI,
    *,
    state: dict,
    batcher: Batcher,
    metrics: Metrics,
    limits: Limits,
    runner: ProcessRunner | None,
    served: Callable[[str | tuple[str, ...]], ServedModel],
) -> None:
    """Register the probes, ``/info`` and ``/metrics`` on ``app``. ``state``: ``create_app``'s record of the model
    (``model``, ``ready``, ``load_error``)."""

    # HEAD (the probes of some load balancers) is answered wherever GET is, by Gate (``gate.py``).
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
