"""Engines with a thread pool of their own (CTranslate2), timed in a child process of their own.

Why a child process. CTranslate2 runs its own OpenMP pool (its wheel bundles its own libgomp), PyTorch another. In
one process the two pools compete for the same cores and a pool's threads keep spinning for a while after each call,
so each engine runs slower than it would alone: measured in one process CTranslate2 float32 greedy read 3,063 tok/s
and attnkit 2,933, against 7,948 and 5,044 each in a process of its own (issue 15). A deployed engine runs in a
process of its own, so that is what the suites time: the parent (PyTorch engines) sends the model directory and the
inputs, the child loads the engine with its best documented settings, times each call itself with
``time.perf_counter`` and answers with the seconds (``Elapsed``), so that the round trip through the pipe is not
counted. The parent still decides the order, one call at a time, so a child engine is timed in turns with the
in-process ones (``timing.measure_interleaved``), and no two engines ever run at once.

Protocol: one JSON object per line, parent -> child on stdin, child -> parent on stdout; every answer carries the
child's ``pid``; a failure answers ``{"error": ...}`` and the parent raises it.

    {"op": "load", "engine": "ctranslate2", "model_dir": ..., "compute_type": ..., "threads": N,
     "device": "cpu" | "cuda", "device_index": I}
        -> {"settings": {...}, "versions": {...}, "threads": N}
    {"op": "translate", "batches": [[[token, ...], ...], ...], "beam_size": K, "steps": T}
        -> {"seconds": s, "produced": n}: every batch translated in turn, exactly T tokens per sentence
    {"op": "quit"}

The child imports neither torch nor the rest of attnkit, so that its process holds only the engine's thread pool.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the child process never imports torch
    import torch


@dataclass(frozen=True)
class Elapsed:
    """What a call timed by itself returns: its own seconds (which ``measure_interleaved`` uses instead of the
    parent's clock) and its value (here, the number of tokens produced)."""

    seconds: float
    value: object


class ChildEngine:
    """A child process running one engine (``python -m attnkit.bench.isolated``); a context manager.

    The child's ``PYTHONPATH`` starts with the directory this attnkit was imported from, so that parent and child
    run the same code (a worktree, ``benchmarks/ab.py``'s checkouts)."""

    def __init__(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])  # .../src, which holds attnkit/
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "attnkit.bench.isolated"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.pid = self._proc.pid

    def request(self, op: str, **fields) -> dict:
        """Send one message and return the child's answer; raise RuntimeError with the child's error."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark child process {self.pid} exited (code {self._proc.wait()}) during {op!r}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"benchmark child process {self.pid}, {op!r}: {answer['error']}")
        return answer

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self._proc.stdin.close()
                self._proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()

    def __enter__(self) -> ChildEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class CT2Translator:
    """A CTranslate2 ``Translator`` in a child process, with the settings CTranslate2 documents for throughput on a
    CPU serving one stream of batches: ``inter_threads=1`` (one batch at a time) and ``intra_threads`` = the cores
    given (its "Multithreading and parallelism" guide: ``inter_threads * intra_threads`` at most the cores). On a
    GPU (``device`` cuda:I) the same translator on that GPU, its wheel's CUDA build."""

    def __init__(
        self,
        child: ChildEngine,
        model_dir: str | Path,
        *,
        compute_type: str,
        threads: int,
        device: torch.device | None = None,
    ):
        self.child = child
        on_gpu = device is not None and device.type == "cuda"
        answer = child.request(
            "load",
            engine="ctranslate2",
            model_dir=str(model_dir),
            compute_type=compute_type,
            threads=threads,
            device="cuda" if on_gpu else "cpu",
            device_index=(device.index or 0) if device is not None and on_gpu else 0,
        )
        self.pid: int = answer["pid"]
        self.settings: dict = answer["settings"]
        self.versions: dict = answer["versions"]
        self.threads: int = answer["threads"]

    def translate(self, batches: list[list[list[str]]], *, beam_size: int, steps: int) -> Elapsed:
        """Translate each batch of token lists in turn, exactly ``steps`` tokens each; the child's seconds."""
        answer = self.child.request("translate", batches=batches, beam_size=beam_size, steps=steps)
        return Elapsed(answer["seconds"], answer["produced"])


def describe_settings(settings: dict) -> str:
    """``inter_threads=1, intra_threads=2, compute_type=float32``: a peer's settings for a table's ``settings``."""
    return ", ".join(f"{k}={v}" for k, v in settings.items())


# ---------------------------------------------------------------------------------------------------------------
# The child side


class _CT2Engine:
    def __init__(self, model_dir: str, compute_type: str, threads: int, device: str = "cpu", device_index: int = 0):
        import ctranslate2

        self.settings: dict = {"inter_threads": 1, "intra_threads": threads, "compute_type": compute_type}
        if device == "cuda":
            if ctranslate2.get_cuda_device_count() <= device_index:
                raise RuntimeError(
                    f"CTranslate2 {ctranslate2.__version__} sees {ctranslate2.get_cuda_device_count()} CUDA "
                    f"devices (its wheel's CUDA build needs the CUDA 12 cuBLAS libraries); leave it out with "
                    f"--impl attnkit --impl torch.nn --impl transformers"
                )
            self.settings = {"device": "cuda", "device_index": device_index, "compute_type": compute_type}
        self.translator = ctranslate2.Translator(model_dir, **{"device": "cpu", **self.settings})
        self.versions = {"ctranslate2": ctranslate2.__version__}
        self.threads = threads

    def translate(self, batches: list, beam_size: int, steps: int) -> tuple[float, int]:
        produced = 0
        start = time.perf_counter()
        for batch in batches:
            results = self.translator.translate_batch(
                batch,
                beam_size=beam_size,
                min_decoding_length=steps,
                max_decoding_length=steps,
                return_scores=False,
                suppress_sequences=[["<pad>"], ["<bos>"]],  # as attnkit, which never emits padding or BOS
            )
            produced += sum(len(r.hypotheses[0]) for r in results)
        return time.perf_counter() - start, produced


def _answer(message: dict, engine: _CT2Engine | None) -> tuple[dict, _CT2Engine | None]:
    op = message.get("op")
    if op == "load":
        if message["engine"] != "ctranslate2":
            raise ValueError(f"unknown engine {message['engine']!r}; expected 'ctranslate2'")
        engine = _CT2Engine(
            message["model_dir"],
            message["compute_type"],
            int(message["threads"]),
            message.get("device", "cpu"),
            int(message.get("device_index", 0)),
        )
        return {"settings": engine.settings, "versions": engine.versions, "threads": engine.threads}, engine
    if op == "translate":
        if engine is None:
            raise ValueError("translate before load")
        seconds, produced = engine.translate(message["batches"], int(message["beam_size"]), int(message["steps"]))
        return {"seconds": seconds, "produced": produced}, engine
    raise ValueError(f"unknown op {op!r}")


def main() -> int:
    """The child's loop: read a message, answer it, until "quit" or the end of stdin."""
    engine = None
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("op") == "quit":
            break
        try:
            answer, engine = _answer(message, engine)
        except Exception as err:  # reported to the parent, which raises it; the child stays up for the next message
            answer = {"error": f"{type(err).__name__}: {err}"}
        sys.stdout.write(json.dumps({**answer, "pid": os.getpid()}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
