"""Figures: PNG, SVG, or a self-contained HTML page with the figure inline as SVG, chosen by the file extension.
matplotlib is imported inside each function, on its own Agg canvas (no pyplot state), never at import.

§3.5 chooses sinusoids because "for any fixed offset k, PE_{pos+k} can be represented as a linear function of
PE_pos". One visible consequence: PE(pos) . PE(pos + k) = sum_i cos(w_i k), with w_i = 10000^(-2i/d_model), depends
on the offset k and not on pos. ``plot_positional_encoding`` draws the table and that dot product.
"""

from __future__ import annotations

import html
import io
from pathlib import Path

import torch
from torch import Tensor

from attnkit.atomic import open_atomic
from attnkit.errors import InputError
from attnkit.model.positional import sinusoidal_table


FORMATS = (".png", ".svg", ".html")


def check_format(out: str | Path) -> Path:
    out = Path(out)
    if out.suffix.lower() not in FORMATS:
        raise InputError(f"{out}: unsupported figure format {out.suffix or '(none)'}; use one of {', '.join(FORMATS)}")
    return out


def new_figure(width: float, height: float):
    """A matplotlib Figure on its own Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, out: str | Path, title: str = "attnkit") -> Path:
    """Write ``fig`` atomically as PNG, SVG or an HTML page with the SVG inline (no external files, no scripts)."""
    out = check_format(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    suffix = out.suffix.lower()
    with open_atomic(out) as f:
        if suffix == ".html":
            buffer = io.StringIO()
            fig.savefig(buffer, format="svg")
            svg = buffer.getvalue()
            svg = svg[svg.index("<svg"):]  # drop the XML prolog: the SVG is inline
            page = (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title></head>"
                    f"<body style=\"margin:0\">\n{svg}\n</body></html>\n")
            f.write(page.encode("utf-8"))
        else:
            fig.savefig(f, format=suffix[1:], dpi=100)
    return out


def offset_similarity(table: Tensor, positions: list[int], max_offset: int) -> Tensor:
    """PE(pos) . PE(pos + k) for each ``pos`` in ``positions`` and k = 0 .. max_offset: (len(positions), K + 1).

    For even d_model every row is the same, sum_i cos(w_i k); an odd d_model leaves one sine without its cosine.
    """
    return torch.stack([table[pos : pos + max_offset + 1] @ table[pos] for pos in positions])  # (P, K + 1)


def plot_positional_encoding(d_model: int, max_len: int, out: Path) -> Path:
    """Write a PNG of the sinusoidal table (positions on x, dimensions on y) and of PE(pos) . PE(pos + k) against k.

    The file is written atomically (a temporary file in the same directory, then ``os.replace``). Returns ``out``.
    """
    if d_model < 1 or max_len < 1:
        raise ValueError(f"d_model={d_model} and max_len={max_len} must both be positive")
    out = check_format(out)
    table = sinusoidal_table(max_len, d_model)  # (max_len, D)
    positions = sorted({0, max_len // 4, max_len // 2})
    max_offset = max_len - 1 - positions[-1]
    similarity = offset_similarity(table, positions, max_offset)  # (P, K + 1)

    fig = new_figure(12, 4.5)
    heat_ax, dot_ax = fig.subplots(1, 2, width_ratios=(3, 2))

    limit = float(table.abs().max())
    mesh = heat_ax.pcolormesh(table.T.numpy(), cmap="RdBu", vmin=-limit, vmax=limit)  # (D, max_len): dims on y
    fig.colorbar(mesh, ax=heat_ax)
    heat_ax.set_xlabel("Token position")
    heat_ax.set_ylabel("Dimension")
    heat_ax.set_title(f"Sinusoidal positional encoding (§3.5), d_model={d_model}, max_len={max_len}")

    offsets = range(max_offset + 1)
    # The curves coincide; different dashes keep each one visible on top of the others.
    for (pos, row), style, width in zip(zip(positions, similarity), ("-", "--", ":"), (3.0, 2.0, 1.5)):
        dot_ax.plot(offsets, row.numpy(), linestyle=style, linewidth=width, label=f"pos = {pos}")
    dot_ax.set_xlabel("Offset k")
    dot_ax.set_ylabel("PE(pos) · PE(pos + k)")
    dot_ax.set_title("Similarity depends on the offset k only (§3.5)")
    dot_ax.legend()

    save_figure(fig, out)
    return out


def plot_curves(metrics: list[dict], out: str | Path, title: str = "training curves") -> Path:
    """Loss, accuracy or BLEU, and learning rate against step, from a run's metrics log rows."""
    steps = [r for r in metrics if "loss" in r and "lr" in r]
    evals = [r for r in metrics if any(k in r for k in ("valid_accuracy", "valid_loss", "valid_bleu"))]
    if not steps:
        raise InputError("the metrics log has no training steps to plot")
    fig = new_figure(13, 3.8)
    loss_ax, score_ax, lr_ax = fig.subplots(1, 3)
    loss_ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], linewidth=0.6, alpha=0.6, label="train (per step)")
    if any("valid_loss" in r for r in evals):
        loss_ax.plot([r["step"] for r in evals if "valid_loss" in r], [r["valid_loss"] for r in evals if "valid_loss" in r],
                     marker="o", label="valid")
    loss_ax.set(xlabel="step", ylabel="loss", title="loss")
    loss_ax.legend()
    for key, label in (("valid_accuracy", "valid accuracy"), ("train_accuracy", "train accuracy"),
                       ("valid_bleu", "valid BLEU (greedy)"), ("valid_chrf", "valid chrF")):
        points = [(r["step"], r[key]) for r in evals if key in r]
        if points:
            score_ax.plot(*zip(*points), marker="o", label=label)
    score_ax.set(xlabel="step", title="validation")
    if score_ax.lines:
        score_ax.legend()
    lr_ax.plot([r["step"] for r in steps], [r["lr"] for r in steps])
    lr_ax.set(xlabel="step", ylabel="learning rate", title="schedule")
    fig.suptitle(title)
    return save_figure(fig, out, title)


