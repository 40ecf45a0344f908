"""Shared fixtures of the serving tests: a tiny classifier and a tiny translator, trained in-process once per
session (a few seconds each) and saved as run directories, and in-process clients of their apps."""

from __future__ import annotations

import io
import random
import socket
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

from attnkit.cli import main

try:  # without the serve extra these tests are not collected (the rest of the suite does not need it)
    import fastapi  # noqa: F401
    import prometheus_client  # noqa: F401
except ImportError:
    collect_ignore_glob = ["test_*.py"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = ["d_model=16", "n_heads=2", "d_ff=32", "n_layers=2", "min_freq=1", "max_len=32"]


def quiet_main(argv: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    assert code == 0, err.getvalue()


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serve-classifier") / "run"
    quiet_main(
        [
            "classify",
            "train",
            "--train",
            str(EXAMPLES / "seed000_train.tsv"),
            "--out",
            str(out),
            "--epochs",
            "3",
            "--seed",
            "0",
            "--quiet",
            "--set",
            *TINY,
            "patience=0",
        ]
    )
    return out


@pytest.fixture(scope="session")
def translator_dir(tmp_path_factory) -> Path:
    """A translator run directory with fixed random weights (N(0, 1), seed 0) in place of trained ones: a few
    training steps only teach a tiny model to stop at once, while these weights give outputs of every kind (empty,
    short, run to the length limit without EOS), deterministic, which is what the equality tests need."""
    from attnkit import runs
    from attnkit.model.build import build_translator
    from attnkit.tasks.translate import TranslatorRun

    tmp = tmp_path_factory.mktemp("serve-translator")
    rng = random.Random(0)
    words = "a b c d e f g h".split()
    with open(tmp / "train.tsv", "w", encoding="utf-8") as f:
        for _ in range(300):
            src = [rng.choice(words) for _ in range(rng.randint(2, 7))]
            f.write(f"{' '.join(src)}\t{' '.join(reversed(src))}\n")
    quiet_main(
        [
            "translate",
            "train",
            "--train",
            str(tmp / "train.tsv"),
            "--out",
            str(tmp / "run"),
            "--max-steps",
            "1",
            "--max-tokens",
            "512",
            "--seed",
            "0",
            "--quiet",
            "--set",
            "tokenizer=word",
            *TINY,
            "dropout=0.0",
            "valid_bleu=false",
        ]
    )
    trained = TranslatorRun(tmp / "run")
    model = build_translator(trained.model_cfg, pad_id=trained.tokenizer.pad_id)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator))
    runs.save_weights(tmp / "run", model)
    runs.write_manifest(tmp / "run")
    return tmp / "run"


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models spend more on intra-op threading than they gain, most of all on shared cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def client_for(model_dir: Path | str, worker: str = "thread", api_key: str | None = None, **limits):
    """An in-process client; ``worker="process"`` runs the model in a child process, as ``attnkit serve`` does."""
    from fastapi.testclient import TestClient

    from attnkit.serving.app import create_app
    from attnkit.serving.limits import Limits
    from attnkit.serving.models import load_model
    from attnkit.serving.worker import ProcessRunner

    runner = ProcessRunner(str(model_dir), threads=1) if worker == "process" else None
    return TestClient(create_app(load_model(model_dir), Limits(**limits), runner, api_key))


def wait_ready(client) -> None:
    for _ in range(600):  # bounded: 60 s
        if client.get("/ready").status_code == 200:
            return
        import time

        time.sleep(0.1)
    raise AssertionError(f"not ready: {client.get('/ready').json()}")


@pytest.fixture
def serve_client():
    """A factory: ``with serve_client(model_dir, **limits) as client:`` gives a started, ready client."""
    from contextlib import contextmanager

    @contextmanager
    def make(model_dir: Path, worker: str = "thread", api_key: str | None = None, **limits):
        with client_for(model_dir, worker, api_key, **limits) as client:
            wait_ready(client)
            yield client

    return make


@pytest.fixture(scope="session")
def live_server():
    """A factory: ``with live_server(model_dir, http=None, app=None, **limits) as port:`` runs ``attnkit serve``'s
    HTTP server (uvicorn with the guards of ``serving/server.py``; ``http``: its protocol class) in a thread, on a
    port of its own on 127.0.0.1, with the model in a thread of the same process (or ``app``, made with the same
    limits); stopped at the block's end."""
    import socket
    import threading
    import time
    import urllib.request
    from contextlib import contextmanager

    from attnkit.serving.app import create_app
    from attnkit.serving.limits import Limits
    from attnkit.serving.models import load_model
    from attnkit.serving.server import make_server

    @contextmanager
    def make(model_dir: Path, http: type | None = None, app=None, **limits):
        app = app or create_app(load_model(model_dir), Limits(**limits))
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        server = make_server(app, Limits(**limits), host="127.0.0.1", port=port, quiet=True, http=http)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
        thread.start()
        try:
            for _ in range(300):  # bounded: 30 s
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1) as response:
                        if response.status == 200:
                            break
                except OSError:
                    time.sleep(0.1)
            else:
                raise AssertionError("the server did not become ready in 30 s")
            yield port
        finally:
            server.should_exit = True
            thread.join(30)
            listener.close()

    return make


def _protocols() -> list:
    """uvicorn's two HTTP/1.1 protocols with ``server.py``'s guards: h11, and httptools where it is installed
    (``uvicorn[standard]``, what ``attnkit[serve]`` installs and ``attnkit serve`` picks)."""
    try:
        from attnkit.serving.server import GuardedH11Protocol, protocol_class
    except ImportError:  # no serve extra: nothing here is collected
        return []
    missing = protocol_class() is GuardedH11Protocol
    skip = pytest.mark.skipif(missing, reason="httptools is not installed (uvicorn[standard] has it)")
    return [pytest.param(GuardedH11Protocol, id="h11"), pytest.param(protocol_class(), id="httptools", marks=skip)]


@pytest.fixture(scope="module", params=_protocols())
def http_protocol(request) -> type:
    """Each of uvicorn's HTTP/1.1 protocols in turn (``live_server``'s ``http``)."""
    return request.param


def _exchange(sock: socket.socket, request: bytes) -> tuple[int, dict[str, str], bytes]:
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


@pytest.fixture(scope="session")
def exchange():
    """``exchange(sock, request)``: send a raw HTTP/1.1 request and read one answer (status, headers, body)."""
    return _exchange


@pytest.fixture(scope="session")
def classifier_client(classifier_dir):
    with client_for(classifier_dir) as client:
        wait_ready(client)
        yield client


@pytest.fixture(scope="session")
def translator_client(translator_dir):
    with client_for(translator_dir, max_beam=8) as client:
        wait_ready(client)
        yield client


@pytest.fixture(scope="session")
def keyed_translator_client(translator_dir):
    """A client of a translator's server that needs an API key (the client's ``api_key``; it sends none itself)."""
    key = "open sesame"
    with client_for(translator_dir, max_beam=8, api_key=key) as client:
        wait_ready(client)
        client.api_key = key
        yield client
