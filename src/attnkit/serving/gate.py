"""The ASGI middleware in front of the whole app (``Gate``): what is checked before a request reaches FastAPI, and
the inference requests it answers itself.

In order: the API key (401), the queue (an early 429), the body's size and codings (413, 415, 501), then a valid
request goes straight to its handler; HEAD is answered as GET, without the body. LibreTranslate's ``/translate``
may carry its key in the body instead of the header: then the body is read first (so its size and codings come
before the key), and the key is looked for in it before anything else.

Every response gets ``nosniff``, the playground's files a Content-Security-Policy. How long a request's head and
body may take to arrive is the server's to enforce (``server.py``): a deadline per request here would cost more
than the rest of Gate (an anyio or asyncio timeout: 30-50 us a request, measured).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from attnkit.serving.auth import ApiKey, bearer_token, libretranslate_key, needs_key
from attnkit.serving.batcher import Batcher
from attnkit.serving.http import ApiError, error_response, internal_error, not_utf8, validation_message
from attnkit.serving.limits import Limits
from attnkit.serving.metrics import Metrics
from attnkit.serving.schemas import FORM

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

# The playground is plain files from this server: its page may run this server's scripts and styles and call this
# server, and nothing else (no inline script, no other origin, no framing). Its JS sets styles through the CSSOM
# (element.style.width), which a style-src without 'unsafe-inline' allows.
PLAYGROUND_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
NOSNIFF = (b"x-content-type-options", b"nosniff")
# In a request's ASGI scope: Gate puts the request's task there, and the server (``server.py``) cancels it, marking
# the scope, when the client closes the connection before the answer began. The server also marks a request whose
# body has not all arrived: an answer then closes the connection (``server.py``), and says so.
REQUEST_TASK, CLIENT_GONE, BODY_PENDING = "attnkit.task", "attnkit.client_gone", "attnkit.body_pending"
PAGE_HEADERS = [NOSNIFF, (b"content-security-policy", PLAYGROUND_CSP.encode())]


# A JSON POST handler: the validated request body -> its response (or an ApiError).
Handler = Callable[[Any], Awaitable[Response]]


@dataclass(frozen=True)
class Route:
    """An inference endpoint as Gate answers it: its JSON schema and handler, and for LibreTranslate's
    ``/translate`` the reader of its form shape (query string and urlencoded body -> a request)."""

    schema: type[BaseModel]
    handler: Handler
    form: Callable[[bytes, bytes], BaseModel] | None = None


class Gate:
    """ASGI middleware in front of everything. When the queue is full, an inference request gets its 429 before
    its body is even read (the answer must come in microseconds, not after parsing and tokenizing); bodies over
    ``limits.max_body_bytes`` get 413 before they are parsed, whether or not the client sent Content-Length. With
    ``api_key``, requests that need it (``auth.needs_key``) get 401 without it. Counts requests by endpoint and
    status, and times them.

    ``direct``: the inference endpoints, by path. A JSON body that its schema accepts (or a form that
    ``Route.form`` reads) goes straight to the handler; anything else (wrong content type, malformed JSON, a field
    that fails validation) goes through FastAPI, whose answers and messages are the API's. Why: on a small model,
    FastAPI's layers (routing, dependency solving, exception middleware, a second JSON parse) cost more per request
    than the model (measured: ~100 us of a ~400 us request on 2 cores), and the server is meant to keep up with the
    offline CLI. The handlers, their validation and their errors are the same objects on both paths."""

    def __init__(
        self,
        app,
        limits: Limits,
        metrics: Metrics,
        batcher: Batcher,
        direct: dict[str, Route] | None = None,
        api_key: ApiKey | None = None,
    ):
        self.app, self.limits, self.metrics, self.batcher = app, limits, metrics, batcher
        self.direct, self.api_key = direct or {}, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        scope[REQUEST_TASK] = asyncio.current_task()
        path = scope["path"]
        endpoint = path if path in ENDPOINTS else ("/static" if path.startswith("/static/") else "other")
        extra_headers = PAGE_HEADERS if endpoint in ("/", "/static") else [NOSNIFF]
        status = 500
        head = scope["method"] == "HEAD"  # RFC 9110 §9.3.2: wherever GET is, HEAD is: the same answer, no body
        app_scope = {**scope, "method": "GET"} if head else scope

        async def send_counted(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), *extra_headers]}
            elif head:
                message = {**message, "body": b""}
            await send(message)

        try:
            headers, key = scope["headers"], self.api_key
            key_sent = key is None or not needs_key(path) or key.matches(bearer_token(headers))
            if not key_sent and endpoint != "/translate":  # only LibreTranslate's shape carries a key in its body
                return await _unread(scope, _refuse_key(headers, endpoint))(scope, receive, send_counted)
            if key_sent and (busy := self._busy(endpoint)) is not None:
                return await _unread(scope, busy)(scope, receive, send_counted)
            body = await self._read_body(headers, receive)
            if body is None:  # the client went away: counted as nginx counts it, "client closed request"
                status = 499
                return
            if isinstance(body, Response):
                return await body(scope, receive, send_counted)
            media, query = _media_type(headers), scope["query_string"]
            # A form: a body sent as one, or no body and the fields in the query string (``requests.post(url,
            # params=...)``, as some LibreTranslate clients send them).
            form = media == FORM or (not body and bool(query))
            if key is not None and not key_sent:
                if not key.matches(libretranslate_key(not form, query, body)):
                    return await _refuse_key(headers, endpoint)(scope, receive, send_counted)
                if (busy := self._busy(endpoint)) is not None:
                    return await busy(scope, receive, send_counted)
            # JSON is UTF-8 between systems (RFC 8259 §8.1), under any JSON media type FastAPI reads (+json too)
            if (media == "application/json" or media.endswith("+json")) and body and (why := not_utf8(body)):
                return await error_response(422, "invalid_request", why)(scope, receive, send_counted)
            if query and endpoint in INFERENCE and endpoint != "/translate":  # LibreTranslate's reads its query
                return await _refuse_query(query)(scope, receive, send_counted)
            route = self.direct.get(path) if scope["method"] == "POST" else None
            if route is not None:
                answered = await _answer_directly(route, form, media == "application/json", query, body)
                if answered is not None:
                    return await answered(scope, receive, send_counted)
            replayed = False

            async def replay():
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(app_scope, replay, send_counted)
        except asyncio.CancelledError:
            if not scope.get(CLIENT_GONE):
                raise
            status = 499  # the server cancelled it: its client went away (the task ends here, answering nobody)
        finally:
            self.metrics.requests.labels(endpoint, str(status)).inc()
            self.metrics.request_seconds.labels(endpoint, str(status)).observe(time.perf_counter() - start)

    def _busy(self, endpoint: str) -> Response | None:
        if endpoint in INFERENCE and self.batcher.queue_size() >= self.batcher.max_queue:
            return error_response(
                429,
                "queue_full",
                f"the server is busy ({self.batcher.max_queue} requests queued); retry shortly",
                {"Retry-After": "1"},
            )
        return None

    async def _read_body(self, headers: list[tuple[bytes, bytes]], receive) -> bytes | Response | None:
        """The whole body, or the answer that refuses it unread (413, 415, 501), or None when the client
        disconnected (or the server, past ``Limits.body_timeout_s``, disconnected it: ``server.py`` times the
        body). Bounded: stops at the limit."""
        limit = self.limits.max_body_bytes
        fields = dict(headers)
        declared, coding = fields.get(b"content-length"), fields.get(b"transfer-encoding")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return _too_large(limit)
        if (declared not in (None, b"0") or coding is not None) and (refused := _refuse_codings(fields)):
            return refused
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                return _too_large(limit)
        return body


def _refuse_query(query: bytes) -> Response:
    """422 for a query string on an endpoint that reads its JSON body alone: ``?beam=8`` was ignored (the default
    beam ran) where an unknown field of the body is refused."""
    names = sorted({name for name, _ in parse_qsl(query.decode("latin-1"), keep_blank_values=True)}) or ["?"]
    return error_response(
        422, "invalid_request", f"query string ({', '.join(names)}): not read here; send the fields in the JSON body"
    )


def _too_large(limit: int) -> Response:
    """413, and the connection closes after it (the rest of the body is not read: ``server.py``)."""
    return error_response(413, "body_too_large", f"request body over {limit} bytes", {"Connection": "close"})


def _refuse_codings(fields: dict[bytes, bytes]) -> Response | None:
    """415 for a body with a content coding (RFC 9110 §8.4: gzip, br, ...; the server reads plain bodies only, and
    before, a gzip body got 422 "not UTF-8" and a ``br`` label on a plain body passed), 501 for a transfer coding
    other than chunked (RFC 9112 §6.1; h11 refuses those itself, with 400); None for neither. The body is not read,
    and the connection closes after the answer."""
    content = fields.get(b"content-encoding", b"identity").decode("latin-1")
    if any(token.strip().lower() not in ("identity", "") for token in content.split(",")):
        message = f"Content-Encoding: {content} is not accepted: send the body uncompressed"
        return error_response(
            415, "unsupported_encoding", message, {"Accept-Encoding": "identity", "Connection": "close"}
        )
    transfer = fields.get(b"transfer-encoding", b"chunked").decode("latin-1")
    if any(token.strip().lower() != "chunked" for token in transfer.split(",")):
        message = f"Transfer-Encoding: {transfer} is not implemented: send the body as it is, or chunked"
        return error_response(501, "not_implemented", message, {"Connection": "close"})
    return None


def _unread(scope: dict, response: Response) -> Response:
    """``response``, sent before the request's body was read: where the body has not all arrived, the server
    closes the connection after it (``server.py``), and the response says so (``Connection: close``)."""
    if scope.get(BODY_PENDING):
        response.headers["Connection"] = "close"
    return response


def _refuse_key(headers: list[tuple[bytes, bytes]], endpoint: str) -> Response:
    """401: no key where one is needed, or a wrong one (RFC 6750 §3: with ``WWW-Authenticate: Bearer``)."""
    where = "Authorization: Bearer KEY" + (" or the api_key field" if endpoint == "/translate" else "")
    sent = any(name == b"authorization" for name, _ in headers) or endpoint == "/translate"
    message = "missing or wrong API key" if sent else "this server needs an API key"
    return error_response(401, "unauthorized", f"{message}: send {where}", {"WWW-Authenticate": "Bearer"})


def _media_type(headers: list[tuple[bytes, bytes]]) -> str:
    """The Content-Type without its parameters, lower case ("" when none was sent)."""
    for name, value in headers:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower().decode("latin-1")
    return ""


async def _answer_directly(route: Route, form: bool, json: bool, query: bytes, body: bytes) -> Response | None:
    """The handler's response to the request, or None when the schema refuses a JSON body (FastAPI then answers
    the 422) or the body is of another type (FastAPI says which it needs). A form is answered here whatever it
    holds: FastAPI's routes read JSON only."""
    reader = route.form if form else None
    try:
        if reader is not None:
            request = reader(query, body)
        elif json:
            request = route.schema.model_validate_json(body)
        else:
            return None
    except ValidationError as err:
        if reader is None:
            return None
        return error_response(422, "invalid_request", validation_message(err))
    except ValueError as err:  # the form's own checks: not UTF-8, a field given twice
        return error_response(422, "invalid_request", str(err))
    try:
        return await route.handler(request)
    except ApiError as err:
        return error_response(err.status, err.error_type, err.message, err.headers)
    except Exception:
        return internal_error()
