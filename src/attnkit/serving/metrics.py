"""Prometheus metrics of one server, in a registry of its own (two apps in one process do not collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from attnkit.serving.batcher import BatchStats

_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "attnkit_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.queue_size = Gauge("attnkit_queue_size", "requests waiting for the inference worker", registry=r)
        self.queue_seconds = Histogram(
            "attnkit_queue_seconds", "time a request waited in the queue", buckets=_SECONDS, registry=r
        )
        self.inference_seconds = Histogram(
            "attnkit_inference_seconds", "time the worker spent on one batch", buckets=_SECONDS, registry=r
        )
        self.request_seconds = Histogram(
            "attnkit_request_seconds",
            "time from request to response, by status (a 429 should take microseconds)",
            ["endpoint", "status"],
            buckets=_SECONDS,
            registry=r,
        )
        self.batch_requests = Histogram(
            "attnkit_batch_requests", "requests per batch", buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r
        )
        self.batch_tokens = Histogram(
            "attnkit_batch_padded_tokens",
            "padded tokens (longest x inputs) per batch",
            buckets=(16, 64, 256, 1024, 4096, 16384, 65536),
            registry=r,
        )

    def observe_batch(self, stats: BatchStats) -> None:
        """Called from the inference worker after each batch (prometheus-client is thread-safe)."""
        self.inference_seconds.observe(stats.inference_s)
        self.batch_requests.observe(stats.n_requests)
        self.batch_tokens.observe(stats.padded_tokens)
        for waited in stats.queue_s:
            self.queue_seconds.observe(waited)
