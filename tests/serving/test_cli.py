"""``attnkit serve``'s options for hostile networks, in-process with the server's run replaced (nothing binds): the
API key from --api-key or ATTNKIT_API_KEY, the warning when binding beyond loopback without one, and the refusals
(exit 2, one ``error:`` line) of impossible values."""

from __future__ import annotations

import io
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

from attnkit.cli import main
from attnkit.cli.serve import loopback_only


@pytest.fixture
def serve(monkeypatch, classifier_dir):
    """Run ``attnkit serve CLASSIFIER ARGS``, up to the point where the server would start: (exit code, stderr,
    the server it would have run)."""
    import attnkit.serving.server
    from attnkit.serving.server import Server

    started: list[Server] = []
    monkeypatch.setattr(Server, "run", lambda self, sockets=None: started.append(self))
    monkeypatch.setattr(sys, "setswitchinterval", lambda interval: None)  # the test process keeps its own
    monkeypatch.delenv("ATTNKIT_API_KEY", raising=False)
    listen, opened = attnkit.serving.server.listen_sockets, []

    def listen_on_a_free_port(host: str, port: int):  # the port a test names (8000 by default) may be in use here
        opened.extend(sockets := listen(host, 0))
        return sockets

    monkeypatch.setattr(attnkit.serving.server, "listen_sockets", listen_on_a_free_port)

    def run(*args: str) -> tuple[int, str, Server | None]:
        started.clear()
        err = io.StringIO()
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            code = main(["serve", str(classifier_dir), "--worker", "thread", *args])
        return code, err.getvalue(), started[-1] if started else None

    yield run
    for sock in opened:
        sock.close()


def gate_key(server):
    """The API key the app's Gate checks (None: no key)."""
    from attnkit.serving.gate import Gate

    (middleware,) = [m for m in server.config.app.user_middleware if m.cls is Gate]
    return middleware.kwargs["api_key"]


def test_binding_beyond_loopback_without_a_key_warns(serve):
    code, err, _ = serve("--host", "0.0.0.0", "--port", "8123")
    assert code == 0
    (warning,) = [line for line in err.splitlines() if line.startswith("warning:")]
    assert "--host 0.0.0.0" in warning and "port 8123" in warning and "ATTNKIT_API_KEY" in warning


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_needs_no_key_and_no_warning(serve, host):
    code, err, server = serve("--host", host)
    assert code == 0 and "warning" not in err and gate_key(server) is None


def test_the_key_from_the_option_or_the_environment(serve, monkeypatch):
    code, err, server = serve("--host", "0.0.0.0", "--api-key", "k1")
    assert code == 0 and "warning" not in err and gate_key(server).matches(b"k1")
    monkeypatch.setenv("ATTNKIT_API_KEY", "k2")
    code, err, server = serve("--host", "0.0.0.0")
    assert code == 0 and "warning" not in err and gate_key(server).matches(b"k2")
    code, _, server = serve("--api-key", "k3")  # the option wins
    assert gate_key(server).matches(b"k3") and not gate_key(server).matches(b"k2")
    monkeypatch.setenv("ATTNKIT_API_KEY", "")  # set but empty: no key
    assert gate_key(serve()[2]) is None


@pytest.mark.parametrize("key", ["ab\n", "ab ", "\tab"])
def test_a_key_no_client_could_send_is_one_error_line(serve, monkeypatch, key):
    """Before, the server started and answered every request 401. The error names where the key came from."""
    monkeypatch.setenv("ATTNKIT_API_KEY", key)
    code, err, server = serve()
    assert code == 2 and server is None
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ATTNKIT_API_KEY: "), line
    code, err, server = serve("--api-key", key)
    assert code == 2 and server is None
    assert err.strip().splitlines() == [line.replace("ATTNKIT_API_KEY", "--api-key")]


def test_the_server_gets_the_deadlines_and_the_connection_limit(serve):
    code, _, server = serve("--header-timeout", "2.5", "--body-timeout", "7", "--max-connections", "100")
    limits = server.config.limits
    assert code == 0 and (limits.header_timeout_s, limits.body_timeout_s, limits.max_connections) == (2.5, 7, 100)
    assert server.config.ws == "none" and server.config.h11_max_incomplete_event_size == 16 * 1024
    assert server.config.backlog == 100


