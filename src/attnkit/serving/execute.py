"""Running the batcher's batches on a served model (``models.py``): the same function in the batcher's thread and
in the worker process (``worker.py``).

A batch is the jobs of one group, and the group names the model's call and its options (``run_batch`` lists them):
the handlers (``routes.py``) make the groups, the batcher never puts two groups in one batch, and ``run_batch`` turns
one into calls of the model. ``warm_up`` runs, before the first client, the groups that would otherwise make that
client wait.
"""

from __future__ import annotations

from typing import Any

from attnkit.inference.background import compiling_here
from attnkit.serving.batcher import padding_bounded
from attnkit.serving.models import ServedModel

DEFAULT_BEAM = 4  # a translation request's beam unless it names one (§6.1 used 4)


def warm_up(served: ServedModel) -> None:
    """Run one short input through the model: the first call pays for lazy initialisation, not a client. A
    translator decodes it greedily and with a request's default beam (4): the two searches are different steps,
    each with its own CUDA graph or compiled program to make (``attnkit.inference.programs``)."""
    groups: dict[str, list[tuple]] = {
        "classifier": [("classify",)],
        "embedder": [("embed", "mean", False)],
        "translator": [("translate", beam, 0.6, "gnmt", 1) for beam in (1, DEFAULT_BEAM)],
    }
    with compiling_here():  # a compiled engine's programs for these calls, made now (``TranslatorModel.engine``)
        for group in groups[served.task]:
            run_batch(served, group, [[served.token_ids("hello world")]])


def run_batch(served: ServedModel, group: tuple, jobs: list[list[list[int]]]) -> list[Any]:
    """Run the batcher's ``jobs`` (each a request's encoded inputs) of one ``group`` through ``served``: the group
    names the call and its options (``("classify",)``, ``("embed", pool, normalize)``, ``("translate", beam,
    alpha, length_penalty, n_best)``, ``("attention",)``). Inputs are sorted by length and cut into runs of bounded
    padding; returns each job's outputs in its inputs' order."""
    kind = group[0]
    if kind == "attention":
        return [served.attention(seqs[0]) for seqs in jobs]  # type: ignore[attr-defined]
    flat = [seq for seqs in jobs for seq in seqs]
    order = sorted(range(len(flat)), key=lambda i: len(flat[i]))  # sort by length: little padding
    sorted_seqs = [flat[i] for i in order]
    outs: list[Any] = []
    for part in padding_bounded(sorted_seqs):
        if kind == "classify":
            outs += served.classify(part)  # type: ignore[attr-defined]
        elif kind == "embed":
            outs += served.embed(part, pool=group[1], normalize=group[2])  # type: ignore[attr-defined]
        else:
            _, beam, alpha, penalty, n_best = group
            outs += served.translate(part, beam=beam, alpha=alpha, length_penalty=penalty, n_best=n_best)  # type: ignore[attr-defined]
    by_input: list[object] = [None] * len(flat)
    for i, out in zip(order, outs):
        by_input[i] = out
    results, start = [], 0
    for seqs in jobs:
        results.append(by_input[start : start + len(seqs)])
        start += len(seqs)
    return results