MAX_CELLS = 160  # longest side of an attention map as drawn; longer inputs are average-pooled down to it


def downsample(weights: Tensor, labels_q: list[str], labels_k: list[str]) -> tuple[Tensor, list[str], list[str]]:
    """Pool a (T, S) map into at most MAX_CELLS x MAX_CELLS disjoint blocks, thinning the labels to match.

    Keys are summed within a block and queries averaged, so every pooled row still sums to 1: a pooled cell is the
    attention a block of queries pays, on average, to a block of keys.
    """
    T, S = weights.shape
    t, s = min(T, MAX_CELLS), min(S, MAX_CELLS)
    if (t, s) == (T, S):
        return weights, labels_q, labels_k
    q_bin = torch.arange(T) * t // T  # (T,) block of each query
    k_bin = torch.arange(S) * s // S  # (S,) block of each key
    by_key = torch.zeros(T, s).index_add_(1, k_bin, weights)  # (T, s): summed over each key block
    pooled = torch.zeros(t, s).index_add_(0, q_bin, by_key) / torch.bincount(q_bin, minlength=t)[:, None]  # (t, s)

    def thin(labels: list[str], bins: Tensor, n: int) -> list[str]:
        first = [labels[int((bins == b).nonzero()[0])] for b in range(n)]
        return [label if b % max(1, n // 20) == 0 else "" for b, label in enumerate(first)]

    return pooled, thin(labels_q, q_bin, t), thin(labels_k, k_bin, s)


def plot_attention_grid(maps: dict[int, Tensor], labels_q: list[str], labels_k: list[str], out: str | Path,
                        *, heads: list[int] | None = None, title: str = "attention") -> Path:
    """A grid of layers (rows) x heads (columns); each panel one (T, S) map with token labels on both axes."""
    layers = sorted(maps)
    n_heads = next(iter(maps.values())).size(0)
    heads = heads if heads is not None else list(range(n_heads))
    size = 3.2 if max(len(labels_q), len(labels_k)) <= 40 else 4.2
    fig = new_figure(size * len(heads) + 1, size * len(layers) + 0.6)
    axes = fig.subplots(len(layers), len(heads), squeeze=False)
    for row, layer in enumerate(layers):
        for col, head in enumerate(heads):
            weights, q, k = downsample(maps[layer][head].float(), labels_q, labels_k)
            ax = axes[row][col]
            ax.imshow(weights.numpy(), cmap="viridis", vmin=0.0, aspect="auto", interpolation="nearest")
            ax.set_title(f"layer {layer} head {head}", fontsize=9)
            ax.set_xticks(range(len(k)), k, rotation=90, fontsize=6)
            ax.set_yticks(range(len(q)), q, fontsize=6)
            ax.tick_params(length=0)
    fig.suptitle(title)
    return save_figure(fig, out, title)
