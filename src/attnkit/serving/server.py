"""The HTTP server of ``attnkit serve``: uvicorn, with the defences against slow and idle clients that it lacks.

uvicorn (checked on 0.29 to 0.54) times a connection out only while it is idle between requests
(``timeout_keep_alive``), and any byte received cancels that timer. A client that connects and then sends its
request's head a byte at a time, or nothing at all, holds a connection and a file descriptor for as long as it
likes: 236 of them exhausted a 256-descriptor limit and the server refused everyone else (issue 27). uvicorn's
``limit_concurrency`` does not help: it counts such connections, then answers every other request with a
text/plain 503 and closes none of them. So this module adds, in a subclass of uvicorn's own HTTP/1.1 protocol:

- a deadline for each request's head (``Limits.header_timeout_s``), from the connection's start or the previous
  answer to the end of the headers, however slowly the bytes come: then 408 (or, when not one byte came, the
  connection just closes, as an idle keep-alive connection does);
- a deadline for its body (``Limits.body_timeout_s``), from the end of the headers: then 408;
- a cap on open connections (``Limits.max_connections``): past it the connection that has waited longest for a
  head is closed (as nginx reuses idle connections when it runs out), and only when every connection has a
  request in hand does the new one get 503;
- a request whose client closes the connection before its answer begins is cancelled (uvicorn lets it run to the
  end, answering nobody): a queued inference request leaves the queue at once (``batcher.py``), and ``Gate``
  counts it 499;
- a head still incomplete after ``MAX_HEAD_BYTES`` (h11 refuses any head over it; httptools has no limit, and
  parses a longer head that arrives whole, in one read of at most 256 KiB) and malformed requests get the API's
  JSON error, not uvicorn's text/plain 400.

The deadlines are checked on the server's tick (``Server.on_tick``, every 0.1 s), not with a timer per request.
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import re
import socket
from http import HTTPStatus
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from attnkit.errors import InputError
from attnkit.serving.batcher import Batcher
from attnkit.serving.gate import BODY_PENDING, CLIENT_GONE, REQUEST_TASK
from attnkit.serving.limits import Limits

# The most bytes of a request head (request line and headers) held while it is incomplete: h11's default, given to
# h11 and checked here for httptools, which has no limit of its own.
MAX_HEAD_BYTES = 16 * 1024
# File descriptors the server needs besides its connections (the listening socket, the inference process's pipes,
# the event loop's, the logs): 13 on a running `attnkit serve` on Linux (9 with --worker thread); a CUDA runtime in
# the process (--worker thread on a GPU) opens a few more.
RESERVED_DESCRIPTORS = 64


def descriptors_needed(limits: Limits) -> int:
    """File descriptors the server may hold at once: its connections, and as many again twice over for
    connections accepted and not yet shed (asyncio accepts up to the listen backlog, here ``max_connections``, in
    one go, before the first of them is shed; a flood of 700 stalled clients against 512 connections and a limit
    of 576 files made accept() fail, and asyncio then stops accepting for a second at a time)."""
    return 3 * limits.max_connections + RESERVED_DESCRIPTORS


class _Guarded:
    """The deadlines and the cap, mixed in before uvicorn's h11 or httptools protocol class (whose connection
    callbacks it extends, each calling uvicorn's own first). ``config`` is a ``GuardedConfig``.

    A connection is waiting for a request's head (``phase`` "head": from its start, or from the previous answer
    once that request's body is in), for its body ("body": from its head), or for neither (the app has the
    request). A head has come when uvicorn has made a new request cycle (``self.cycle``), and a body when the cycle
    has no ``more_body``: both implementations keep those. Nothing is timed per request: ``Server.on_tick`` looks
    at every connection ten times a second (``check_deadline``), so a deadline holds to within 0.1 s."""

    config: Any
    connections: set[Any]
    cycle: Any
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    phase: str | None = None
    since = 0.0  # when the phase began (the event loop's clock)
    _head_bytes = 0
    _last_cycle: Any = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._expect_head()
        if len(self.connections) > self.config.limits.max_connections:
            self._shed()

    def data_received(self, data: bytes) -> None:
        in_head = self.phase == "head"
        if in_head:
            self._head_bytes += len(data)
        super().data_received(data)  # type: ignore[misc]
        self._follow_cycle()
        if in_head and self.phase == "head" and self._head_bytes > MAX_HEAD_BYTES:
            self._answer_and_close(400, "invalid_http", f"the request's head is over {MAX_HEAD_BYTES} bytes")

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        super().connection_lost(exc)  # type: ignore[misc]
        # A request in hand whose answer has not begun: nobody will read it. Gate has put its task in the scope.
        task = cycle.scope.get(REQUEST_TASK) if cycle is not None and not cycle.response_started else None
        if task is not None:
            cycle.scope[CLIENT_GONE] = True  # how Gate tells this cancellation from any other
            task.cancel()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._follow_cycle()  # a pipelined request may have started
        if self.phase == "body":  # answered before its body came (a 413 on Content-Length): nothing more to say
            self.phase = None
            self.transport.close()
        elif self.phase is None and self.cycle.response_complete:
            self._expect_head()

    def _unsupported_upgrade_warning(self) -> None:
        """uvicorn logs two warnings for each request with an Upgrade header it does not take (any client could
        fill the log): the header is ignored instead (RFC 9110 §7.8), and the request answered."""

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request its parser refuses (malformed, or a head over ``MAX_HEAD_BYTES``)."""
        self._answer_and_close(
            400, "invalid_http", f"not a valid HTTP request (or its head is over {MAX_HEAD_BYTES} bytes)"
        )

    def check_deadline(self, now: float) -> None:
        limits = self.config.limits
        if self.phase == "head" and now - self.since > limits.header_timeout_s:
            self._give_up_on_head()
        elif self.phase == "body" and now - self.since > limits.body_timeout_s:
            message = f"the request body did not arrive within {limits.body_timeout_s:g} s"
            self._answer_and_close(408, "request_timeout", message)

    def _expect_head(self) -> None:
        if not self.transport.is_closing():
            self.phase, self.since, self._head_bytes = "head", self.loop.time(), 0

    def _follow_cycle(self) -> None:
        """The phase after uvicorn has read what came: a new cycle is a new request, whose body may follow."""
        if self.cycle is not self._last_cycle:
            self._last_cycle = self.cycle
            self.phase, self.since = ("body" if self.cycle.more_body else None), self.loop.time()
            if self.phase == "body":  # an answer now closes the connection: Gate says so
                self.cycle.scope[BODY_PENDING] = True
        elif self.phase == "body" and not self.cycle.more_body:
            self.phase = None
            self.cycle.scope[BODY_PENDING] = False

    def _give_up_on_head(self, why: str = "") -> None:
        """408 (or, when not one byte of a head came, just the end of the connection), and close."""
        if not self._head_bytes:
            self.phase = None
            self.transport.close()
            return
        why = why or f"did not arrive within {self.config.limits.header_timeout_s:g} s"
        self._answer_and_close(408, "request_timeout", f"the request's headers {why}")

    def _shed(self) -> None:
        """One connection too many: close the one that has waited longest for a head, else refuse this one."""
        waiting = [c for c in self.connections if c is not self and getattr(c, "phase", None) == "head"]
        limit = self.config.limits.max_connections
        if waiting:
            why = f"had not arrived when the server, at its limit of {limit} connections, needed room"
            min(waiting, key=lambda c: c.since)._give_up_on_head(why)
        else:
            message = f"the server has {limit} connections with requests in hand; retry shortly"
            self._answer_and_close(503, "too_many_connections", message, b"retry-after: 1\r\n")

    def _answer_and_close(self, status: int, error_type: str, message: str, extra: bytes = b"") -> None:
        """Write a whole JSON error response and close: the connection is in no state to carry another request (an
        app reading the body sees the client disconnect)."""
        self.phase = None
        if self.transport.is_closing():
            return
        body = json.dumps({"error": message, "error_type": error_type}).encode()
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nx-content-type-options: nosniff\r\nconnection: close\r\n"
        ).encode()
        self.transport.write(head + extra + b"\r\n" + body)
        self.transport.close()


