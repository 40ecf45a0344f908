"""Batched answers equal the CLI's exactly (1e-6 for probabilities, identical translations), for inputs sent alone
and inside concurrent batches; the batcher's policy (groups, token budget, bounded queue, timeouts)."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import redirect_stdout

import pytest

from attnkit.cli import main
from attnkit.serving.batcher import Batcher, QueueFull

SENTENCES = [
    "a truly wonderful film",
    "boring",
    "the plot was dull and the acting worse",
    "zzqx great",
    "I loved every moment of it",
    "bad bad bad",
    "an inspiring story",
    "not good",
]
SOURCES = ["a b c", "h g", "a a b b c c d", "e", "f g h a b", "c d e f g h a", "b", "d d"]


def cli_stdout(argv: list[str], stdin: str = "") -> str:
    out = io.StringIO()
    old = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with redirect_stdout(out):
            assert main(argv) == 0
    finally:
        sys.stdin = old
    return out.getvalue()


def batch_count(client) -> tuple[float, float]:
    """(batches run, requests in them) so far, from /metrics."""
    values = {}
    for line in client.get("/metrics").text.splitlines():
        for name in ("attnkit_batch_requests_count", "attnkit_batch_requests_sum"):
            if line.startswith(name + " "):
                values[name] = float(line.split()[1])
    return values["attnkit_batch_requests_count"], values["attnkit_batch_requests_sum"]


def concurrently(client, path: str, bodies: list[dict]) -> list[dict]:
    with ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(lambda body: client.post(path, json=body), bodies))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    return [r.json() for r in responses]


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_classify_equals_classify_predict_alone_and_in_concurrent_batches(classifier_dir, serve_client, worker):
    expected = [
        json.loads(line)
        for line in cli_stdout(["classify", "predict", "--model", str(classifier_dir), *SENTENCES]).splitlines()
    ]
    # max_wait_ms lets the concurrent requests gather into batches (checked below through the metrics).
    with serve_client(classifier_dir, worker, max_wait_ms=100) as client:
        alone = [client.post("/v1/classify", json={"inputs": s}).json()["results"][0] for s in SENTENCES]
        before = batch_count(client)
        together = [r["results"][0] for r in concurrently(client, "/v1/classify", [{"inputs": s} for s in SENTENCES])]
        batches, requests = (a - b for a, b in zip(batch_count(client), before))
        assert requests == len(SENTENCES) and batches < len(SENTENCES)  # some requests did share a batch
    for want, got_alone, got_together in zip(expected, alone, together):
        for got in (got_alone, got_together):
            assert got["label"] == want["label"]
            # The CLI rounds to 6 decimals: 1e-6 covers the rounding and any batch effect.
            assert got["probs"] == pytest.approx(want["probs"], abs=1e-6)


@pytest.mark.parametrize("beam, worker", [(1, "thread"), (4, "thread"), (4, "process")])
def test_translate_equals_translate_run_alone_and_in_concurrent_batches(translator_dir, serve_client, beam, worker):
    expected = cli_stdout(
        ["translate", "run", "--model", str(translator_dir), "--beam", str(beam)], "\n".join(SOURCES) + "\n"
    ).splitlines()
    assert len(expected) == len(SOURCES)
    with serve_client(translator_dir, worker, max_wait_ms=100) as client:
        alone = [
            client.post("/v1/translate", json={"inputs": s, "beam": beam}).json()["results"][0]["translation"]
            for s in SOURCES
        ]
        before = batch_count(client)
        # Other decoding parameters in the mix: they must batch apart and not disturb these.
        bodies = [{"inputs": s, "beam": beam} for s in SOURCES] + [
            {"inputs": s, "beam": 2, "alpha": 1.0} for s in SOURCES[:3]
        ]
        results = concurrently(client, "/v1/translate", bodies)
        batches, _ = (a - b for a, b in zip(batch_count(client), before))
        assert batches < len(bodies)
        together = [r["results"][0]["translation"] for r in results[: len(SOURCES)]]
        several = client.post("/v1/translate", json={"inputs": SOURCES, "beam": beam}).json()["results"]
    assert alone == expected
    assert together == expected
    assert [r["translation"] for r in several] == expected


def test_n_best_does_not_change_the_best_translation(translator_client):
    one = translator_client.post("/v1/translate", json={"inputs": SOURCES, "beam": 4, "n_best": 1}).json()["results"]
    four = translator_client.post("/v1/translate", json={"inputs": SOURCES, "beam": 4, "n_best": 4}).json()["results"]
    assert [r["translation"] for r in one] == [r["translation"] for r in four]


# -- the batcher on its own -------------------------------------------------------------------------------------------


class Recorder:
    """A runner that records its batches, and can be held (to fill the queue) with ``gate``."""

    def __init__(self):
        self.batches: list[tuple[tuple, list[list[list[int]]]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()

    def __call__(self, group, jobs):
        self.started.set()
        assert self.gate.wait(10)
        self.batches.append((group, jobs))
        return [len(seqs) for seqs in jobs]


def run_async(coro):
    return asyncio.run(coro)


def test_batches_respect_groups_budget_and_count():
    runner = Recorder()
    runner.gate.clear()
    batcher = Batcher(runner, max_queue=100, max_batch_tokens=40, max_batch_inputs=3)
    batcher.start()

    async def scenario():
        blocker = asyncio.ensure_future(batcher.submit(("x",), [[0]], 5))
        await asyncio.sleep(0.05)  # the worker is now running ``blocker``: the rest queue up
        jobs = [
            batcher.submit(("a",), [[0] * 10], 5),
            batcher.submit(("b",), [[0] * 10], 5),
            batcher.submit(("a",), [[0] * 10], 5),
            batcher.submit(("a",), [[0] * 10, [0] * 10], 5),
            batcher.submit(("a",), [[0] * 30], 5),
        ]
        tasks = [asyncio.ensure_future(j) for j in jobs]
        await asyncio.sleep(0.05)
        runner.gate.set()
        return await blocker, await asyncio.gather(*tasks)

    try:
        first, results = run_async(scenario())
    finally:
        batcher.stop()
    assert first == 1 and results == [1, 1, 1, 2, 1]
    groups = [(group, [len(seqs) for seqs in jobs]) for group, jobs in runner.batches]
    # After the blocker: the oldest "a" takes the next "a" (2 inputs x 10 = 20 tokens); the two-input "a" would
    # make 4 inputs (over 3) and waits; "b" keeps its place; the 30-token "a" (alone: over the budget with others).
    assert groups == [(("x",), [1]), (("a",), [1, 1]), (("b",), [1]), (("a",), [2]), (("a",), [1])]


def test_full_queue_refuses_at_once_and_a_timeout_is_reported():
    runner = Recorder()
    runner.gate.clear()
    batcher = Batcher(runner, max_queue=2)
    batcher.start()

    async def scenario():
        running = asyncio.ensure_future(batcher.submit(("a",), [[1]], 5))
        await asyncio.sleep(0.05)
        queued = [asyncio.ensure_future(batcher.submit(("a",), [[1]], 5)) for _ in range(2)]
        await asyncio.sleep(0.01)
        start = time.perf_counter()
        with pytest.raises(QueueFull):
            await batcher.submit(("a",), [[1]], 5)
        refused_in = time.perf_counter() - start
        runner.gate.set()
        return refused_in, await running, await asyncio.gather(*queued)

    try:
        refused_in, first, rest = run_async(scenario())
    finally:
        batcher.stop()
    assert refused_in < 0.01 and first == 1 and rest == [1, 1]


def test_a_request_that_timed_out_in_the_queue_is_skipped():
    runner = Recorder()
    runner.gate.clear()
    batcher = Batcher(runner, max_queue=10)
    batcher.start()

    async def scenario():
        running = asyncio.ensure_future(batcher.submit(("a",), [[1]], 5))
        await asyncio.sleep(0.05)
        with pytest.raises(asyncio.TimeoutError):
            await batcher.submit(("late",), [[1]], 0.05)
        runner.gate.set()
        return await running

    try:
        run_async(scenario())
    finally:
        batcher.stop()
    assert [group for group, _ in runner.batches] == [("a",)]  # the timed-out job never ran


def test_a_batch_is_split_where_padding_would_grow():
    from attnkit.serving.batcher import MAX_PADDING, MIN_WASTE, padding_bounded

    lengths = [1, 2, 2, 3, 10, 10, 11, 40, 100, 100, 110, 120, 300]
    parts = padding_bounded([[0] * n for n in lengths])
    assert [len(s) for part in parts for s in part] == lengths  # order kept, nothing lost
    for part in parts:
        waste = len(part[-1]) * len(part) - sum(len(s) for s in part)
        assert waste <= max(MAX_PADDING * sum(len(s) for s in part), MIN_WASTE)
    # 40 after seven short ones would pad 241 tokens (over 128 and 25%); 100 after 40 pads 60 (under 128); 120 after
    # 40, 100, 100, 110 would pad 130 (over 128 and over 25% of 470).
    assert [[len(s) for s in part] for part in parts] == [[1, 2, 2, 3, 10, 10, 11], [40, 100, 100, 110], [120], [300]]
