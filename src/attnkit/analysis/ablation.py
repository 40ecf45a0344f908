"""Table 3 of the paper, on your data: train a base model and variants that change one setting each, with the same
budget, data and seed, and report parameters and validation quality side by side.

The paper's rows: (A) number of heads at constant compute, (B) d_k alone, (C) model size, (D) dropout and label
smoothing, (E) learned positional embeddings instead of sinusoids. Each ``--grid key=v1,v2`` line is one such row
group; variants are not crossed with each other, as in the paper.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attnkit.atomic import atomic_write_bytes
from attnkit.errors import InputError
from attnkit.training.events import Event, warn_only

if TYPE_CHECKING:
    import torch


@dataclass
class Variant:
    name: str  # "base", or "key=value"
    overrides: dict[str, str]
    params: int = 0
    valid: float = float("nan")  # validation accuracy (classify) or perplexity (translate)
    bleu: float | None = None
    seconds: float = 0.0


# The rows of the paper's Table 3 that each setting belongs to. B*: row (B) changes d_k alone; ``d_head`` sets
# d_k = d_v, the nearest setting attnkit has (a smaller model in d_v too: the report says so).
TABLE3_ROWS = {
    "n_heads": "A",
    "d_head": "B*",
    "n_layers": "C",
    "d_model": "C",
    "d_ff": "C",
    "dropout": "D",
    "label_smoothing": "D",
    "positional": "E",
}


def table3_row(variant: Variant) -> str:
    keys = list(variant.overrides)
    return TABLE3_ROWS.get(keys[0], "") if len(keys) == 1 else ""


def standard_error(accuracy: float, n: int) -> float:
    """One binomial standard error of an accuracy measured on ``n`` examples: sqrt(p (1 - p) / n)."""
    return math.sqrt(max(accuracy * (1 - accuracy), 0.0) / n) if n else float("nan")


def parse_grid(grid: list[str]) -> list[Variant]:
    """``["n_heads=1,4", "dropout=0.0"]`` -> base + one variant per value."""
    variants = [Variant("base", {})]
    for item in grid:
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise InputError(f"--grid expects key=value1,value2,..., got {item!r}")
        for value in filter(None, values.split(",")):
            name = f"{key}={value}"
            if any(v.name == name for v in variants):  # it would train twice into one directory
                raise InputError(f"--grid {item}: {name} is given twice; each variant is trained once")
            variants.append(Variant(name, {key: value}))
    return variants


def variant_configs(task: str, preset_name: str | None, overrides: dict) -> tuple:
    """(model config, train config) of one variant: the task's preset (classify: ``default``, translate: ``small``,
    unless ``preset_name``) with ``overrides``, checked as for any training run."""
    from attnkit.config import task_configs

    return task_configs(task, preset_name, overrides)


def train_variant(
    task: str,
    preset_name: str | None,
    overrides: dict,
    train: list,
    valid: list,
    out_dir: Path,
    device: torch.device | None = None,
    on_event: Callable[[Event], None] = warn_only,
) -> tuple[int, float, float | None]:
    """Train one variant into ``out_dir`` on ``device`` (default the CPU); return (parameters, validation metric,
    BLEU or None). ``on_event`` hears the training's events (by default a ``Warned`` one is a Python warning).

    The metric is accuracy for ``classify`` and perplexity exp(loss) for ``translate`` (Table 3 reports PPL)."""
    from attnkit import runs
    from attnkit.analysis.params import parameter_table
    from attnkit.config import ClassifierConfig, TranslatorConfig
    from attnkit.model.build import build_classifier, build_translator
    from attnkit.training.task import TrainContext

    context = TrainContext(device or torch.device("cpu"))
    model_cfg, train_cfg = variant_configs(task, preset_name, overrides)
    if task == "classify":
        from attnkit.tasks.classify import train_classifier

        summary = train_classifier(
            train, valid, model_cfg=model_cfg, train_cfg=train_cfg, out_dir=out_dir, context=context, on_event=on_event
        )
        saved = runs.read_json(out_dir / runs.CONFIG)
        params = parameter_table(build_classifier(ClassifierConfig(**saved["model"]))).total
        accuracy = summary.best_valid_accuracy  # None only without validation data, which an ablation has
        return params, float("nan") if accuracy is None else accuracy, None
    from attnkit.tasks.translate import train_translator

    translated = train_translator(
        train, valid, model_cfg=model_cfg, train_cfg=train_cfg, out_dir=out_dir, context=context, on_event=on_event
    )
    saved = runs.read_json(out_dir / runs.CONFIG)
    params = parameter_table(build_translator(TranslatorConfig(**saved["model"]))).total
    if translated.valid_loss is None:
        raise ValueError("an ablation variant needs validation data: its metric is the validation perplexity")
    return params, math.exp(min(translated.valid_loss, 50.0)), translated.valid_bleu


def run_ablation(
    variants: list[Variant],
    train_one: Callable[[Variant, Path], tuple[int, float, float | None]],
    out_dir: Path,
    on_variant: Callable[[Variant], None] = lambda v: None,
) -> list[Variant]:
    """Train every variant into ``out_dir/<name>`` with ``train_one`` -> (params, valid metric, bleu)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for variant in variants:
        start = time.perf_counter()
        variant.params, variant.valid, variant.bleu = train_one(variant, out_dir / variant.name.replace("=", "-"))
        variant.seconds = time.perf_counter() - start
        on_variant(variant)
    return variants


