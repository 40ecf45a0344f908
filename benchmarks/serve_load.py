"""Load test of ``attnkit serve`` on loopback: N concurrent clients for T seconds, with and without batching, against
the offline figures for the same inputs (issue 14's Done-when).

    python benchmarks/serve_load.py --model RUN_DIR [--clients 32] [--seconds 20] [--threads 1]
    python benchmarks/serve_load.py --model minilm --endpoint embed
    python benchmarks/serve_load.py --model RUN_DIR --endpoint translate --beam 4 --phases one_client [--device cuda]

Each client sends one text per request (the texts of the RT-polarity test split, or --texts FILE, in turn) and
waits for the answer before sending the next (closed loop). Reported, as one JSON object:
  offline_batched      texts/s of the library on all inputs at once (what `classify predict` / `embed` do)
  offline_single_ms    median latency of one text through the library, in-process
  batched / unbatched  throughput, p50 / p99 latency and errors of the server at --clients, with batching and with
                       --no-batching (one request at a time)
  one_client           the same at one client (its p50 is compared with offline_single_ms)
  overload             4x capacity against a small queue: how many got 429, how fast (p99, max), and whether every
                       accepted request finished
Every phase is bounded by --seconds; servers bind 127.0.0.1 only and are stopped with SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

PHASES = ("batched", "unbatched", "one_client", "overload")
ENDPOINTS = {  # endpoint -> (path, the body's field of texts)
    "classify": ("/v1/classify", "inputs"),
    "embed": ("/v1/embeddings", "input"),
    "translate": ("/v1/translate", "inputs"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, threads: int, extra: list[str], ready_s: float = 120) -> tuple[subprocess.Popen, str]:
    """``attnkit serve`` on a free loopback port, once it answers /ready within ``ready_s`` (``extra``: its further
    flags)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "attnkit",
            "serve",
            model,
            "--port",
            str(port),
            "--quiet",
            "--threads",
            str(threads),
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(int(ready_s / 0.2)):  # bounded (120 s by default: loading MiniLM on a busy machine)
        if proc.poll() is not None:
            raise SystemExit(f"attnkit serve exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"attnkit serve did not become ready in {ready_s:g} s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Connection:
    """A minimal keep-alive HTTP/1.1 client on asyncio streams: the load generator shares the CPU with the server,
    and httpx spends several times more per request than this."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        status = int((await self.reader.readline()).split()[1])
        length, close = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):  # bounded by the response
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and "close" in value.lower():
                close = True
        await self.reader.readexactly(length)
        if close:
            await self.close()
        return status

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


async def load(
    url: str, path: str, field: str, texts: list[str], clients: int, seconds: float, extra: dict | None = None
) -> dict:
    """``clients`` closed-loop clients for ``seconds``; per status: count and latencies."""
    extra = extra or {}
    host, port = url.removeprefix("http://").split(":")
    bodies = [json.dumps({field: text, **extra}).encode() for text in texts]
    latencies: dict[int | str, list[float]] = {}
    deadline = time.perf_counter() + seconds

    async def one(worker: int) -> None:
        connection = Connection(host, int(port))
        i = worker
        while time.perf_counter() < deadline:  # bounded by the deadline
            start = time.perf_counter()
            try:
                status: int | str = await asyncio.wait_for(connection.post(path, bodies[i % len(bodies)]), 60)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError, IndexError) as err:
                status = type(err).__name__
                await connection.close()
            latencies.setdefault(status, []).append(time.perf_counter() - start)
            i += clients
            if status == 429:
                await asyncio.sleep(0.001)  # a well-behaved client backs off (the server said Retry-After)
        await connection.close()

    start = time.perf_counter()
    await asyncio.gather(*(one(w) for w in range(clients)))
    elapsed = time.perf_counter() - start
    ok = latencies.get(200, [])
    ms = lambda x: None if x is None else round(1000 * x, 2)  # noqa: E731
    out = {
        "clients": clients,
        "seconds": round(elapsed, 1),
        "ok": len(ok),
        "throughput_per_s": round(len(ok) / elapsed, 1),
        "p50_ms": ms(percentile(ok, 0.5)),
        "p99_ms": ms(percentile(ok, 0.99)),
        "errors": {str(k): len(v) for k, v in latencies.items() if k != 200},
    }
    if 429 in latencies:
        refused = latencies[429]
        out["refused_p50_ms"], out["refused_p99_ms"] = ms(percentile(refused, 0.5)), ms(percentile(refused, 0.99))
        out["refused_max_ms"] = ms(max(refused))
    return out


def run(coroutine):
    """``asyncio.run`` on uvloop when it is installed (it comes with uvicorn's standard extra): the load generator
    shares the CPU with the server, so its own cost per request is kept low."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def server_side_429(url: str, path: str) -> dict:
    """How many 429s the server answered within 10 ms, by its own clock (/metrics): the client's clock adds its own
    scheduling delays, large on a shared machine."""
    import httpx

    within = total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if f'endpoint="{path}"' not in line or 'status="429"' not in line:
            continue
        if line.startswith("attnkit_request_seconds_bucket") and 'le="0.01"' in line:
            within = float(line.split()[-1])
        elif line.startswith("attnkit_request_seconds_count"):
            total = float(line.split()[-1])
    return {"server_429": int(total), "server_429_within_10ms": int(within)}


def offline(model_spec: str, endpoint: str, texts: list[str], seconds: float, device: str, beam: int) -> dict:
    """The library on the same inputs, in this process: all at once (batched, as the CLI does) and one by one."""
    if endpoint == "translate":
        from attnkit.tasks.translate import TranslatorRun

        translator = TranslatorRun(model_spec, device=device)
        batch = lambda xs: translator.translate(xs, beam=beam)  # noqa: E731
    elif endpoint == "classify":
        from attnkit.tasks.classify import ClassifierRun

        run = ClassifierRun(model_spec, device=device)
        batch = run.predict
    else:
        from attnkit.interop.bert import load_bert_classifier, resolve_bert_folder
        from attnkit.tasks.embed import sentence_embeddings

        model, _, tokenizer = load_bert_classifier(resolve_bert_folder(model_spec), n_classes=1)
        batch = lambda xs: sentence_embeddings(model, tokenizer, xs, normalize=True, batch_size=64)  # noqa: E731
    batch(texts[:64])  # warm-up
    start, rounds = time.perf_counter(), 0
    while rounds == 0 or time.perf_counter() - start < min(seconds, 10):  # bounded: at least one pass, ~10 s
        batch(texts)
        rounds += 1
    batched = rounds * len(texts) / (time.perf_counter() - start)
    singles = []
    deadline = time.perf_counter() + min(seconds, 5)
    for text in texts:
        if time.perf_counter() > deadline:
            break
        t0 = time.perf_counter()
        batch([text])
        singles.append(time.perf_counter() - t0)
    return {
        "offline_batched_per_s": round(batched, 1),
        "offline_single_ms": round(1000 * statistics.median(singles), 2),
    }


def read_texts(args: argparse.Namespace) -> list[str]:
    cache = Path(os.environ.get("ATTNKIT_CACHE") or Path.home() / ".cache" / "attnkit")
    if args.texts:
        lines = Path(args.texts).read_text(encoding="utf-8").splitlines()
    elif args.endpoint == "translate":  # the Bible pairs' test split (John), its English side
        from attnkit.data.readers.parallel import read_parallel_tsv

        lines = [pair.source for pair in read_parallel_tsv(cache / "bible" / "en-de" / "test.tsv")]
    else:
        from attnkit.data.readers.labeled import read_labeled

        lines = [ex.text for ex in read_labeled(cache / "rt-polarity" / "test.tsv")]
    return [line for line in lines if line.strip()][: args.max_texts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", required=True, help="classifier or translator run directory, or minilm with --endpoint embed"
    )
    parser.add_argument("--endpoint", choices=("classify", "embed", "translate"), default="classify")
    parser.add_argument("--beam", type=int, default=4, help="translate: the beam of every request")
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES), help="which phases to run")
    parser.add_argument("--device", default="cpu", help="the server's and the library's device (cpu, cuda)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (server and offline alike)")
    parser.add_argument("--texts", help="one text per line (default: the RT-polarity test split; translate: John)")
    parser.add_argument("--max-texts", type=int, default=1000)
    parser.add_argument("--overload-queue", type=int, default=8, help="the queue bound of the overload phase")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    if not (1 <= args.clients <= 1024 and 0 < args.seconds <= 300):
        raise SystemExit("--clients 1..1024 and --seconds in (0, 300]")

    import torch

    torch.set_num_threads(args.threads)
    texts = read_texts(args)
    path, field = ENDPOINTS[args.endpoint]
    extra = {"classify": {"truncate": True}, "translate": {"beam": args.beam, "truncate": True}}.get(args.endpoint, {})
    device = ["--device", args.device]
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    report: dict = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "texts": len(texts),
        "device": args.device,
        **offline(args.model, args.endpoint, texts, args.seconds, args.device, args.beam),
    }

    for name, flags, clients in (
        ("batched", [], args.clients),
        ("unbatched", ["--no-batching"], args.clients),
        ("one_client", [], 1),
    ):
        if name not in args.phases:
            continue
        proc, url = start_server(args.model, args.threads, flags + device)
        try:
            run(load(url, path, field, texts, min(clients, 4), min(2, args.seconds), extra))  # warm-up
            report[name] = run(load(url, path, field, texts, clients, args.seconds, extra))
        finally:
            stop_server(proc)
        print(json.dumps({name: report[name]}), file=sys.stderr)

    if "overload" in args.phases:
        overload(report, args, path, field, texts, extra, device)
    report["load_average_at_end"] = os.getloadavg()
    if set(args.phases) == set(PHASES):
        report["done_when"] = done_when(report)
    elif "one_client" in args.phases:
        one = report["one_client"]
        report["one_client_p50_minus_offline_single_ms"] = round(one["p50_ms"] - report["offline_single_ms"], 2)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")


