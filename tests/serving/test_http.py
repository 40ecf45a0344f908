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


def exchange(sock: socket.socket, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` and read one answer: status, headers (lower-case names) and body (bounded: 10 s a read)."""
    sock.sendall(request)
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    length = 0 if request.startswith(b"HEAD ") else int(headers.get("content-length", 0))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed in the body"
        body += chunk
    return int(lines[0].split(" ")[1]), headers, body


# What `curl --http2 http://...` sends: a request to switch to HTTP/2 on the same connection.
H2C = "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"


def test_an_upgrade_header_is_ignored(port, uvicorn_log):
    """Before, httptools skipped the body (422 "body: Field required") and uvicorn logged two warnings a request."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for _ in range(2):  # and the connection carries the next request
            status, _, body = exchange(sock, post("/v1/classify", H2C))
            assert status == 200, body
            assert json.loads(body)["results"][0]["text"] == "a fine film"
        status, _, body = exchange(sock, post("/v1/classify", "Connection: Upgrade\r\nupgrade: websocket\r\n"))
        assert status == 200, body
    assert [r.getMessage() for r in uvicorn_log if r.levelno >= logging.WARNING] == []
