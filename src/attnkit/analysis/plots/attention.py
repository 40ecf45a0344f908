"""Attention maps as a figure: a grid of layers x heads, each panel one (T, S) map with token labels.

Rows are queries and columns keys; every panel is drawn on one colour scale. Maps longer than ``MAX_CELLS`` are
average-pooled down to it (``downsample``); token labels are drawn in the fonts of ``attnkit.analysis.plots.fonts``.
"""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import torch
from torch import Tensor

from attnkit.analysis.plots.figure import DOC_WIDTH_PX, DPI, MIN_FONT, new_figure, save_figure
from attnkit.analysis.plots.fonts import font_families

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


MAX_COLUMNS = 4  # panels per row of an attention grid; more heads wrap onto further rows
LABEL_PITCH = 0.16  # inches per token label on an attention map's axes: 11.5 points for 8-point text


def attention_figure(
    maps: dict[int, Tensor],
    labels_q: list[str],
    labels_k: list[str],
    *,
    heads: list[int] | None = None,
    title: str = "attention",
    caption: str = "",
    query_label: str = "query (row): the position that attends",
    key_label: str = "key (column): the position attended to",
):
    """The figure of ``plot_attention_grid``: one panel per (layer, head), all on one colour scale.

    Panels share the scale 0 .. the largest weight shown, so that a bright cell means the same weight in every
    panel (one colour bar for all); rows are queries and columns keys, and each row sums to 1 over the keys
    (softmax, eq. 1). Token labels are drawn on the outer panels only, at ``MIN_FONT`` points, and the figure is
    ``DOC_WIDTH_PX`` wide so a Markdown page shows it unscaled.
    """
    layers = sorted(maps)
    n_heads = next(iter(maps.values())).size(0)
    heads = heads if heads is not None else list(range(n_heads))
    panels = []
    for layer in layers:
        for head in heads:
            weights, q, k = downsample(maps[layer][head].float(), labels_q, labels_k)
            panels.append((layer, head, weights, q, k))
    vmax = max(float(w.max()) for _, _, w, _, _ in panels) or 1.0
    # Each labelled token needs LABEL_PITCH inches of its axis; as many panels per row as then fit the width.
    width = DOC_WIDTH_PX / DPI
    labelled_q = sum(1 for t in panels[0][3] if t)
    labelled_k = sum(1 for t in panels[0][4] if t)
    room = width - 1.5 - 0.07 * max((len(t) for t in labels_q), default=1)  # after labels and the colour bar
    columns = max(1, min(MAX_COLUMNS, len(panels), int(room // max(1.5, labelled_k * LABEL_PITCH))))
    rows = -(-len(panels) // columns)
    panel_height = max(room / columns * 0.8, labelled_q * LABEL_PITCH)
    height = (
        rows * (panel_height + 0.3)
        + 0.6
        + 0.07 * max((len(t) for t in labels_k), default=1)
        + (0.18 * (caption.count("\n") + 1) if caption else 0)
    )

    fonts = font_families()  # tokens and the caption may be Korean
    fig = new_figure(width, height)
    axes = fig.subplots(rows, columns, squeeze=False, sharex=True, sharey=True)
    image = None
    for index, (layer, head, weights, q, k) in enumerate(panels):
        ax = axes[index // columns][index % columns]
        image = ax.imshow(weights.numpy(), cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
        ax.set_title(f"layer {layer}, head {head}", fontsize=9)
        ax.set_xticks(range(len(k)), k, rotation=90, fontsize=MIN_FONT, fontfamily=fonts)
        ax.set_yticks(range(len(q)), q, fontsize=MIN_FONT, fontfamily=fonts)
        ax.tick_params(length=0)
    for index in range(len(panels), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    bar = fig.colorbar(image, ax=axes, shrink=0.9, pad=0.02)
    bar.set_label("attention weight (one scale for all panels)", fontsize=MIN_FONT)
    bar.ax.tick_params(labelsize=MIN_FONT)
    fig.supylabel(query_label, fontsize=9)
    lines = [piece for line in caption.splitlines() for piece in textwrap.wrap(line, 110) or [""]]
    fig.supxlabel("\n".join([key_label, *lines]), fontsize=9, fontfamily=fonts)
    fig.suptitle(title, fontsize=10)
    return fig


def plot_attention_grid(
    maps: dict[int, Tensor],
    labels_q: list[str],
    labels_k: list[str],
    out: str | Path,
    *,
    heads: list[int] | None = None,
    title: str = "attention",
    caption: str = "",
    query_label: str = "query (row): the position that attends",
    key_label: str = "key (column): the position attended to",
) -> Path:
    """A grid of layers x heads; each panel one (T, S) map with token labels, one colour scale for all panels.

    ``caption`` is printed under the grid: the place to say what the model produced and whether it is right.
    Token labels are drawn in DejaVu Sans, then in the first installed font of ``CJK_FONTS`` that has the
    character; ``missing_glyphs`` names the characters that no font here has (drawn as boxes).
    """
    import matplotlib

    # One note from the caller (missing_glyphs) replaces matplotlib's warning per missing character.
    with matplotlib.rc_context({"font.family": font_families()}), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        fig = attention_figure(
            maps,
            labels_q,
            labels_k,
            heads=heads,
            title=title,
            caption=caption,
            query_label=query_label,
            key_label=key_label,
        )
        return save_figure(fig, out, title)