@pytest.mark.parametrize(
    "args, message",
    [
        (["--api-key", ""], "error: --api-key: must not be empty or blank"),
        (["--api-key", "  "], "error: --api-key: must not be empty or blank"),
        (["--header-timeout", "0"], "error: --header-timeout 0.0: must be > 0"),
        (["--body-timeout", "nan"], "error: --body-timeout nan: must be > 0"),
        (["--body-timeout", "-1"], "error: --body-timeout -1.0: must be > 0"),
        (["--max-connections", "0"], "error: --max-connections 0: must be > 0"),
        (["--timeout", "0"], "error: --timeout 0.0: must be > 0"),
    ],
)
def test_impossible_values_are_refused(serve, args, message):
    code, err, server = serve(*args)
    assert (code, err.strip().splitlines()[-1], server) == (2, message, None)


def test_more_connections_than_the_process_may_open_files_is_refused(serve):
    resource = pytest.importorskip("resource", reason="no open-file limit on this system")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit on open files here")
    code, err, server = serve("--max-connections", str(hard))
    assert code == 2 and server is None
    assert err.strip().splitlines()[-1].startswith(f"error: --max-connections {hard}: needs about {3 * hard + 64} open")


def test_the_default_connection_limit_fits_the_open_file_limit(serve, monkeypatch):
    import attnkit.serving.server

    monkeypatch.setattr(attnkit.serving.server, "open_file_limit", lambda wanted: 400)
    code, err, server = serve()
    assert code == 0 and server.config.limits.max_connections == (400 - 64) // 3 == server.config.backlog
    assert "note: --max-connections 112: the most that 400 open files allow (ulimit -n)" in err
    code, err, server = serve("--max-connections", "512")  # asked for: not lowered behind the user's back
    assert (code, server) == (2, None) and "needs about 1600 open files, and this process may open 400" in err


def test_loopback_only():
    assert loopback_only("127.0.0.1") and loopback_only("::1") and loopback_only("localhost")
    assert not loopback_only("0.0.0.0") and not loopback_only("::") and not loopback_only("192.0.2.1")
    assert not loopback_only("no-such-host.invalid")


def test_a_port_in_use_is_one_error_line_before_the_model_loads(classifier_dir, monkeypatch):
    """A second server on a port another one holds says so (exit 2), without loading its model first: uvicorn
    logged the bind error only after the model had loaded and warmed up, and exited 3."""
    import socket

    import attnkit.serving.models
    from attnkit.serving.server import Server

    loaded: list[str] = []
    load = attnkit.serving.models.load_model
    monkeypatch.setattr(attnkit.serving.models, "load_model", lambda *a, **k: loaded.append("model") or load(*a, **k))
    monkeypatch.setattr(Server, "run", lambda self, sockets=None: pytest.fail("the second server started"))
    monkeypatch.setattr(sys, "setswitchinterval", lambda interval: None)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        err = io.StringIO()
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            code = main(["serve", str(classifier_dir), "--worker", "thread", "--port", str(port)])
    assert (code, loaded) == (2, [])
    assert err.getvalue().splitlines() == [
        f"error: --host 127.0.0.1 --port {port}: cannot listen there: the port is in use (another server, or "
        "another attnkit serve, listens there): stop it or choose another --port"
    ]


@pytest.mark.parametrize("host, url", [("127.0.0.1", "http://127.0.0.1:{}/"), ("::1", "http://[::1]:{}/")])
def test_the_address_printed_is_the_one_to_connect_to(serve, host, url):
    """With --port 0 the port the system chose (not 0), and an IPv6 address in brackets, as a URL writes it."""
    code, err, server = serve("--host", host, "--port", "0")
    (line,) = [line for line in err.splitlines() if line.startswith("attnkit serve:")]
    port = int(line.split("]:" if ":" in host else f"{host}:")[1].split("/")[0])
    assert code == 0 and port > 0 and url.format(port) in line
