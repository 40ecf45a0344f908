"""Training curves of a run: training loss, validation loss, scores and learning rate against step.

The training loss is what the optimiser minimised, label-smoothed when epsilon_ls > 0 (§5.4): it has a floor above
zero (``smoothed_loss_floor``, drawn as a dashed line) and is not comparable with an unsmoothed validation loss, which
gets a panel of its own.
"""

from __future__ import annotations

import math
from pathlib import Path

from attnkit.analysis.plots.figure import DOC_WIDTH_PX, DPI, MIN_FONT, new_figure, save_figure
from attnkit.errors import InputError
from attnkit.training.schedules import resolved_schedule


def smoothed_loss_floor(epsilon: float, n_outputs: int) -> float:
    """The lowest label-smoothed cross-entropy a model can reach: the entropy of the smoothed target.

    ``F.cross_entropy(label_smoothing=epsilon)`` trains towards q = (1 - epsilon) on the true class plus epsilon / V
    on every class (§5.4's epsilon_ls), so the loss it reports is at least H(q) > 0, whereas an unsmoothed
    validation loss can approach 0. With epsilon 0.1 and V = 8,000 the floor is about 1.22 nats.
    """
    if not 0.0 < epsilon < 1.0 or n_outputs < 2:
        return 0.0
    other = epsilon / n_outputs
    true = 1.0 - epsilon + other
    return -(true * math.log(true) + (n_outputs - 1) * other * math.log(other))


def curves_figure(metrics: list[dict], title: str = "training curves", config: dict | None = None):
    """The figure of ``plot_curves`` (a matplotlib Figure), for tests and scripts that add to it."""
    steps = [r for r in metrics if "loss" in r and "lr" in r]
    evals = [r for r in metrics if any(k in r for k in ("valid_accuracy", "valid_loss", "valid_bleu"))]
    if not steps:
        raise InputError("the metrics log has no training steps to plot")
    train_cfg = (config or {}).get("train", {})
    model_cfg = (config or {}).get("model", {})
    epsilon = float(train_cfg.get("label_smoothing", 0.0) or 0.0)
    n_outputs = int(model_cfg.get("n_classes") or model_cfg.get("vocab_size") or 0)
    has_valid_loss = any("valid_loss" in r for r in evals)
    # A translator's loss is a mean over target tokens, a classifier's over sentences (its config has n_classes).
    unit = "nats per sentence" if "n_classes" in model_cfg else "nats per token" if model_cfg else "nats"

    fig = new_figure(DOC_WIDTH_PX / DPI, 3.4 if not has_valid_loss else 3.6)
    axes = list(fig.subplots(1, 4 if has_valid_loss else 3))
    train_ax = axes.pop(0)
    valid_loss_ax = axes.pop(0) if has_valid_loss else None
    score_ax, lr_ax = axes

    # The training loss is what the optimiser minimised: label-smoothed when epsilon_ls > 0 (§5.4), so it has a
    # floor above zero and is not comparable with an unsmoothed validation loss; they get separate panels.
    train_ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], linewidth=0.6, alpha=0.7)
    if epsilon:
        floor = smoothed_loss_floor(epsilon, n_outputs) if n_outputs else 0.0
        if floor:
            train_ax.axhline(
                floor, color="k", linestyle="--", linewidth=1, label=f"floor {floor:.2f} ({n_outputs:,} outputs)"
            )
            train_ax.legend(fontsize=MIN_FONT, loc="best")
        train_ax.set_title(f"training loss\n(label-smoothed, ε_ls={epsilon:g})", fontsize=9)
    else:
        train_ax.set_title("training loss\n(cross-entropy)", fontsize=9)
    train_ax.set(xlabel="step", ylabel=unit)
    train_ax.set_ylim(bottom=0)
    if valid_loss_ax is not None:
        points = [(r["step"], r["valid_loss"]) for r in evals if "valid_loss" in r]
        valid_loss_ax.plot(*zip(*points), marker="o", color="C1")
        valid_loss_ax.set_title("validation loss\n(no smoothing)", fontsize=9)
        valid_loss_ax.set(xlabel="step", ylabel=unit)
        valid_loss_ax.set_ylim(bottom=0)

    for key, label in (
        ("valid_accuracy", "valid accuracy"),
        ("train_accuracy", "train accuracy"),
        ("valid_bleu", "valid BLEU (greedy)"),
        ("valid_chrf", "valid chrF"),
    ):
        points = [(r["step"], r[key]) for r in evals if key in r]
        if points:
            score_ax.plot(*zip(*points), marker="o", label=label)
    score_ax.set_title("scores at each\nevaluation", fontsize=9)
    score_ax.set(xlabel="step")
    if score_ax.lines:
        score_ax.legend(fontsize=MIN_FONT)

    lr_ax.plot([r["step"] for r in steps], [r["lr"] for r in steps])
    schedule = train_cfg.get("schedule")
    if schedule:  # "auto" as the run followed it
        schedule = resolved_schedule(schedule, int(train_cfg.get("max_steps") or 0))
    names = {"noam": "eq. 3 (noam)", "linear": "linear warmup + decay", "constant": "warmup, then constant"}
    optimizer = {"adam": "Adam", "adamw": "AdamW"}.get(train_cfg.get("optimizer", ""), "")
    lr_title = "learning rate" + (f" ({optimizer})" if optimizer else "")
    lr_ax.set_title(lr_title + (f"\n{names.get(schedule, schedule)}" if schedule else ""), fontsize=9)
    lr_ax.set(xlabel="step")
    lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    for ax in fig.axes:
        ax.tick_params(labelsize=MIN_FONT)
    fig.suptitle(title, fontsize=10)
    return fig


def plot_curves(
    metrics: list[dict], out: str | Path, title: str = "training curves", config: dict | None = None
) -> Path:
    """Training loss, validation loss (translator), accuracy or BLEU, and learning rate against step.

    ``metrics`` are the rows of a run's metrics log; ``config`` is the run's ``config.json`` (optional): with it
    the figure names the schedule and optimizer and draws the floor of a label-smoothed training loss.
    """
    return save_figure(curves_figure(metrics, title, config), out, title)
