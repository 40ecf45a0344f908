"""The HTTP edge of the server: the JSON error object every failure answers with (and the handlers that turn every
exception into one), and the ASGI middleware in front of the app (early 429, body limit, request metrics)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnkit.serving.batcher import Batcher
from attnkit.serving.metrics import Metrics

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.error_type, self.message, self.headers = status, error_type, message, headers


# Handlers return JSONResponse themselves: FastAPI would otherwise walk every answer through jsonable_encoder
# first, which costs more than the model on a small classifier and a lot on attention maps.


def error_response(status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "error_type": error_type}, status_code=status, headers=headers)


ENDPOINTS = (
    "/v1/classify",
    "/v1/embed",
    "/v1/embeddings",
    "/v1/translate",
    "/translate",
    "/v1/attention",
    "/health",
    "/ready",
    "/info",
    "/metrics",
    "/",
    "/openapi.json",
)


INFERENCE = ("/v1/classify", "/v1/embed", "/v1/embeddings", "/v1/translate", "/translate", "/v1/attention")


# A JSON POST handler: the validated request body -> its response (or an ApiError).
Handler = Callable[[Any], Awaitable[Response]]


class Gate:
    """ASGI middleware in front of everything: when the queue is full, an inference request gets its 429 before
    its body is even read (the answer must come in microseconds, not after parsing and tokenizing); bodies over
    ``limit`` bytes get 413 before they are parsed, whether or not the client sent Content-Length. Counts requests
    by endpoint and status, and times them.

    ``direct``: the inference endpoints' handlers, by path, with their request schemas. A JSON body that its schema
    accepts goes straight to the handler; anything else (wrong content type, malformed JSON, a field that fails
    validation) goes through FastAPI, whose answers and messages are the API's. Why: on a small model, FastAPI's
    layers (routing, dependency solving, exception middleware, a second JSON parse) cost more per request than the
    model (measured: ~100 us of a ~400 us request on 2 cores), and the server is meant to keep up with the offline
    CLI. The handlers, their validation and their errors are the same objects on both paths."""

    def __init__(
        self,
        app,
        limit: int,
        metrics: Metrics,
        batcher: Batcher,
        direct: dict[str, tuple[type[BaseModel], Handler]] | None = None,
    ):
        self.app, self.limit, self.metrics, self.batcher = app, limit, metrics, batcher
        self.direct = direct or {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        path = scope["path"]
        endpoint = path if path in ENDPOINTS else ("/static" if path.startswith("/static/") else "other")
        status = 500

        async def send_counted(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if endpoint in INFERENCE and self.batcher.queue_size() >= self.batcher.max_queue:
                response = error_response(
                    429,
                    "queue_full",
                    f"the server is busy ({self.batcher.max_queue} requests queued); retry shortly",
                    {"Retry-After": "1"},
                )
                return await response(scope, receive, send_counted)
            declared = dict(scope["headers"]).get(b"content-length")
            if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
                response = error_response(413, "body_too_large", f"request body over {self.limit} bytes")
                return await response(scope, receive, send_counted)
            body, more = b"", True
            while more:  # bounded: stops at the limit
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body += message.get("body", b"")
                more = message.get("more_body", False)
                if len(body) > self.limit:
                    response = error_response(413, "body_too_large", f"request body over {self.limit} bytes")
                    return await response(scope, receive, send_counted)
            route = self.direct.get(path) if scope["method"] == "POST" else None
            if route is not None and _is_json(scope["headers"]):
                answered = await _answer_directly(*route, body)
                if answered is not None:
                    return await answered(scope, receive, send_counted)
            replayed = False

            async def replay():
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send_counted)
        finally:
            self.metrics.requests.labels(endpoint, str(status)).inc()
            self.metrics.request_seconds.labels(endpoint, str(status)).observe(time.perf_counter() - start)


def _is_json(headers: list[tuple[bytes, bytes]]) -> bool:
    """Content-Type application/json (any parameters): the one type the direct path takes; FastAPI judges the rest."""
    for name, value in headers:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


async def _answer_directly(schema: type[BaseModel], handler: Handler, body: bytes) -> Response | None:
    """The handler's response to ``body``, or None when the schema refuses it (FastAPI then answers the 422)."""
    try:
        request = schema.model_validate_json(body)
    except ValidationError:
        return None
    try:
        return await handler(request)
    except ApiError as err:
        return error_response(err.status, err.error_type, err.message, err.headers)
    except Exception:
        return internal_error()


def internal_error() -> JSONResponse:
    """The answer to an unexpected exception (logged with its traceback): a bug, never something a client sent."""
    log.exception("unexpected error")
    return error_response(500, "internal_error", "internal server error (a bug: see the server log)")


def validation_message(err: RequestValidationError) -> str:
    """The first problem, with where it is: ``beam: Input should be less than or equal to 16``. Of the errors of one
    field, the deepest is named: for ``"inputs": [1, 2]`` that is ``inputs.0``, not "inputs is not a string"."""
    errors = err.errors()
    if not errors:
        return "invalid request"
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"malformed JSON ({first.get('ctx', {}).get('error', 'cannot parse')})"
    same_field = [e for e in errors if tuple(e.get("loc", ()))[:2] == tuple(first.get("loc", ()))[:2]]
    chosen = max(same_field, key=lambda e: len(e.get("loc", ())))
    # "body" is where every field is; "str" / "list[str]" name the branch of a union the value failed, not a field.
    parts = [
        str(p)
        for p in chosen.get("loc", ())
        if p != "body"
        and not (isinstance(p, str) and (p in ("str", "int", "float", "bool") or "[" in p or p.startswith("function-")))
    ]
    return f"{'.'.join(parts) or 'body'}: {chosen.get('msg', 'invalid')}"


def install_error_handlers(app: FastAPI) -> None:
    """Make every failure answer ``error_response``'s JSON: ``ApiError``s, request validation (422), unknown routes
    and methods (404, 405), and anything unexpected (500, logged: a bug)."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError):
        return error_response(err.status, err.error_type, err.message, err.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        content_type = request.headers.get("content-type", "")
        if request.method == "POST" and "json" not in content_type.lower():
            # curl -d sends application/x-www-form-urlencoded: FastAPI then reads no JSON at all, and its message
            # ("Input should be a valid dictionary") would not say why.
            sent = content_type or "no Content-Type"
            message = f"the body must be JSON sent with Content-Type: application/json (got {sent})"
            return error_response(422, "invalid_request", message)
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
        return internal_error()
