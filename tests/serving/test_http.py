"""HTTP/1.1 as clients really send it, against the real server (uvicorn with serving/server.py's protocol, in a
thread, on 127.0.0.1), under both of uvicorn's HTTP/1.1 protocols: headers the API does not take (Upgrade),
methods (HEAD) and paths (a trailing slash) are answered as RFC 9110 says, in the API's JSON errors."""

from __future__ import annotations

import json
import logging
import socket

import pytest

BODY = b'{"inputs": "a fine film"}'


@pytest.fixture(scope="module")
def port(http_protocol, classifier_dir, live_server):
    with live_server(classifier_dir, http=http_protocol) as port:
        yield port


@pytest.fixture
def uvicorn_log():
    """What uvicorn logs meanwhile (its loggers do not propagate to pytest's)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[assignment, method-assign]
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def post(path: str, headers: str = "", body: bytes = BODY) -> bytes:
    """A request as curl sends it: head and body in one write."""
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{headers}"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


# What `curl --http2 http://...` sends: a request to switch to HTTP/2 on the same connection.
H2C = "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"


def test_an_upgrade_header_is_ignored(port, uvicorn_log, exchange):
    """Before, httptools skipped the body (422 "body: Field required") and uvicorn logged two warnings a request."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for _ in range(2):  # and the connection carries the next request
            status, _, body = exchange(sock, post("/v1/classify", H2C))
            assert status == 200, body
            assert json.loads(body)["results"][0]["text"] == "a fine film"
        status, _, body = exchange(sock, post("/v1/classify", "Connection: Upgrade\r\nupgrade: websocket\r\n"))
        assert status == 200, body
    assert [r.getMessage() for r in uvicorn_log if r.levelno >= logging.WARNING] == []


def get(path: str, method: str = "GET", host: str = "127.0.0.1") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


GET_ROUTES = ["/", "/info", "/metrics", "/health", "/ready", "/openapi.json", "/docs", "/static/app.js"]


def test_head_is_answered_wherever_get_is_without_a_body(port, exchange):
    """RFC 9110 §9.3.2 (before, every GET route but the probes answered HEAD with 405)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for path in GET_ROUTES:
            status, headers, body = exchange(sock, get(path))
            head_status, head_headers, head_body = exchange(sock, get(path, "HEAD"))
            assert (head_status, head_body) == (status, b"") == (200, b""), path
            assert head_headers["content-type"] == headers["content-type"], path
        # Nothing of a body came after any HEAD answer: the connection reads the next answer whole.
        assert exchange(sock, get("/health"))[2] == b'{"status":"ok"}'
        status, headers, _ = exchange(sock, get("/v1/classify", "HEAD"))  # a POST route: no GET, no HEAD
        assert status == 405 and headers["content-type"] == "application/json"


@pytest.mark.parametrize("request_bytes", [post("/v1/classify/"), get("/info/"), get("/static")])
def test_a_trailing_slash_is_an_unknown_path_not_a_redirect(port, request_bytes, exchange):
    """Before, a 307 with an empty body whose Location came from the client's Host header."""
    request_bytes = request_bytes.replace(b"Host: 127.0.0.1", b"Host: evil.example")
    with socket.create_connection(("127.0.0.1", port)) as sock:
        status, headers, body = exchange(sock, request_bytes)
    assert status == 404 and "location" not in headers
    assert json.loads(body)["error_type"] == "not_found"


def test_a_transfer_coding_other_than_chunked_is_refused(port, http_protocol, exchange):
    """RFC 9112 §6.1: 501 (httptools reads such a body as chunked and hands on what it decodes, here gzip bytes; h11
    refuses the request itself, 400)."""
    chunked = b"5\r\nhello\r\n0\r\n\r\n"
    head = post("/v1/classify", body=b"").replace(b"Content-Length: 0\r\n", b"Transfer-Encoding: gzip, chunked\r\n")
    with socket.create_connection(("127.0.0.1", port)) as sock:
        status, headers, body = exchange(sock, head + chunked)
        assert sock.recv(65536) == b""  # and the connection closes
    want = (400, "invalid_http") if http_protocol.__name__ == "GuardedH11Protocol" else (501, "not_implemented")
    assert (status, json.loads(body)["error_type"]) == want
    assert headers["connection"] == "close"


def test_an_answer_before_the_body_arrived_says_that_the_connection_closes(
    classifier_dir, live_server, http_protocol, exchange
):
    """A 401 sent before the body came closes the connection (its body is not read), and says so (before, it did not
    say); one sent when the body had come keeps the connection."""
    from attnkit.serving.app import create_app
    from attnkit.serving.limits import Limits
    from attnkit.serving.models import load_model

    app = create_app(load_model(classifier_dir), Limits(), api_key="sekrit")
    with live_server(classifier_dir, http=http_protocol, app=app) as port:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            status, headers, _ = exchange(sock, post("/v1/classify", body=BODY)[: -len(BODY)])  # the head alone
            assert (status, headers.get("connection")) == (401, "close")
            sock.settimeout(10)
            assert sock.recv(65536) == b""
        with socket.create_connection(("127.0.0.1", port)) as sock:
            for _ in range(2):
                status, headers, _ = exchange(sock, post("/v1/classify"))  # head and body in one write
                assert status == 401 and "connection" not in headers
