"""What a client of ``attnkit serve`` sees while the compiled engine makes a new bucket's programs (docs/serving.md).

    python benchmarks/serve_compile.py --model RUN_DIR [--sentences 3] [--every 1.0] [--seconds 600] [--cold]

Starts ``ATTNKIT_ENGINE=compiled attnkit serve RUN_DIR`` (``--cold``: with an empty Inductor cache, as on a new
machine) and times how long it takes to report ready (its warm-up compiles the one-sentence programs). Then one
client sends the same greedy request of ``--sentences`` sentences (a bucket the warm-up did not make) every
``--every`` seconds, until the requests have run compiled (five in a row under 0.7x the first five's median) or
``--seconds`` have passed. Last, a server with the default engine answers the same request five times: the eager
figure. Reported as one JSON object: the CPU, ready_s, every request's status, the latency while the bucket compiled
(median, max), after (median of the last five), how long the bucket took to compile, and the eager latency.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import httpx

from serve_load import start_server, stop_server

TEXTS = [
    "In the beginning was the Word",
    "and the Word was with God",
    "and the Word was God.",
    "The same was in the beginning with God.",
]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return f"{names[0]} x{len(names)}" if names else platform.processor()
    except OSError:
        return platform.processor()


def compiled(latencies: list[float]) -> bool:
    """Whether the last five requests ran compiled: each under 0.7x the median of the first five (eager, beside the
    compiler; compiled takes ~0.5x eager's time at a few sentences, docs/serving.md)."""
    return len(latencies) >= 10 and all(s < 0.7 * statistics.median(latencies[:5]) for s in latencies[-5:])


def post(url: str, body: dict, timeout_s: float) -> tuple[int, float]:
    start = time.perf_counter()
    try:
        status = httpx.post(url + "/v1/translate", json=body, timeout=timeout_s).status_code
    except httpx.TimeoutException:
        status = 0
    return status, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a translator's run directory")
    parser.add_argument("--sentences", type=int, default=3, help="sentences a request (2-4: the bucket of 4 rows)")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between the end of a request and the next")
    parser.add_argument("--seconds", type=float, default=600, help="at most this long for the bucket to compile")
    parser.add_argument("--threads", type=int, default=2, help="the server's --threads")
    parser.add_argument("--cold", action="store_true", help="an empty Inductor cache (a new machine)")
    args = parser.parse_args()
    body = {"inputs": (TEXTS * args.sentences)[: args.sentences], "beam": 1}
    report: dict = {"cpu": cpu_name(), "model": args.model, "sentences": args.sentences, "every_s": args.every}
    with tempfile.TemporaryDirectory() as cache:
        os.environ["ATTNKIT_ENGINE"] = "compiled"
        if args.cold:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        started = time.perf_counter()
        proc, url = start_server(args.model, args.threads, [], ready_s=args.seconds)
        report["ready_s"] = round(time.perf_counter() - started, 1)
        latencies, statuses = [], []
        try:
            first = time.perf_counter()
            while time.perf_counter() - first < args.seconds:  # bounded
                status, seconds = post(url, body, timeout_s=60)
                statuses.append(status)
                latencies.append(seconds)
                if compiled(latencies):
                    break
                time.sleep(args.every)
            compiled_after = time.perf_counter() - first
        finally:
            stop_server(proc)
    del os.environ["ATTNKIT_ENGINE"]
    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    done = compiled(latencies)
    during = latencies[:-5] if done else latencies
    report["statuses"] = {str(code): statuses.count(code) for code in sorted(set(statuses))}
    report["while_compiling_ms"] = {
        "requests": len(during),
        "median": round(1e3 * statistics.median(during)),
        "max": round(1e3 * max(during)),
    }
    if done:
        report["compiled_ms"] = round(1e3 * statistics.median(latencies[-5:]))
        report["compiled_after_s"] = round(compiled_after, 1)
    proc, url = start_server(args.model, args.threads, [])
    try:
        post(url, body, timeout_s=60)  # the eager server's first call pays for lazy initialisation
        report["eager_ms"] = round(1e3 * statistics.median(post(url, body, timeout_s=60)[1] for _ in range(5)))
    finally:
        stop_server(proc)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
