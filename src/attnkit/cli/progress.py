"""One progress display for the training of every task: the typed events of ``attnkit.training.loop`` on stderr, a
tqdm bar over the planned steps and one line per evaluation, resume, skipped batch and warning."""

from __future__ import annotations

import sys
from typing import Any

from attnkit.training.events import Evaluated, Event, Planned, Prepared, Resumed, Skipped, Step, Warned


class TrainingProgress:
    """Call it with each event (``on_event=progress``); ``close()`` when training returns. ``quiet`` drops the bar,
    the plan and the evaluations, and keeps what the user must see: the data, resumes, skipped batches, warnings."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.bar: Any = None  # a tqdm bar while steps run

    def __call__(self, event: Event) -> None:
        if isinstance(event, Warned):
            self._line(f"warning: {event.message}", always=True)
        elif isinstance(event, Prepared):
            labels = f", labels {event.labels}" if event.labels else ""
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
            )
            if not self.quiet:
                from tqdm import tqdm

                self.bar = tqdm(
                    total=event.total_steps, initial=event.start_step, desc="train", file=sys.stderr, dynamic_ncols=True
                )
        elif isinstance(event, Step):
            if self.bar is not None:
                self.bar.update(1)
                shown = {
                    "loss": f"{event.running_loss:.4f}",
                    **{k[:3]: f"{v:.3f}" for k, v in event.running.items()},
                    "lr": f"{event.lr:.2e}",
                    "epoch": f"{event.epoch_progress:.2f}",
                }
                self.bar.set_postfix(shown, refresh=False)
        elif isinstance(event, Evaluated):
            train = "".join(f"  train {k} {v:.3f}" for k, v in event.train.items())
            valid = "".join(f"  valid {k} {v:.4f}" for k, v in event.metrics.items())
            self._line(
                f"epoch {event.epoch:g}  step {event.step}  train loss {event.train_loss:.4f}{train}{valid}"
                f"{'  *' if event.best else ''}"
            )
        elif isinstance(event, Resumed):
            self._line(f"resuming at step {event.step} (epoch {event.epoch}) from the run's saved state", always=True)
        elif isinstance(event, Skipped):
            self._line(f"skipped a batch: {event.message}", always=True)

    def _line(self, text: str, always: bool = False) -> None:
        if self.quiet and not always:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
