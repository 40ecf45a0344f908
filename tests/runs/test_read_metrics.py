"""``read_metrics``: a run's metrics.jsonl as rows, with bad lines named by file and line."""

from __future__ import annotations

import pytest

from attnkit.errors import InputError
from attnkit.runs import METRICS, read_metrics


def test_rows_in_order_and_blank_lines_skipped(tmp_path):
    (tmp_path / METRICS).write_text('{"step": 1, "loss": 2.5}\n\n{"step": 2, "loss": 2.0}\n', encoding="utf-8")
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.0}]


def test_a_line_that_is_not_json_is_named(tmp_path):
    (tmp_path / METRICS).write_text('{"step": 1}\n\n{"step": 2\n', encoding="utf-8")
    with pytest.raises(InputError, match=rf"{METRICS}:3: not JSON"):
        read_metrics(tmp_path)


def test_a_directory_without_metrics_is_not_a_run(tmp_path):
    with pytest.raises(InputError, match=rf"no {METRICS} \(not a training run directory\)"):
        read_metrics(str(tmp_path))


def test_a_line_that_is_not_an_object_is_named(tmp_path):
    """A JSON list or string is JSON but not a row: ``plot curves`` read ``"loss lr"`` as a row with a loss."""
    (tmp_path / METRICS).write_text('{"step": 1, "loss": 2.5, "lr": 0.1}\n[1, 2]\n"loss lr"\n', encoding="utf-8")
    with pytest.raises(InputError, match=rf"{METRICS}:2: not a JSON object \(a list\)"):
        read_metrics(tmp_path)
