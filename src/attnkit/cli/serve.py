"""``attnkit serve RUN_DIR|minilm``: the HTTP API and the playground (needs ``pip install attnkit[serve]``)."""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import socket
import sys

from attnkit.cli.arguments import port_number, thread_count
from attnkit.cli.common import add_device_arg, add_precision_arg, check_precision, device_of
from attnkit.errors import InputError

API_KEY_VARIABLE = "ATTNKIT_API_KEY"  # TEI reads its --api-key from API_KEY
DEFAULT_MAX_CONNECTIONS = 512


def cmd_serve(args: argparse.Namespace) -> None:
    try:
        from attnkit.serving.app import Limits, create_app
        from attnkit.serving.auth import check_key
        from attnkit.serving.models import load_model
        from attnkit.serving.server import listen_sockets, make_server
        from attnkit.serving.worker import ProcessRunner
    except ImportError as err:
        raise InputError(
            f"attnkit serve needs the serve extra ({err.name} is missing): pip install 'attnkit[serve]'"
        ) from None
    import logging

    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    limits = Limits(
        max_body_bytes=args.max_body_bytes,
        max_inputs=args.max_inputs,
        max_chars=args.max_chars,
        max_queue=args.max_queue,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_inputs=args.max_batch_inputs,
        max_wait_ms=args.max_wait_ms,
        timeout_s=args.timeout,
        max_beam=args.max_beam,
        attention_max_tokens=args.attention_max_tokens,
        batching=not args.no_batching,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        max_connections=DEFAULT_MAX_CONNECTIONS if args.max_connections is None else args.max_connections,
    )
    check_limits(limits)
    check_host(args.host)
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_VARIABLE) or None
    if api_key is not None:  # before the model loads, naming where the key came from
        check_key(api_key, "--api-key" if args.api_key is not None else API_KEY_VARIABLE)
    limits = fit_connections(limits, explicit=args.max_connections is not None)
    sockets = listen_sockets(args.host, args.port)  # before the model loads: a port in use is an error line at once
    port = args.port or sockets[0].getsockname()[1]  # --port 0: the one the system chose
    # The inference worker holds the GIL between torch calls; by default Python hands it over every 5 ms, which
    # would put up to 5 ms on every step of the event loop (a 429 must take microseconds). 0.5 ms keeps the loop
    # responsive at a small cost to the worker.
    sys.setswitchinterval(0.0005)
    device = device_of(args)
    check_precision(args.precision, device, what="--precision")
    runner = None
    if args.worker == "process":
        # The child process runs the model on the device; this process keeps a CPU copy for tokenization and
        # metadata only (loading it here first makes a bad run an error line, exit 2, before anything listens).
        model = load_model(args.model, "fp32", "cpu")
        if args.precision == "int8" and model.task == "classifier":  # an embedder runs in float32 whatever
            raise InputError(f"--precision int8 is for translators; {args.model} is a classifier")
        runner = ProcessRunner(str(args.model), args.precision, str(device), args.threads)
    else:
        model = load_model(args.model, args.precision, device)
    app = create_app(model, limits, runner, api_key)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = make_server(app, limits, host=args.host, port=args.port, quiet=args.quiet)
    if api_key is None and not loopback_only(args.host):
        print(
            f"warning: --host {args.host} takes connections from other machines, and without an API key anyone who "
            f"can reach port {port} can use the model: set {API_KEY_VARIABLE} (or --api-key)",
            file=sys.stderr,
        )
    host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address in a URL (RFC 3986)
    print(f"attnkit serve: {model.task} {model.name} on http://{host}:{port}/ (Ctrl-C stops)", file=sys.stderr)
    server.run(sockets=sockets)


SECONDS_CEILING = 86_400.0  # a day: any timeout beyond is a typo, and an infinite one overflows the event loop's clock


def check_limits(limits) -> None:
    """Every limit of ``limits`` (a ``serving.limits.Limits`` made from the flags) finite and > 0, the timeouts at most
    a day, --max-beam at most the API's largest beam, and --max-wait-ms >= 0 and shorter than --timeout (a batch
    that waits longer answers nobody in time)."""
    flags = {"timeout_s": "timeout", "header_timeout_s": "header_timeout", "body_timeout_s": "body_timeout"}
    for name, value in vars(limits).items():
        if isinstance(value, bool):
            continue
        flag = f"--{flags.get(name, name).replace('_', '-')}"
        if not value >= 0 or (value == 0 and name != "max_wait_ms"):  # "not >=": NaN too
            raise InputError(f"{flag} {value}: must be {'>=' if name == 'max_wait_ms' else '>'} 0")
        if not math.isfinite(value):
            raise InputError(f"{flag} {value}: must be a finite number")
        if name in flags and value > SECONDS_CEILING:
            raise InputError(f"{flag} {value:g}: at most {SECONDS_CEILING:,.0f} seconds (a day)")
    from attnkit.serving.limits import MAX_BEAM

    if limits.max_beam > MAX_BEAM:
        raise InputError(
            f"--max-beam {limits.max_beam}: at most {MAX_BEAM} (each beam is a copy of the decoding state)"
        )
    if limits.max_wait_ms >= limits.timeout_s * 1000:
        raise InputError(
            f"--max-wait-ms {limits.max_wait_ms:g}: must be shorter than --timeout ({limits.timeout_s:g} s), or every "
            "request waiting for its batch to fill would time out"
        )


