"""The metrics log of a run directory: one JSON object per logged step or epoch (``metrics.jsonl``)."""

from __future__ import annotations

import json
from pathlib import Path

from attnkit.atomic import atomic_write_bytes
from attnkit.errors import InputError
from attnkit.runs.files import METRICS


class MetricsLog:
    """Append-only JSONL log, one object per line, flushed per line so a killed run keeps what it logged.

    ``rows`` counts the rows the file holds. On resume, ``keep_rows`` (the count saved with the training state) cuts
    the log back to the rows written before that state; the rows after it will be logged again.
    With ``tensorboard``, every numeric field is also written as a TensorBoard scalar (tag = field name, x = step)
    to ``RUN/tensorboard``, the convention TensorBoard users already have.
    """

    def __init__(self, path: Path, keep_rows: int | None = None, tensorboard: bool = False):
        self.path = path
        self.rows = 0
        self._writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise InputError(
                    "config key tensorboard=true needs the tensorboard package: pip install tensorboard"
                ) from None
            self._writer = SummaryWriter(log_dir=str(path.parent / "tensorboard"))
        if keep_rows is None:
            path.unlink(missing_ok=True)
        elif path.is_file():
            lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()][:keep_rows]
            atomic_write_bytes(path, "".join(line + "\n" for line in lines).encode("utf-8"))
            self.rows = len(lines)
        self._file = open(path, "a", encoding="utf-8")

    def write(self, row: dict) -> None:
        if self._writer is not None and "step" in row:
            prefix = "epoch/" if "epoch" in row and "valid_accuracy" in row else ""
            for key, value in row.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step", "epoch"):
                    self._writer.add_scalar(prefix + key, value, row["step"])
        try:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
            self.rows += 1
        except OSError as err:
            if err.filename is None and err.errno is not None:  # a full disk names no file: name the log
                raise OSError(err.errno, err.strerror, str(self.path)) from err
            raise

    def close(self) -> None:
        self._file.close()
        if self._writer is not None:
            self._writer.close()


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of a run's metrics.jsonl, in order (blank lines skipped); ``InputError`` naming file:line for a line
    that is not a JSON object, or naming the directory when it has no metrics.jsonl."""
    path = Path(run_dir) / METRICS
    if not path.is_file():
        raise InputError(f"{run_dir}: no {METRICS} (not a training run directory)")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{path}:{number}: not JSON ({err.msg})") from None
            if not isinstance(row, dict):  # each row is an object: a list or a string here broke its readers
                raise InputError(f"{path}:{number}: not a JSON object (a {type(row).__name__})")
            rows.append(row)
    return rows
