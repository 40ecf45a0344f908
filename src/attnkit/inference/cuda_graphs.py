"""A decoding step recorded once as a ``torch.cuda.CUDAGraph`` and replayed: the CUDA-graph engines of
``attnkit.inference.programs``.

A graph is recorded per model and key (the engine, the step, its options and its state's shapes) on state that lives
as long as the graph: a call fills that state and replays the graph, which reruns the step's kernels on it with one
launch. Replays of one graph are serialised by its lock (they share the state). A graph reads the weights where they
were when it was recorded: once the model is moved or cast, its graphs are dropped.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class Recorded:
    """A recorded graph, the state it reads and writes, and the lock a call holds while it uses them."""

    state: Any
    graph: torch.cuda.CUDAGraph
    lock: threading.Lock


_GRAPHS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[int, ...], dict[Hashable, Recorded]]] = (
    weakref.WeakKeyDictionary()
)
_GRAPHS_LOCK = threading.Lock()
WARMUP = 3  # runs on a side stream before recording (kernels load, cuBLAS makes its handles, a compiled step compiles)


def recorded(model: nn.Module, key: Hashable, allocate: Callable[[], Any], run: Callable[[Any], None]) -> Recorded:
    """The graph of ``run(state)`` on ``model`` for ``key``, made at the first call: ``state`` from ``allocate()``
    (zeros, valid to run: recording runs nothing, so warm-up runs it ``WARMUP`` times on a side stream first)."""
    weights = tuple(p.data_ptr() for p in model.parameters())
    with _GRAPHS_LOCK:
        recorded_for, graphs = _GRAPHS.get(model, (weights, {}))
        if recorded_for != weights:
            graphs = {}
        _GRAPHS[model] = (weights, graphs)
        if key in graphs:
            return graphs[key]
        state = allocate()
        with torch.cuda.device(next(model.parameters()).device):  # the model's GPU, whichever is current
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP):
                    run(state)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run(state)
        graphs[key] = Recorded(state, graph, threading.Lock())
        return graphs[key]
