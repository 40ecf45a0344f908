"""Rebuild the figures of docs/guide.md, README.md and the ablation reports with attnkit itself.

    python docs/make_figures.py                                        # what needs no trained run
    python docs/make_figures.py --classifier RUN_DIR --translator RUN_DIR
    python docs/make_figures.py --translator-ko RUN_DIR                # the En->Ko Bible translator's map

Without runs: the parameter tables (docs/figures/*.txt), the positional-encoding figure, the Figure 1 map of
module names (figure1.svg and .png), and the two ablation charts, redrawn from the tables in docs/ablation-*.md
(the runs' ablation.json files are not in the repository; the tables hold every value the charts show).
With runs (the README's commands: the RT-polarity classifier, `runs/rt-polarity`, and the Bible translator,
`runs/bible-en-de`): the attention maps and the training curves. With ``--translator-ko`` (the guide's En->Ko run,
`runs/bible-en-ko`): its cross-attention map for John 1:1; the Hangul labels need a font that has them (Debian:
fonts-nanum; see ``attnkit.analysis.plots.fonts.CJK_FONTS``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from pathlib import Path

from attnkit.cli import main

DOCS = Path(__file__).resolve().parent
FIGURES = DOCS / "figures"

# The classifier's sentence, and the translator's: the first two clauses of John 1:1 (World English Bible, the test
# book), with the same clauses of the reference (Schlachter 1951, the first line of the test split).
CLASSIFIER_TEXT = "an utterly gorgeous , moving film that never lets go"
TRANSLATOR_TEXT = "In the beginning was the Word, and the Word was with God."
TRANSLATOR_REFERENCE = "Im Anfang war das Wort, und das Wort war bei Gott"
# The En->Ko translator's sentence: all of John 1:1, and its reference (Korean Revised Version, the first line of the
# en-ko test split).
TRANSLATOR_KO_TEXT = "In the beginning was the Word, and the Word was with God, and the Word was God."
TRANSLATOR_KO_REFERENCE = "태초에 말씀이 계시니라 이 말씀이 하나님과 함께 계셨으니 이 말씀은 곧 하나님이시니라"


def run(*argv: str) -> str:
    """Run one attnkit command; stop on failure; return what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    if code != 0:
        raise SystemExit(f"attnkit {' '.join(argv)} failed with exit code {code}")
    return out.getvalue()


# ---------------------------------------------------------------------------------------------------------------
# Figure 1 of the paper, with attnkit's module names


