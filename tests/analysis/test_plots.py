"""The positional-encoding figure: a real PNG written atomically, and the §3.5 offset property it shows."""

from __future__ import annotations

import struct

import pytest
import torch

from attnkit.analysis.plots.positional import offset_similarity, plot_positional_encoding
from attnkit.model.positional import sinusoidal_table

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_writes_a_png_and_leaves_no_temporary_files(tmp_path):
    out = tmp_path / "figures" / "pe.png"
    assert plot_positional_encoding(32, 400, out) == out
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert width > height > 0  # two panels side by side
    assert [p.name for p in out.parent.iterdir()] == ["pe.png"]


def test_replaces_an_existing_file(tmp_path):
    out = tmp_path / "pe.png"
    out.write_bytes(b"stale")
    plot_positional_encoding(8, 20, out)
    assert out.read_bytes().startswith(PNG_SIGNATURE)
    assert [p.name for p in tmp_path.iterdir()] == ["pe.png"]


def test_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    def fail(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", fail)
    with pytest.raises(OSError, match="disk full"):
        plot_positional_encoding(8, 20, tmp_path / "pe.png")
    assert list(tmp_path.iterdir()) == []


def test_rejects_empty_tables(tmp_path):
    with pytest.raises(ValueError, match="d_model=0"):
        plot_positional_encoding(0, 10, tmp_path / "pe.png")


def test_dot_product_depends_on_the_offset_only():
    # §3.5: PE(pos) . PE(pos + k) = sum_i cos(w_i k), whatever pos is.
    d_model, max_len = 32, 200
    table = sinusoidal_table(max_len, d_model)
    similarity = offset_similarity(table, [0, 50, 100], max_offset=99)  # (3, 100)
    freqs = 1.0 / torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (D / 2,)
    expected = torch.cos(torch.arange(100, dtype=torch.float64)[:, None] * freqs).sum(dim=1).float()  # (100,)
    for row in similarity:
        torch.testing.assert_close(row, expected, atol=1e-4, rtol=1e-5)
    assert similarity[0, 0] == pytest.approx(d_model / 2)


# ---------------------------------------------------------------------------------------------------------------
# Figures a reader can read: one colour scale, axis meaning, legible labels, losses that can be compared


def _maps():
    torch.manual_seed(0)
    sharp = torch.full((5, 5), -9.0).fill_diagonal_(9.0).softmax(-1)  # (5, 5): weights near 1
    flat = torch.zeros(5, 5).softmax(-1)  # (5, 5): every weight 0.2
    return {0: torch.stack([sharp, flat]), 1: torch.stack([flat, flat])}  # layer -> (H, T, S)


def test_attention_panels_share_one_colour_scale_with_a_colour_bar():
    from attnkit.analysis.plots.attention import attention_figure

    tokens = ["a", "b", "c", "d", "e"]
    fig = attention_figure(_maps(), tokens, tokens)
    images = [image for ax in fig.axes for image in ax.get_images()]
    assert len(images) == 4
    # Per-panel scaling would give the flat panels vmax = 0.2 and draw them as bright as the sharp one.
    assert len({image.get_clim() for image in images}) == 1
    assert images[0].get_clim() == (0.0, pytest.approx(float(_maps()[0].max())))
    colour_bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(colour_bars) == 1


def test_attention_figure_says_rows_are_queries_and_columns_keys():
    from attnkit.analysis.plots.attention import attention_figure

    fig = attention_figure(_maps(), list("abcde"), list("abcde"), caption="output differs from the reference")
    assert "query" in fig.get_supylabel() and "row" in fig.get_supylabel()
    assert "key" in fig.get_supxlabel() and "column" in fig.get_supxlabel()
    assert "differs from the reference" in fig.get_supxlabel()


def test_attention_labels_are_legible_at_the_readme_width():
    from attnkit.analysis.plots.attention import attention_figure
    from attnkit.analysis.plots.figure import DOC_WIDTH_PX, DPI, MIN_FONT

    tokens = [f"tok{i}" for i in range(18)]
    maps = {layer: torch.rand(8, 18, 18).softmax(-1) for layer in range(2)}  # 16 panels
    fig = attention_figure(maps, tokens, tokens)
    assert fig.get_figwidth() * DPI <= DOC_WIDTH_PX  # shown unscaled
    labels = [t for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text()]
    assert labels and min(t.get_fontsize() for t in labels) >= MIN_FONT
    # Enough room per label: each token gets at least 11 points of its axis (8-point text does not overlap).
    ax = fig.axes[0]
    fig.canvas.draw()  # run the layout
    box = ax.get_position()  # figure fraction
    assert box.height * fig.get_figheight() * 72 / 18 >= 10.5
    assert box.width * fig.get_figwidth() * 72 / 18 >= 10.5


def test_label_smoothed_loss_floor_is_the_least_cross_entropy_can_reach():
    import torch.nn.functional as F

    from attnkit.analysis.plots.curves import smoothed_loss_floor

    epsilon, V = 0.1, 8000
    target = torch.tensor([3])
    q = torch.full((1, V), epsilon / V, dtype=torch.float64)
    q[0, 3] += 1 - epsilon  # the smoothed target distribution F.cross_entropy trains towards
    best = F.cross_entropy(q.log(), target, label_smoothing=epsilon)  # logits = log q: the optimum
    assert smoothed_loss_floor(epsilon, V) == pytest.approx(float(best), rel=1e-5)
    assert smoothed_loss_floor(epsilon, V) == pytest.approx(1.224, abs=1e-3)  # the "about 1.2 nats"
    worse = F.cross_entropy(torch.randn(1, V, dtype=torch.float64), target, label_smoothing=epsilon)
    assert float(worse) > smoothed_loss_floor(epsilon, V)
    assert smoothed_loss_floor(0.0, V) == 0.0


def _metrics():
    rows = [{"step": s, "loss": 8.0 / s + 1.3, "lr": 1e-3 * min(s / 3, (10 - s) / 7)} for s in range(1, 10)]
    return rows + [{"step": 5, "valid_loss": 2.0, "valid_bleu": 3.0}, {"step": 9, "valid_loss": 1.5, "valid_bleu": 5.0}]


def test_curves_keep_smoothed_training_loss_and_validation_loss_apart():
    from attnkit.analysis.plots.curves import curves_figure, smoothed_loss_floor

    config = {
        "model": {"vocab_size": 8000},
        "train": {"label_smoothing": 0.1, "schedule": "linear", "optimizer": "adam"},
    }
    fig = curves_figure(_metrics(), config=config)
    train_ax = next(ax for ax in fig.axes if "training loss" in ax.get_title())
    valid_ax = next(ax for ax in fig.axes if "validation loss" in ax.get_title())
    assert train_ax is not valid_ax
    assert "label-smoothed" in train_ax.get_title() and "no smoothing" in valid_ax.get_title()
    floors = [line for line in train_ax.get_lines() if line.get_linestyle() == "--"]
    assert len(floors) == 1 and floors[0].get_ydata()[0] == pytest.approx(smoothed_loss_floor(0.1, 8000))
    assert train_ax.get_ylim()[0] == 0 and valid_ax.get_ylim()[0] == 0
    lr_ax = next(ax for ax in fig.axes if "learning rate" in ax.get_title())
    assert "linear" in lr_ax.get_title() and "Adam" in lr_ax.get_title()


def test_curves_without_config_say_nothing_they_do_not_know():
    from attnkit.analysis.plots.curves import curves_figure

    fig = curves_figure(_metrics())
    titles = [ax.get_title() for ax in fig.axes]
    assert not any("smoothed" in t for t in titles if "validation" not in t)
    assert "learning rate" in titles


def test_svg_is_the_same_bytes_every_time(tmp_path):
    # Committed figures (docs/figures/*.svg) should change only when the figure does: no date, no random ids.
    first, second = tmp_path / "a.svg", tmp_path / "b.svg"
    plot_positional_encoding(8, 20, first)
    plot_positional_encoding(8, 20, second)
    assert first.read_bytes() == second.read_bytes()


def test_pe_table_is_an_image_inside_an_svg(tmp_path):
    """The heatmap's cells are one embedded image, not a vector path each: 128 x 400 cells made a 10 MB SVG (and
    `plot pe`'s largest table an 800 MB one, after three minutes)."""
    out = tmp_path / "pe.svg"
    plot_positional_encoding(128, 400, out)
    svg = out.read_text(encoding="utf-8")
    assert "<image" in svg and len(svg) < 1_000_000


def test_korean_token_labels_are_drawn_from_a_font_with_hangul():
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    from attnkit.analysis.plots.attention import attention_figure
    from attnkit.analysis.plots.fonts import font_families

    fonts = font_families()
    assert fonts[0] == "DejaVu Sans"  # Latin labels look as before
    tokens = ["▁태초에", "▁말씀", "이", "▁계시", "</s>"]
    fig = attention_figure(_maps(), tokens, tokens, caption="model output: 태초에 말씀이")
    panels = [ax for ax in fig.axes if ax.get_images() and ax.get_label() != "<colorbar>"]
    labels = [t for ax in panels for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text()]
    assert labels and all(t.get_fontfamily() == fonts for t in labels)
    assert fig._supxlabel.get_fontfamily() == fonts
    if len(fonts) == 1:
        pytest.skip("no font with Hangul installed (e.g. Debian's fonts-nanum); labels would draw as boxes")
    # The fallback font really has the glyphs: DejaVu Sans has none of them.
    charmap = FT2Font(font_manager.findfont(font_manager.FontProperties(family=fonts[1]))).get_charmap()
    dejavu = FT2Font(font_manager.findfont(font_manager.FontProperties(family="DejaVu Sans"))).get_charmap()
    hangul = [ord(c) for c in "태초말씀이계시"]
    assert all(code in charmap for code in hangul)
    assert not any(code in dejavu for code in hangul)


@pytest.mark.parametrize("max_steps, named", [(0, "eq. 3 (noam)"), (4700, "linear warmup + decay")])
def test_curves_name_the_schedule_auto_resolved_to(max_steps, named):
    # A translator's default schedule is "auto", which the figure printed as is; the run followed noam or linear.
    from attnkit.analysis.plots.curves import curves_figure

    config = {"model": {"vocab_size": 8000}, "train": {"schedule": "auto", "max_steps": max_steps}}
    lr_ax = next(ax for ax in curves_figure(_metrics(), config=config).axes if "learning rate" in ax.get_title())
    assert lr_ax.get_title().endswith(f"\n{named}")
