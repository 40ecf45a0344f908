"""`--set tensorboard=true` mirrors the metrics log into TensorBoard event files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnkit.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "seed000_train.tsv"


def test_tensorboard_scalars_match_the_metrics_log(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    assert (
        main(
            [
                "classify",
                "train",
                "--train",
                str(EXAMPLES),
                "--out",
                str(run),
                "--epochs",
                "2",
                "--quiet",
                "--set",
                "tensorboard=true",
                "d_model=16",
                "n_heads=2",
                "d_ff=32",
                "n_layers=1",
            ]
        )
        == 0
    )
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    logged = events.Scalars("loss")
    assert [e.step for e in logged] == [r["step"] for r in steps]
    assert [round(e.value, 5) for e in logged] == [round(r["loss"], 5) for r in steps]
    assert len(events.Scalars("epoch/valid_accuracy")) == 2
    assert "tensorboard" not in json.loads((run / "manifest.json").read_text())["sha256"]