def figure1(out_stem: Path) -> list[Path]:
    """The paper's Figure 1 as boxes that carry the names of attnkit's modules (src/attnkit/model/), bottom to top."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    from attnkit.analysis.plots.figure import new_figure, save_figure

    fig = new_figure(9.2, 9.6)
    fig.set_layout_engine("none")  # one axes filling the figure: nothing to lay out
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 92)
    ax.set_ylim(0, 96)
    ax.axis("off")

    def box(x, y, w, h, text, color, size=8.5, weight="normal"):
        ax.add_patch(
            FancyBboxPatch(
                (x - w / 2, y - h / 2),
                w,
                h,
                boxstyle="round,pad=0.3,rounding_size=0.8",
                facecolor=color,
                edgecolor="#333",
                linewidth=1,
            )
        )
        ax.text(x, y, text, ha="center", va="center", fontsize=size, weight=weight, linespacing=1.25)

    def frame(x0, y0, x1, y1, stack, layer, path):
        ax.add_patch(
            FancyBboxPatch(
                (x0, y0),
                x1 - x0,
                y1 - y0,
                boxstyle="round,pad=0.4,rounding_size=1.5",
                facecolor="#f4f4f4",
                edgecolor="#666",
                linewidth=1.2,
                linestyle="--",
            )
        )
        # Left of the residual stream's arrow, which leaves the frame at its top centre.
        ax.text(x0 + 0.8, y1 - 0.6, stack, ha="left", va="top", fontsize=8.5, style="italic")
        ax.text(x0 + 0.8, y1 - 3.0, f"N × {layer}", ha="left", va="top", fontsize=8.5, weight="bold")
        ax.text(x0 + 0.8, y1 - 5.4, path, ha="left", va="top", fontsize=8.5)

    def arrow(x0, y0, x1, y1, text="", style="-|>", **kw):
        ax.add_patch(
            FancyArrowPatch((x0, y0), (x1, y1), arrowstyle=style, mutation_scale=11, color="#333", linewidth=1.1, **kw)
        )
        if text:
            ax.text((x0 + x1) / 2 + 0.8, (y0 + y1) / 2, text, fontsize=8, ha="left", va="center", color="#333")

    attn, ffn, norm, emb, out_c = "#fde3b8", "#cfe8fc", "#fbf6c4", "#f9d0d0", "#d9f2d0"
    ex, dx, w = 22, 66, 30  # encoder column, decoder column, box width

    ax.text(
        46,
        94.5,
        "Figure 1 of the paper, with attnkit's module names (src/attnkit/model/)",
        ha="center",
        fontsize=10.5,
        weight="bold",
    )
    ax.text(
        2,
        91.5,
        "post-LN, as in §3.1. A box reads:\nclass (attribute path inside Transformer)",
        ha="left",
        va="top",
        fontsize=8.5,
    )

    # Encoder side, bottom to top.
    ax.text(ex, 3, "src (B, S) token ids", ha="center", fontsize=8.5)
    arrow(ex, 4.5, ex, 7.5)
    box(
        ex,
        11,
        w,
        6,
        "Embeddings (embeddings)\ntoken(ids) · √d_model + position(...)\nSinusoidalPositionalEncoding; dropout",
        emb,
    )
    arrow(ex, 14.5, ex, 19.5)
    frame(ex - w / 2 - 2, 18.5, ex + w / 2 + 2, 58, "Encoder (encoder)", "EncoderLayer", "(encoder.layers[i])")
    box(ex, 24.5, w - 2, 5.5, "MultiHeadAttention (self_attn)\nmask: masking.padding_mask", attn)
    box(ex, 31.5, w - 2, 3.4, "Add & LayerNorm (norm1)", norm)
    box(ex, 39, w - 2, 5.5, "PositionwiseFeedForward (ffn)\nmax(0, xW₁ + b₁)W₂ + b₂", ffn)
    box(ex, 46, w - 2, 3.4, "Add & LayerNorm (norm2)", norm)
    for y0, y1 in ((27.3, 29.8), (33.2, 36.2), (41.8, 44.3)):
        arrow(ex, y0, ex, y1)
    arrow(ex, 47.7, ex, 58.3, style="-")
    arrow(ex, 58.3, ex, 64)
    ax.text(ex + 3, 65.5, "memory (B, S, D)", ha="left", fontsize=8.5, weight="bold")

    # Decoder side, bottom to top.
    ax.text(dx, 3, "tgt_in (B, T): BOS y₁ … y_{T-1}\n(outputs shifted right)", ha="center", fontsize=8.5)
    arrow(dx, 5.5, dx, 7.5)
    box(dx, 11, w, 6, "Embeddings (embeddings)\nthe same module as the encoder's:\none shared token matrix (§3.4)", emb)
    arrow(dx, 14.5, dx, 19.5)
    frame(dx - w / 2 - 2, 18.5, dx + w / 2 + 2, 73, "Decoder (decoder)", "DecoderLayer", "(decoder.layers[i])")
    box(
        dx,
        24.5,
        w - 2,
        5.5,
        "MultiHeadAttention (self_attn)\nmask: masking.decoder_self_mask\n(causal and padding)",
        attn,
    )
    box(dx, 31.5, w - 2, 3.4, "Add & LayerNorm (norm1)", norm)
    box(dx, 39, w - 2, 5.5, "MultiHeadAttention (cross_attn)\nqueries: decoder; keys, values: memory", attn)
    box(dx, 46, w - 2, 3.4, "Add & LayerNorm (norm2)", norm)
    box(dx, 53.5, w - 2, 5.5, "PositionwiseFeedForward (ffn)", ffn)
    box(dx, 60.5, w - 2, 3.4, "Add & LayerNorm (norm3)", norm)
    for y0, y1 in ((27.3, 29.8), (33.2, 36.2), (41.8, 44.3), (47.7, 50.7), (56.3, 58.8)):
        arrow(dx, y0, dx, y1)
    arrow(dx, 62.2, dx, 73.3, style="-")
    arrow(dx, 73.3, dx, 77)
    box(dx, 80, w, 5, "Linear: Transformer.logits\nweight = embeddings.token.weight (tied, §3.4)", out_c)
    arrow(dx, 82.5, dx, 84.5)
    box(dx, 86.5, w, 3.4, "softmax: in sequence_loss, or in decoding", out_c)
    arrow(dx, 88.2, dx, 90.2)
    ax.text(dx, 90.6, "output probabilities (B, T, V)", ha="center", va="bottom", fontsize=8.5)

    # memory -> every decoder layer's cross-attention (keys and values), once per sentence when decoding.
    arrow(ex + 14, 65.5, dx - w / 2 + 1, 39, text="", connectionstyle="arc3,rad=-0.25")
    ax.text(
        1.5,
        66.3,
        "memory gives the keys and values\nof every cross_attn (when decoding:\ncomputed once per sentence)",
        fontsize=8,
        ha="left",
        va="top",
    )

    ax.text(
        2,
        76,
        "Transformer (model/transformer.py)\n= embeddings + encoder + decoder\n"
        "+ logits; forward(src, tgt_in)\nis the teacher-forced pass",
        fontsize=8.5,
        va="top",
    )
    ax.text(
        2,
        84,
        "Residual + dropout around every\nsub-layer (§5.4): x = norm(x + dropout(sublayer(x)))",
        fontsize=8,
        va="top",
        color="#444",
    )

    paths = []
    for suffix in (".svg", ".png"):
        paths.append(save_figure(fig, out_stem.with_suffix(suffix), "Figure 1 in attnkit"))
    return paths


# ---------------------------------------------------------------------------------------------------------------
# Ablation charts from the reports' tables


def ablation_table(markdown: Path, task: str):
    """The variants of the table in an ablation report (``| row | variant | params | valid ... |``)."""
    from attnkit.analysis.ablation import Variant

    variants = []
    for line in markdown.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 5 or not re.fullmatch(r"[\d.]+M", cells[2]):
            continue
        name, params, valid = cells[1], float(cells[2][:-1]) * 1e6, float(cells[3])
        bleu = float(cells[4]) if task == "translate" else None
        variants.append(Variant(name, {} if name == "base" else dict([name.split("=", 1)]), int(params), valid, bleu))
    if not variants or variants[0].name != "base":
        raise SystemExit(f"{markdown}: no ablation table found")
    return variants


def main_script() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classifier", type=Path, help="RT-polarity classifier run (runs/rt-polarity)")
    parser.add_argument("--translator", type=Path, help="Bible translator run (runs/bible-en-de)")
    parser.add_argument("--translator-ko", type=Path, help="En->Ko Bible translator run (runs/bible-en-ko)")
    args = parser.parse_args()
    FIGURES.mkdir(exist_ok=True)

    from attnkit.analysis.ablation import plot_ablation

    # The table without its first line, the memory this machine has (docs/params.md quotes the rest).
    table = run("params", "--task", "classify", "--preset", "seed001").split("\n", 1)[1]
    (FIGURES / "params_seed001.txt").write_text(table)
    table = run("params", "--task", "translate", "--preset", "base", "--set", "vocab_size=37000").split("\n", 1)[1]
    (FIGURES / "params_base.txt").write_text(table)
    run("plot", "pe", "--d-model", "128", "--max-len", "100", "--out", str(FIGURES / "pe.png"))
    figure1(FIGURES / "figure1")
    # RT polarity: 1,057 validation sentences (the error bars); Bible: perplexity, no error bars.
    plot_ablation(ablation_table(DOCS / "ablation-rt.md", "classify"), "classify", FIGURES / "ablation-rt.png", 1057)
    plot_ablation(ablation_table(DOCS / "ablation-bible.md", "translate"), "translate", FIGURES / "ablation-bible.png")

    if args.classifier:
        run(
            "plot",
            "attention",
            "--model",
            str(args.classifier),
            "--out",
            str(FIGURES / "attention_classifier.png"),
            CLASSIFIER_TEXT,
        )
        curves(args.classifier, FIGURES / "curves_classifier.png")
    if args.translator:
        translator_attention(args.translator, FIGURES / "attention_translator.png")
        curves(args.translator, FIGURES / "curves_translator.png")
    if args.translator_ko:
        translator_attention(
            args.translator_ko,
            FIGURES / "attention_translator_ko.png",
            TRANSLATOR_KO_TEXT,
            TRANSLATOR_KO_REFERENCE,
            "Korean Revised Version, John 1:1",
        )


def curves(run_dir: Path, out: Path) -> None:
    """``attnkit plot curves``, with the run's config so that the figure names its schedule, optimizer and the
    floor of a label-smoothed loss."""
    import json

    from attnkit.analysis.plots.curves import plot_curves

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    config = json.loads((run_dir / "config.json").read_text())
    plot_curves(rows, out, title=f"training curves, {run_dir.name}", config=config)


def translator_attention(
    run_dir: Path,
    out: Path,
    text: str = TRANSLATOR_TEXT,
    reference: str = TRANSLATOR_REFERENCE,
    reference_name: str = "Schlachter 1951, John 1:1",
) -> None:
    """Cross-attention of the translator's greedy output, with the output and the reference printed under it."""
    from attnkit.analysis.attention import attention_for_text
    from attnkit.analysis.plots.attention import plot_attention_grid

    captured = attention_for_text(run_dir, text, [2])
    output = "".join(captured.query_tokens[:-1]).replace("▁", " ").strip()  # the tokens without </s>
    verdict = (
        "matches the reference"
        if output.rstrip(".,;") == reference
        else "differs from the reference: a wrong translation"
    )
    caption = f"model output (greedy): {output}\nreference ({reference_name}): {reference}\nthe output {verdict}"
    plot_attention_grid(
        captured.maps,
        captured.query_tokens,
        captured.key_tokens,
        out,
        caption=caption,
        title=f"cross-attention of {run_dir.name}, layer 2",
        query_label="query (row): output token",
        key_label="key (column): source token",
    )


if __name__ == "__main__":
    main_script()
