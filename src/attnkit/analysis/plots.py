"""Figures: PNG, SVG, or a self-contained HTML page with the figure inline as SVG, chosen by the file extension.
matplotlib is imported inside each function, on its own Agg canvas (no pyplot state), never at import.

Why one file of ~340 lines: every figure shares the format choice, the canvas without pyplot state and the
width and font rules below; each plot is a short figure builder and the ``plot_*`` function that saves it, and a
reader looking for any figure finds them all here.

§3.5 chooses sinusoids because "for any fixed offset k, PE_{pos+k} can be represented as a linear function of
PE_pos" (a rotation of each (sin, cos) pair by the angle w_i k). The figure cannot draw that reason directly; it
draws one consequence of it: PE(pos) . PE(pos + k) = sum_i cos(w_i k), with w_i = 10000^(-2i/d_model), depends on the
offset k and not on pos. ``plot_positional_encoding`` draws the table and that dot product.

Figures meant to be read at the width a Markdown page shows them (``DOC_WIDTH_PX``, about GitHub's column) are no
wider than that at ``DPI``, so they are not scaled down, and their text is at least ``MIN_FONT`` points.
"""

from __future__ import annotations

import html
import io
import math
import textwrap
import warnings
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from attnkit.atomic import open_atomic
from attnkit.errors import InputError
from attnkit.model.positional import sinusoidal_table

FORMATS = (".png", ".svg", ".html")
DPI = 100
DOC_WIDTH_PX = 920  # the width GitHub's README column shows an image at; wider figures are scaled down
MIN_FONT = 8.0  # points: 11 px at DPI 100, the smallest text a figure shows


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
    import matplotlib

    # The same figure gives the same bytes: no date in SVG metadata, fixed ids (committed figures diff cleanly).
    metadata = {"Date": None} if suffix in (".svg", ".html") else None
    with open_atomic(out) as f, matplotlib.rc_context({"svg.hashsalt": "attnkit"}):
        if suffix == ".html":
            buffer = io.StringIO()
            fig.savefig(buffer, format="svg", metadata=metadata)
            svg = buffer.getvalue()
            svg = svg[svg.index("<svg") :]  # drop the XML prolog: the SVG is inline
            page = (
                f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>'
                f'<body style="margin:0">\n{svg}\n</body></html>\n'
            )
            f.write(page.encode("utf-8"))
        else:
            fig.savefig(f, format=suffix[1:], dpi=DPI, metadata=metadata)
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

    fig = new_figure(DOC_WIDTH_PX / DPI, 3.8)
    heat_ax, dot_ax = fig.subplots(1, 2, width_ratios=(5, 4))

    limit = float(table.abs().max())
    # Rasterized: in an SVG or HTML page each cell was a vector path of ~200 bytes (the default table 2.5 MB, the
    # largest `plot pe` allows 800 MB after three minutes); as an image inside the SVG, 0.1-0.3 MB.
    mesh = heat_ax.pcolormesh(  # (D, max_len): dims on y
        table.T.numpy(), cmap="RdBu", vmin=-limit, vmax=limit, rasterized=True
    )
    bar = fig.colorbar(mesh, ax=heat_ax)
    bar.set_label("PE value", fontsize=MIN_FONT)
    heat_ax.set_xlabel("token position pos", fontsize=9)
    heat_ax.set_ylabel("dimension (2i: sin, 2i+1: cos)", fontsize=9)
    heat_ax.set_title(f"PE table (§3.5), d_model={d_model}", fontsize=9)

    offsets = range(max_offset + 1)
    # The curves coincide; different dashes keep each one visible on top of the others.
    for (pos, row), style, width in zip(zip(positions, similarity), ("-", "--", ":"), (3.0, 2.0, 1.5)):
        dot_ax.plot(offsets, row.numpy(), linestyle=style, linewidth=width, label=f"pos = {pos}")
    dot_ax.set_xlabel("offset k", fontsize=9)
    dot_ax.set_ylabel("PE(pos) · PE(pos + k)", fontsize=9)
    # A consequence of §3.5's reason (PE(pos + k) is a linear function of PE(pos)), not the reason itself.
    dot_ax.set_title("PE(pos)·PE(pos+k): a function of k alone\n(a consequence of §3.5's reason)", fontsize=9)
    dot_ax.legend(fontsize=MIN_FONT)
    for ax in (heat_ax, dot_ax, bar.ax):
        ax.tick_params(labelsize=MIN_FONT)

    save_figure(fig, out)
    return out


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


# Fonts with Hangul (and other CJK) glyphs, tried after DejaVu Sans, matplotlib's default, which has none: without
# one a Korean token label draws as empty boxes. Any one installed is enough (Debian: fonts-nanum, fonts-noto-cjk);
# matplotlib only reads a font installed after its font cache was built once that cache is deleted.
CJK_FONTS = ("NanumGothic", "Noto Sans CJK KR", "Noto Sans KR", "Noto Sans CJK JP", "UnDotum", "Baekmuk Gulim")


def label_fonts() -> list[str]:
    """DejaVu Sans, then the first installed font of ``CJK_FONTS``, if any: matplotlib takes each glyph from the
    first font of the list that has it, so Latin labels keep DejaVu Sans and Hangul comes from the second."""
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    return ["DejaVu Sans", *[name for name in CJK_FONTS if name in installed][:1]]


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

    fonts = label_fonts()  # tokens and the caption may be Korean
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
    Token labels are drawn in DejaVu Sans, then in the first installed font of ``FALLBACK_FONTS`` that has the
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


# Fonts with Hangul, Han and kana, tried in this order after DejaVu Sans (which has none) where installed: a
# translator's Korean, Chinese or Japanese tokens are otherwise drawn as boxes.
FALLBACK_FONTS = (
    "Noto Sans CJK KR",
    "Noto Sans CJK JP",
    "Noto Sans KR",
    "NanumGothic",
    "Source Han Sans K",
    "Malgun Gothic",
    "Apple SD Gothic Neo",
    "WenQuanYi Zen Hei",
    "Droid Sans Fallback",
)


def font_families() -> list[str]:
    """DejaVu Sans, then the installed ``FALLBACK_FONTS`` (matplotlib falls back glyph by glyph along the list, and
    logs a warning for a family that is not installed, hence only those)."""
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    return ["DejaVu Sans", *(name for name in FALLBACK_FONTS if name in installed)]


def missing_glyphs(texts: Iterable[str]) -> list[str]:
    """The characters of ``texts`` (whitespace aside) that none of ``font_families()`` can draw, in code-point
    order."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    wanted = {char for text in texts for char in text if not char.isspace()}
    for family in font_families():
        path = font_manager.findfont(font_manager.FontProperties(family=family), fallback_to_default=False)
        wanted -= {chr(point) for point in FT2Font(path).get_charmap()}
    return sorted(wanted)