def markdown_table(variants: list[Variant], task: str, budget: str, n_valid: int = 0) -> str:
    """The report: one row per variant, shaped like the paper's Table 3 (its row letter first)."""
    metric = "valid accuracy" if task == "classify" else "valid PPL"
    header = f"| row | variant | params | {metric} |" + (" valid BLEU (greedy) |" if task == "translate" else "")
    header += " train time |"
    rule = "|---|---|---:|---:|" + ("---:|" if task == "translate" else "") + "---:|"
    lines = [
        f"Budget: {budget}. Same data, seed and budget for every row; each row changes one setting of the base.",
        "",
        header,
        rule,
    ]
    for v in variants:
        value = f"{v.valid:.4f}" if task == "classify" else f"{v.valid:.2f}"
        bleu = ""
        if task == "translate":  # no BLEU where the variants trained with valid_bleu=false
            bleu = f" {v.bleu:.2f} |" if v.bleu is not None else " - |"
        row = table3_row(v) if v.name != "base" else ""
        lines.append(f"| {row} | {v.name} | {v.params / 1e6:.2f}M | {value} |{bleu} {v.seconds / 60:.1f} min |")
    if any(table3_row(v) == "B*" for v in variants):
        lines += ["", "B*: d_head sets d_k and d_v together; Table 3's row (B) changes d_k alone (d_v stays 64)."]
    if task == "classify" and n_valid:
        base = variants[0].valid
        lines += [
            "",
            f"Validation set: {n_valid} examples; one standard error of an accuracy near the base's "
            f"{base:.3f} is {standard_error(base, n_valid):.3f} (sqrt(p(1 - p) / n); error bars in the figure).",
        ]
    return "\n".join(lines) + "\n"


def plot_ablation(variants: list[Variant], task: str, out: Path, n_valid: int = 0) -> Path:
    """Bars of the validation figure per variant, from zero (a cut axis would magnify noise), the base's value as a
    dashed line, each bar labelled with its value; one standard error for accuracies."""
    from attnkit.analysis.plots import figure

    fig = figure.new_figure(figure.DOC_WIDTH_PX / figure.DPI, 4)
    ax = fig.subplots()
    values = [v.valid for v in variants]
    errors = [standard_error(x, n_valid) for x in values] if task == "classify" and n_valid else None
    bars = ax.bar(range(len(variants)), values, yerr=errors, capsize=3, color=["#888"] + ["#3a7"] * (len(variants) - 1))
    ax.bar_label(
        bars,
        fmt="%.3f" if task == "classify" else "%.1f",
        fontsize=figure.MIN_FONT,
        padding=2,
        bbox=dict(facecolor="white", edgecolor="none", pad=0.5),
    )
    if variants and math.isfinite(values[0]):
        ax.axhline(values[0], color="k", linestyle="--", linewidth=0.8, label=f"base ({values[0]:.3g})", zorder=0)
        ax.legend(fontsize=figure.MIN_FONT, loc="lower right")
    ax.set_xticks(range(len(variants)), [v.name for v in variants], rotation=35, ha="right", fontsize=figure.MIN_FONT)
    ax.tick_params(axis="y", labelsize=figure.MIN_FONT)
    finite = [x + (e if errors else 0.0) for x, e in zip(values, errors or [0.0] * len(values)) if math.isfinite(x)]
    ax.set_ylim(0, 1.12 * max(finite) if finite else None)  # bars start at zero; room above for the labels
    ax.set_ylabel(
        "validation accuracy" + (" (± 1 s.e.)" if errors else "")
        if task == "classify"
        else "validation perplexity (lower is better)",
        fontsize=9,
    )
    ax.set_title("Variations on the base model (cf. Table 3), one run each", fontsize=10)
    return figure.save_figure(fig, out, "ablation")


def write_report(variants: list[Variant], task: str, budget: str, out_dir: Path, n_valid: int = 0) -> tuple[Path, Path]:
    """``ablation.md`` (the table), ``ablation.json`` (the variants, with what the report needs besides: the task,
    the budget and the size of the validation set) and ``ablation.png`` in ``out_dir``."""
    table = out_dir / "ablation.md"
    atomic_write_bytes(table, markdown_table(variants, task, budget, n_valid).encode("utf-8"))
    results = {
        "task": task,
        "budget": budget,
        "n_valid": n_valid,
        "variants": [dataclasses.asdict(v) for v in variants],
    }
    atomic_write_bytes(out_dir / "ablation.json", (json.dumps(results, indent=2) + "\n").encode("utf-8"))
    return table, plot_ablation(variants, task, out_dir / "ablation.png", n_valid)


@dataclasses.dataclass
class Results:
    """What ``ablation.json`` holds: enough to write the report again without the data (``--report-only``)."""

    variants: list[Variant]
    task: str | None  # None in a file written before the report's inputs were kept (a list of variants alone)
    budget: str | None
    n_valid: int


def read_results(out_dir: Path) -> Results:
    """The results of a finished ablation, from ``out_dir/ablation.json``."""
    path = out_dir / "ablation.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, list):  # written before the task, budget and n_valid were kept
            return Results([Variant(**row) for row in data], None, None, 0)
        variants = [Variant(**row) for row in data["variants"]]
        return Results(variants, data["task"], data["budget"], int(data["n_valid"]))
    except FileNotFoundError:
        raise InputError(f"{path}: no ablation results to report (run the ablation first)") from None
    except (json.JSONDecodeError, TypeError, KeyError, ValueError) as err:
        raise InputError(f"{path}: not an attnkit ablation result ({err})") from None
