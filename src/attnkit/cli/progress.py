"""One progress display for the training of every task: the typed events of ``attnkit.training.loop`` on stderr, a
bar over the planned steps and one line per evaluation, resume, skipped batch and warning.

On a terminal the bar is tqdm's, redrawn in place. Anywhere else (a log file, CI, nohup) a redrawn bar is a stream
of carriage-return frames that a log cannot hold, so the bar becomes plain lines: one at every tenth of the planned
steps and at least one a minute, each with the step, the running loss, the learning rate and the speed.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from attnkit.tasks.classify.data import some_labels
from attnkit.training.events import Evaluated, Event, Planned, Prepared, Resumed, Skipped, Step, Stopped, Warned

LINE_EVERY_SECONDS = 60.0  # without a terminal: a progress line at least this often, whatever the step count
LINES_PER_RUN = 10  # ... and one at each tenth of the planned steps


class TrainingProgress:
    """Call it with each event (``on_event=progress``); ``close()`` when training returns. ``quiet`` drops the bar,
    the plan and the evaluations, and keeps what the user must see: the data, resumes, skipped batches, warnings.
    ``interactive``: draw tqdm's bar (default: when stderr is a terminal), else write plain progress lines.
    ``muted``: nothing at all (the ranks of a torchrun launch but the first, which reports for all of them)."""

    def __init__(self, quiet: bool = False, interactive: bool | None = None, muted: bool = False) -> None:
        self.quiet = quiet
        self.muted = muted
        self.interactive = sys.stderr.isatty() if interactive is None else interactive
        self.bar: Any = None  # a tqdm bar while steps run (on a terminal)
        self.total = 0  # planned steps (without a terminal)
        self.started: tuple[float, int] = (0.0, 0)  # when the steps began, and the step they began from
        self.last_line = 0.0

    def __call__(self, event: Event) -> None:
        if isinstance(event, Warned):
            self._line(f"warning: {event.message}", always=True)
        elif isinstance(event, Prepared):
            labels = f", {len(event.labels)} labels: {some_labels(event.labels)}" if event.labels else ""
            cut = f", {event.truncated} truncated to {event.max_len} tokens" if event.truncated else ""
            self._line(
                f"train {event.n_train} / valid {event.n_valid} ({event.valid_source}), vocabulary "
                f"{event.vocab_size}{labels}{cut}",
                always=True,
            )
        elif isinstance(event, Planned):
            self._line(
                f"{event.total_steps} steps ({event.steps_per_epoch} an epoch), schedule {event.schedule} "
                f"with {event.warmup} warmup steps"
                + ("; each step replayed from CUDA graphs, recorded once per batch shape" if event.graphed else "")
            )
            self.total, self.started = event.total_steps, (time.monotonic(), event.start_step)
            self.last_line = self.started[0]
            if not (self.quiet or self.muted) and self.interactive:
                from tqdm import tqdm

                self.bar = tqdm(
                    total=event.total_steps, initial=event.start_step, desc="train", file=sys.stderr, dynamic_ncols=True
                )
        elif isinstance(event, Step):
            self._step(event)
        elif isinstance(event, Evaluated):
            train = "".join(f"  train {k} {v:.3f}" for k, v in event.train.items())
            valid = "".join(f"  valid {k} {v:.4f}" for k, v in event.metrics.items())
            self._line(
                f"epoch {event.epoch:g}  step {event.step}  train loss {event.train_loss:.4f}{train}{valid}"
                f"{'  *' if event.best else ''}"
            )
        elif isinstance(event, Resumed):
            self._line(
                f"resuming at step {event.step}, in epoch {event.epoch}, from the run's saved state", always=True
            )
        elif isinstance(event, Skipped):
            self._line(f"skipped a batch: {event.message}", always=True)
        elif isinstance(event, Stopped):
            self._line(event.message, always=True)

    def _step(self, event: Step) -> None:
        shown = {
            "loss": f"{event.running_loss:.4f}",
            **{k[:3]: f"{v:.3f}" for k, v in event.running.items()},
            "lr": f"{event.lr:.2e}",
            "epoch": f"{event.epoch_progress:.2f}",
        }
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(shown, refresh=False)
            return
        if self.quiet or self.muted or self.interactive:
            return
        now, total = time.monotonic(), max(1, self.total)
        tenth = LINES_PER_RUN * event.step // total > LINES_PER_RUN * (event.step - 1) // total  # crossed one
        if not (tenth or now - self.last_line >= LINE_EVERY_SECONDS or event.step == self.total):
            return
        self.last_line = now
        start, first_step = self.started
        speed = (event.step - first_step) / max(now - start, 1e-9)
        fields = "  ".join(f"{key} {value}" for key, value in shown.items())
        percent = 100 * event.step // max(1, self.total)
        print(f"step {event.step}/{self.total} ({percent}%)  {fields}  {speed:.2f} steps/s", file=sys.stderr)

    def _line(self, text: str, always: bool = False) -> None:
        if self.muted or (self.quiet and not always):
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
