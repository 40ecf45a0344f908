"""The result record (``Result``): one measured figure per row, with what was measured; its JSON line, the table
of a run's rows and the progress line of one row.

``attnkit bench`` prints each row as it arrives, as a progress line (``describe``) or, with ``--json``, as its JSON
(``Result.to_json``: the JSON a run writes, floats rounded to 4 decimals, unmeasured figures ``null``), and the table
of them all at the end (``format_table``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class Result:
    """One measured figure: one implementation, one configuration, one input shape. Unmeasured figures are None."""

    suite: str  # "train", "classify", "decode", "scaling" (the matmul ceiling is reported under the suite's name)
    impl: str  # "attnkit", "torch.nn", "torch.nn (no cache)", "transformers", "ctranslate2", "matmul"
    config: str  # model preset or shape: "small", "base", "seed000", "layer-d256", "2048x2048"
    seq_len: int | None  # source (= target) length, or the sequence length of the encoder layer
    search: str | None  # decode: "greedy" or "beam4"
    dtype: str  # compute type: "float32", "bfloat16", "int8"
    mode: str | None = None  # "train" (forward + backward + Adam step) or "infer" (forward, no gradients)
    variant: str | None = None  # what else distinguishes the row: "padded", "fastpath-off", "dropout=0", ...
    batch: int | None = None  # sentences per call
    tgt_tok_per_s: float | None = None  # target tokens per second (train: teacher-forced; decode: generated)
    sentences_per_s: float | None = None
    ms: float | None = None  # median wall time of one call (one step, one batch), milliseconds
    peak_mib: float | None = None  # peak resident memory added by the call, MiB (see memory.PeakRSS)
    gflop_per_s: float | None = None  # model (or matmul) GFLOP/s
    mfu: float | None = None  # model FLOPs utilisation: gflop_per_s / the ceiling (``ceiling.ceiling_results``)
    threads: int | None = None  # torch.set_num_threads in this process, or the engine's intra-op threads in its own
    reps: int | None = None  # timed repetitions behind the median
    pid: int | None = None  # the process that ran the timed calls (a child process for engines with their own pool)
    settings: str | None = None  # a peer's settings where they are not the defaults ("inter_threads=1, ...")
    first_call_s: float | None = None  # the first call, untimed in the median: compilation or graph recording

    def to_json(self) -> str:
        return json.dumps({k: _rounded(v) for k, v in dataclasses.asdict(self).items()})


def _rounded(value):
    return round(value, 4) if isinstance(value, float) else value


# ---------------------------------------------------------------------------------------------------------------
# The table of a run's rows and the progress line of one


_FIGURES = (
    ("tgt_tok_per_s", "tgt tok/s", "{:,.0f}"),
    ("sentences_per_s", "sent/s", "{:,.1f}"),
    ("ms", "ms", "{:,.1f}"),
    ("peak_mib", "peak MiB", "{:,.1f}"),
    ("gflop_per_s", "GFLOP/s", "{:,.1f}"),
    ("mfu", "MFU", "{:.1%}"),
    ("first_call_s", "first call s", "{:,.2f}"),
)
_KEYS = (
    ("impl", "impl"),
    ("config", "config"),
    ("variant", "variant"),
    ("mode", "mode"),
    ("seq_len", "len"),
    ("search", "search"),
    ("dtype", "dtype"),
    ("batch", "batch"),
)


def format_table(results: Iterable[Result]) -> str:
    """A plain-text table, one row per result; columns that no row fills are left out."""
    results = list(results)
    if not results:
        return "(no results)"
    columns = [(key, title, "{}") for key, title in _KEYS] + list(_FIGURES) + [("settings", "settings", "{}")]
    columns = [c for c in columns if any(getattr(r, c[0]) is not None for r in results)]
    rows = [[title for _, title, _ in columns]]
    for r in results:
        rows.append(["" if getattr(r, key) is None else fmt.format(getattr(r, key)) for key, _, fmt in columns])
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    numeric = [key in _NUMERIC for key, _, _ in columns]
    lines = []
    for j, row in enumerate(rows):
        cells = [cell.rjust(w) if num else cell.ljust(w) for cell, w, num in zip(row, widths, numeric)]
        lines.append("  ".join(cells).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


_NUMERIC = {key for key, _, _ in _FIGURES} | {"seq_len", "batch"}


def describe(result: Result) -> str:
    """One short line for progress output: what was measured and its figures."""
    what = " ".join(
        str(v)
        for v in (
            result.suite,
            result.config,
            result.variant,
            result.mode,
            f"L={result.seq_len}" if result.seq_len else None,
            result.search,
            result.dtype,
            result.impl,
        )
        if v
    )
    figures = [
        f"{fmt.format(getattr(result, key))} {title}"
        for key, title, fmt in _FIGURES
        if getattr(result, key) is not None
    ]
    return f"{what}: {', '.join(figures)}"