def overload(report: dict, args: argparse.Namespace, path, field, texts, extra, device: list[str]) -> None:
    """Capacity = a batch of max_queue inputs running + max_queue queued; 4x that many clients."""
    q = args.overload_queue
    flags = ["--max-queue", str(q), "--max-batch-inputs", str(q), *device]
    proc, url = start_server(args.model, args.threads, flags)
    try:
        report["overload"] = {
            "max_queue": q,
            **run(load(url, path, field, texts, 4 * 2 * q, args.seconds, extra)),
            **server_side_429(url, path),
        }
    finally:
        stop_server(proc)


def done_when(report: dict) -> dict:
    """Issue 14's Done-when, from a report of every phase."""
    b, u, one = report["batched"], report["unbatched"], report["one_client"]
    return {
        "zero_errors_at_clients": not b["errors"],
        "throughput_vs_offline_batched": round(b["throughput_per_s"] / report["offline_batched_per_s"], 3),
        "batching_speedup": round(b["throughput_per_s"] / max(u["throughput_per_s"], 1e-9), 2),
        "one_client_p50_minus_offline_single_ms": round(one["p50_ms"] - report["offline_single_ms"], 2),
        "overload_refused_p99_ms_client_side": report["overload"].get("refused_p99_ms"),
        "overload_429_within_10ms_server_side": f"{report['overload']['server_429_within_10ms']} of "
        f"{report['overload']['server_429']}",
        "overload_non_429_errors": {k: v for k, v in report["overload"]["errors"].items() if k != "429"},
    }


if __name__ == "__main__":
    main()