def fit_connections(limits, *, explicit: bool):
    """``limits`` with as many connections as the process may open files for (``server.descriptors_needed``), its
    soft limit raised where it has to be: the default number is lowered to fit (said in a note), a number given on
    the command line that does not fit is an error."""
    from dataclasses import replace

    from attnkit.serving.server import RESERVED_DESCRIPTORS, descriptors_needed, open_file_limit

    needed = descriptors_needed(limits)
    allowed = open_file_limit(needed)
    if allowed is None or allowed >= needed:
        return limits
    fitted = (allowed - RESERVED_DESCRIPTORS) // 3
    if explicit or fitted < 1:
        raise InputError(
            f"--max-connections {limits.max_connections}: needs about {needed} open files, and this process may "
            f"open {allowed} (ulimit -n): lower --max-connections or raise the limit"
        )
    print(f"note: --max-connections {fitted}: the most that {allowed} open files allow (ulimit -n)", file=sys.stderr)
    return replace(limits, max_connections=fitted)


def check_host(host: str) -> None:
    """``InputError`` for a --host that is neither an address nor a name this machine resolves (checked before the
    model loads; uvicorn would fail on it only when it binds, with a log line and exit code 3)."""
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as err:
        raise InputError(f"--host {host}: not an address or a name this machine resolves ({err})") from None


def loopback_only(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (127.0.0.0/8, ::1): only this machine can connect.
    A name that does not resolve is not (binding it will fail anyway)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def add_commands(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("serve", help="an HTTP API with dynamic batching, and a playground at /")
    p.hints = {"--model": "serve takes the model as its first argument: attnkit serve RUN_DIR"}
    p.add_argument(
        "model",
        metavar="RUN_DIR|minilm",
        help="a classifier or translator run directory, a BERT folder, or minilm (embeddings)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=port_number, default=8000, help="port (default %(default)s; 0: any free port)")
    p.add_argument(
        "--threads",
        type=thread_count,
        help="torch intra-op threads of the inference worker (default: torch's, one per physical core)",
    )
    add_precision_arg(
        p,
        "bf16: a classifier under bfloat16 autocast, a translator decoding in bfloat16 (GPUs, and CPUs with AMX or "
        "AVX512-BF16); fp16: the same in float16 (CUDA only); int8: a translator in bf16 with its weights rounded "
        "to int8 (CPUs; ~2x faster than bf16 for one sentence per request). Embedders run in float32",
        int8=True,
    )
    add_device_arg(p)
    p.add_argument(
        "--worker",
        choices=("process", "thread"),
        default="process",
        help="run the model in a child process (default: the event loop keeps its own core and GIL) or in a "
        "thread of the server's process (one copy of the weights)",
    )
    p.add_argument("--quiet", action="store_true", help="no access log")
    p.add_argument(
        "--api-key",
        metavar="KEY",
        help=f"require this key (default: ${API_KEY_VARIABLE}, which keeps it out of the process list): "
        "'Authorization: Bearer KEY', or LibreTranslate's api_key field on /translate; 401 without it. "
        "/health, /ready, /metrics, /openapi.json, /docs and the playground's files stay open",
    )
    limits = p.add_argument_group("limits")
    limits.add_argument(
        "--max-body-bytes", type=int, default=1_000_000, help="request body (413 beyond; default %(default)s)"
    )
    limits.add_argument(
        "--max-inputs", type=int, default=64, help="texts per request (413 beyond; default %(default)s)"
    )
    limits.add_argument(
        "--max-chars", type=int, default=10_000, help="characters per text (422 unless truncate; default %(default)s)"
    )
    limits.add_argument("--max-queue", type=int, default=64, help="queued requests (429 beyond; default %(default)s)")
    limits.add_argument(
        "--max-batch-tokens", type=int, default=8192, help="padded tokens per batch (default %(default)s)"
    )
    limits.add_argument("--max-batch-inputs", type=int, default=64, help="inputs per batch (default %(default)s)")
    limits.add_argument("--max-wait-ms", type=float, default=0.0, help="wait for a batch to fill (default 0)")
    limits.add_argument(
        "--timeout", type=float, default=30.0, help="seconds per request, queue included (504; default %(default)s)"
    )
    limits.add_argument("--max-beam", type=int, default=8, help="largest beam and n_best (default %(default)s)")
    limits.add_argument(
        "--attention-max-tokens", type=int, default=64, help="input length of /v1/attention (default %(default)s)"
    )
    limits.add_argument("--no-batching", action="store_true", help="one request at a time (for comparison)")
    slow = p.add_argument_group("slow and idle clients")
    slow.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="a request's line and headers must arrive within this, from connect or the previous answer (408; "
        "default 10)",
    )
    slow.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="a request's body must arrive within this once its headers are in (408; default 30)",
    )
    slow.add_argument(
        "--max-connections",
        type=int,
        help=f"open connections; past it the one waiting longest for its headers is closed, or 503 (default "
        f"{DEFAULT_MAX_CONNECTIONS}, or fewer where the open-file limit is lower; the process's soft limit is raised "
        "to 3x this + 64 where it can be)",
    )
    p.set_defaults(func=cmd_serve)