class GuardedH11Protocol(_Guarded, H11Protocol):
    pass


def protocol_class() -> type:
    """What uvicorn's ``http="auto"`` would pick (httptools where it is installed, as ``uvicorn[standard]`` does,
    else h11), with ``_Guarded`` mixed in."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return GuardedH11Protocol

    class GuardedHttpToolsProtocol(_Guarded, HttpToolsProtocol):
        def data_received(self, data: bytes) -> None:
            super().data_received(without_upgrade(data) if self.phase == "head" else data)

    return GuardedHttpToolsProtocol


# An Upgrade header's name at the start of a header line.
_UPGRADE = re.compile(rb"\r\nupgrade:", re.IGNORECASE)


def without_upgrade(data: bytes) -> bytes:
    """``data`` (the start of a request, or more of its head) with its Upgrade header renamed ``X-Ignored-Upgrade``,
    so that httptools reads the request as any other. Its parser (llhttp) takes a request with ``Connection:
    Upgrade`` and an Upgrade header as the last of HTTP/1.1 on the connection and skips its body: ``curl --http2``
    on plain http (``Upgrade: h2c``) got a 422 without a body, and uvicorn logged two warnings a request. The server
    has no other protocol (no WebSocket route), and RFC 9110 §7.8 lets it ignore Upgrade. Only the head is looked
    at, and only a header line whole within ``data``: one split across two reads still loses its body."""
    end = data.find(b"\r\n\r\n")
    end = len(data) if end < 0 else end + 2
    if _UPGRADE.search(data, 0, end) is None:  # the common case: one scan of the head
        return data
    return _UPGRADE.sub(b"\r\nx-ignored-upgrade:", data[:end]) + data[end:]


class GuardedConfig(uvicorn.Config):
    """uvicorn's configuration with ``limits`` for the protocol to read, an HTTP/1.1 protocol class of
    ``protocol_class()`` (or the one given), no WebSocket protocol (the API has no WebSocket route), and a listen
    backlog of ``max_connections``."""

    def __init__(self, app, *, limits: Limits, http: type | None = None, **options: Any):
        super().__init__(
            app,
            http=http or protocol_class(),
            ws="none",
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            backlog=limits.max_connections,  # see descriptors_needed
            **options,
        )
        self.limits = limits


class Server(uvicorn.Server):
    """uvicorn's server, which checks its connections' deadlines on each of its ticks (every 0.1 s), and on SIGTERM
    or SIGINT first has the batcher refuse new work (503) at once; the work in flight finishes within uvicorn's
    graceful shutdown."""

    def __init__(self, config: GuardedConfig, batcher: Batcher):
        super().__init__(config)
        self.batcher = batcher

    async def on_tick(self, counter: int) -> bool:
        now = asyncio.get_running_loop().time()
        for connection in list(self.server_state.connections):
            if isinstance(connection, _Guarded):
                connection.check_deadline(now)
        return await super().on_tick(counter)

    def handle_exit(self, sig, frame):
        self.batcher.drain()
        super().handle_exit(sig, frame)


def make_server(
    app: FastAPI, limits: Limits, *, host: str, port: int, quiet: bool = False, http: type | None = None
) -> Server:
    """The server for ``app`` (a ``create_app`` app) on ``host``:``port`` (start it with ``.run()``)."""
    config = GuardedConfig(
        app,
        limits=limits,
        http=http,
        host=host,
        port=port,
        log_level="warning" if quiet else "info",
        timeout_graceful_shutdown=math.ceil(limits.timeout_s) + 5,  # what a request may take, and a margin
    )
    return Server(config, app.state.batcher)


def listen_sockets(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to ``port`` (0: a free one) on every address ``host`` names, as asyncio's ``create_server``
    binds them when uvicorn is given a host (``Server.run(sockets=...)`` listens on them). Bound before the model
    loads, so that a port another server holds, or an address that is not this machine's, is an ``InputError``
    naming it, where uvicorn logs it only after loading the model, and exits 3. Bound, not yet listening (until the
    model is loaded a client is refused, not kept waiting): two servers started in the same second can both bind
    (SO_REUSEADDR allows it until one listens), and the later one still meets uvicorn's error."""
    infos = dict.fromkeys(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE))
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # asyncio's and uvicorn's choice on POSIX
            if family == socket.AF_INET6:  # as asyncio: an IPv6 socket takes IPv6 only, beside an IPv4 one
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((address[0], port, *address[2:]))
            port = port or sock.getsockname()[1]  # port 0: every address on the one the system chose for the first
    except OSError as err:
        for sock in sockets:
            sock.close()
        why = {
            errno.EADDRINUSE: "the port is in use (another server, or another attnkit serve, listens there): "
            "stop it or choose another --port",
            errno.EADDRNOTAVAIL: "the address is not one of this machine's",
            errno.EACCES: "no permission (ports below 1024 need privileges)",
        }.get(err.errno or 0, err.strerror or str(err))
        raise InputError(f"--host {host} --port {port}: cannot listen there: {why}") from None
    return sockets


def open_file_limit(wanted: int) -> int | None:
    """Raise this process's soft limit on open files towards ``wanted`` (as far as the hard limit allows; Go's
    runtime raises it to the hard limit at start) and return the limit now in force; None where there is no such
    limit (Windows) or no bound."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    if soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):  # macOS caps it below RLIM_INFINITY (kern.maxfilesperproc)
            pass
    return soft
