"""Clients that never finish a request, against the real server (uvicorn with serving/server.py's guards, in a
thread, on 127.0.0.1) with short deadlines: each is answered with its 4xx JSON error and closed, and the server
keeps answering everyone else while many of them hold connections. Run under both of uvicorn's HTTP/1.1
protocols: h11, and httptools where it is installed (``uvicorn[standard]``, what ``attnkit[serve]`` installs)."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
import urllib.request

import pytest

from attnkit.serving.server import MAX_HEAD_BYTES, GuardedH11Protocol, protocol_class

PROTOCOLS = [
    pytest.param(GuardedH11Protocol, id="h11"),
    pytest.param(
        protocol_class(),
        id="httptools",
        marks=pytest.mark.skipif(
            protocol_class() is GuardedH11Protocol, reason="httptools is not installed (uvicorn[standard] has it)"
        ),
    ),
]
DEADLINE = 0.5  # seconds, for the head and for the body
HEAD = b"POST /v1/classify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


def read_answer(sock: socket.socket, within: float = 10.0) -> tuple[int | None, dict | None]:
    """Everything the server sends until it closes the connection (bounded: ``within`` seconds): the status and the
    JSON body, or (None, None) when it closed without a word (a reset included: a server that closes a connection
    with bytes of it still unread resets it)."""
    data = read_all(sock, within)
    if not data:
        return None, None
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def read_all(sock: socket.socket, within: float = 10.0) -> bytes:
    """What the server sends until it closes the connection (or resets it); ``within`` s at most for each read."""
    sock.settimeout(within)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def trickle(sock: socket.socket, data: bytes, every: float = 0.05) -> None:
    """Send ``data`` a byte at a time until the server answers (or all of it is sent)."""
    for byte in data:
        if select.select([sock], [], [], every)[0]:
            return
        sock.sendall(bytes([byte]))


def after_one_answer(sock: socket.socket, data: bytes) -> None:
    """A whole request first (a kept-alive connection's previous request), then ``data`` and silence."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    sock.settimeout(10)
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    sock.sendall(data)


# (what the client does, how it sends, what it sends) -> (status, error_type, words in the message); None: the
# connection closes without an answer (nothing of a request came, as when an idle keep-alive connection expires).
SLOW_CASES = [
    ("a head that stops halfway", "sendall", HEAD[:30], 408, "request_timeout", "headers did not arrive within 0.5 s"),
    ("a head a byte at a time", "trickle", HEAD + b"X-Pad: " + b"a" * 200, 408, "request_timeout", "within 0.5 s"),
    ("a head after an answer", "after_one_answer", b"GET /he", 408, "request_timeout", "headers did not arrive"),
    ("nothing at all", "sendall", b"", None, None, None),
    (
        "a body that stops halfway",
        "sendall",
        HEAD + b'Content-Length: 100\r\n\r\n{"inputs": ',
        408,
        "request_timeout",
        "the request body did not arrive within 0.5 s",
    ),
    (
        "a chunked body without its last chunk",
        "sendall",
        HEAD + b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"inp\r\n',
        408,
        "request_timeout",
        "the request body did not arrive within 0.5 s",
    ),
    (
        "16 KiB of a head, not its end",
        "sendall",
        b"GET /health HTTP/1.1\r\nX-Pad: " + b"a" * MAX_HEAD_BYTES,
        400,
        "invalid_http",
        "over 16384 bytes",
    ),
    ("not HTTP (TLS)", "sendall", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "invalid_http", "not a valid"),
]


SENDERS = {"sendall": lambda sock, data: sock.sendall(data), "trickle": trickle, "after_one_answer": after_one_answer}


@pytest.fixture(scope="module", params=PROTOCOLS)
def guarded_port(request, classifier_dir, live_server):
    """The port of a classifier's server with 0.5 s deadlines (one per protocol)."""
    with live_server(classifier_dir, http=request.param, header_timeout_s=DEADLINE, body_timeout_s=DEADLINE) as port:
        yield port


@pytest.mark.parametrize("case", SLOW_CASES, ids=lambda c: c[0])
def test_a_request_that_never_finishes_is_answered_and_closed(guarded_port, case):
    _, how, data, status, error_type, words = case
    with socket.create_connection(("127.0.0.1", guarded_port)) as sock:
        SENDERS[how](sock, data)
        got_status, body = read_answer(sock)
    assert got_status == status, body
    if status is not None:
        assert body is not None and set(body) == {"error", "error_type"}
        assert body["error_type"] == error_type and words in body["error"], body


@pytest.mark.parametrize(
    "head",
    [
        HEAD + b"Content-Length: 99999999999\r\n\r\n{}",
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % 1_100_000 + b"x" * 1_100_000 + b"\r\n",
    ],
    ids=["declared", "chunked"],
)
def test_a_body_over_the_limit_gets_one_413_and_the_connection_closes(guarded_port, head):
    """The 413 came before the body (not read), and the body's deadline then sent a second, unasked-for answer on
    the same connection (a 408), which a client reusing it would have read as its next request's."""
    with socket.create_connection(("127.0.0.1", guarded_port)) as sock:
        try:
            sock.sendall(head)
        except (BrokenPipeError, ConnectionResetError):  # closed while the chunk was still being sent
            pass
        data = read_all(sock)
    assert data.startswith(b"HTTP/1.1 413") and data.count(b"HTTP/1.1") == 1, data[:300]
    assert b"connection: close" in data.lower()


def test_a_body_cut_off_by_its_deadline_is_counted_as_the_client_closing(guarded_port):
    """The app saw its client go away: /metrics counts it as 499 (nginx's "client closed request"), not as a 500."""
    with socket.create_connection(("127.0.0.1", guarded_port)) as sock:
        sock.sendall(HEAD + b"Content-Length: 100\r\n\r\n{")
        assert read_answer(sock)[0] == 408
    with urllib.request.urlopen(f"http://127.0.0.1:{guarded_port}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert 'attnkit_requests_total{endpoint="/v1/classify",status="499"}' in metrics
    assert 'status="500"' not in metrics


def get(port: int, path: str = "/ready") -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return response.status


def classify(port: int) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/classify", b'{"inputs": "a fine film"}', {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_server_answers_while_more_slow_clients_than_its_connection_limit_hold_sockets(
    classifier_dir, live_server, protocol
):
    """80 stalled clients against a limit of 32 connections: 20 in their bodies, 11 in their heads, then a burst of
    49 more in their heads. Each connection past the limit closes the one that has waited longest for its head, and
    real requests are answered at once, not after the deadlines; then every stalled client still open has its 408."""
    limits = {"header_timeout_s": 5.0, "body_timeout_s": 5.0, "max_connections": 32}
    with live_server(classifier_dir, http=protocol, **limits) as port:

        def stall(n: int, data: bytes) -> list[socket.socket]:
            socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
            for sock in socks:
                sock.sendall(data)
            return socks

        # A request answered after a stall is a barrier: by then the server has read what the stalled clients sent
        # (of connections accepted in one burst, it may close some before reading them).
        in_body = stall(20, HEAD + b"Content-Length: 100\r\n\r\n{")
        assert get(port) == 200
        held = stall(11, HEAD[:20])
        assert get(port) == 200
        burst = stall(49, HEAD[:20])
        start = time.monotonic()
        assert get(port) == 200
        assert classify(port)["results"][0]["label"] in ("negative", "positive")
        answered_in = time.monotonic() - start
        closed_by_then = sum(bool(select.select([sock], [], [], 0)[0]) for sock in held + burst)
        answers = {
            name: [(status, body and body["error"]) for status, body in map(read_answer, socks)]
            for name, socks in (("in_body", in_body), ("held", held), ("burst", burst))
        }
        for sock in in_body + held + burst:
            sock.close()
    assert answered_in < limits["header_timeout_s"]  # not after the stalled clients were timed out
    assert closed_by_then >= 60 - (32 - 20) - 2  # at most 32 connections were open at once (2: the requests' own)
    assert answers["in_body"] == [(408, "the request body did not arrive within 5 s")] * 20
    shed = "the request's headers had not arrived when the server, at its limit of 32 connections, needed room"
    timed_out = "the request's headers did not arrive within 5 s"
    assert answers["held"] == [(408, shed)] * 11  # the longest waiting, shed first
    assert all(answer in ((None, None), (408, shed), (408, timed_out)) for answer in answers["burst"])
    assert answers["burst"].count((408, timed_out)) >= 32 - 20 - 2  # the last ones, held to their deadline


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_when_every_connection_has_a_request_in_hand_a_new_one_gets_503(classifier_dir, live_server, protocol):
    limits = {"header_timeout_s": 1.0, "body_timeout_s": 1.0, "max_connections": 8}
    with live_server(classifier_dir, http=protocol, **limits) as port:
        sending = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
        for sock in sending:
            sock.sendall(HEAD + b"Content-Length: 100\r\n\r\n{")
        time.sleep(0.2)  # their heads are in: they are reading bodies, not waiting for heads
        with socket.create_connection(("127.0.0.1", port)) as refused:
            status, body = read_answer(refused)
        assert [read_answer(sock)[0] for sock in sending] == [408] * 8
        assert get(port) == 200  # the limit frees as connections close
    assert status == 503 and body == {
        "error": "the server has 8 connections with requests in hand; retry shortly",
        "error_type": "too_many_connections",
    }


def test_uvicorn_alone_never_times_out_a_slow_head():
    """Why serving/server.py exists: uvicorn's own options (here a 1 s keep-alive timeout) leave a connection that
    is sending its head open indefinitely. Should a uvicorn release add a head deadline, this fails, and the guard
    can give way to the option."""
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol

    async def app(scope, receive, send):  # pragma: no cover (never reached: no head completes)
        raise AssertionError

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, http=H11Protocol, timeout_keep_alive=1, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        for _ in range(100):  # bounded: 10 s
            if server.started:
                break
            time.sleep(0.1)
        with socket.create_connection(listener.getsockname()) as sock:
            sock.sendall(HEAD[:20])
            sock.settimeout(3.0)  # three keep-alive timeouts
            with pytest.raises(TimeoutError):
                sock.recv(1)  # neither an answer nor the end of the connection
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()
