"""`attnkit plot attention | curves | pe`: PNG and self-contained HTML, long inputs downsampled, bad input refused."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from attnkit.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "seed000_train.tsv"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("plots") / "run"
    assert (
        main(
            [
                "classify",
                "train",
                "--train",
                str(EXAMPLES),
                "--out",
                str(out),
                "--epochs",
                "2",
                "--quiet",
                "--set",
                "d_model=16",
                "n_heads=2",
                "d_ff=32",
                "n_layers=2",
                "min_freq=1",
            ]
        )
        == 0
    )
    return out


def test_attention_png_and_html(run, tmp_path, capsys):
    assert main(["plot", "attention", "--model", str(run), "--out", str(tmp_path / "a.png"), "a wonderful film"]) == 0
    assert (tmp_path / "a.png").read_bytes().startswith(PNG)
    assert (
        main(
            [
                "plot",
                "attention",
                "--model",
                str(run),
                "--out",
                str(tmp_path / "a.html"),
                "--layer",
                "1",
                "--head",
                "0",
                "a wonderful film",
            ]
        )
        == 0
    )
    page = (tmp_path / "a.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<script" not in page
    assert "wonderful" in page  # token labels are drawn
    # A head named twice is one panel (it drew two).
    once = ["--layer", "1", "--head", "0", "a wonderful film"]
    assert (
        main(["plot", "attention", "--model", str(run), "--out", str(tmp_path / "b.html"), *once, "--head", "0"]) == 0
    )
    assert (tmp_path / "b.html").read_text().count("head 0") == page.count("head 0")


def test_attention_on_a_2000_token_input_is_downsampled(run, tmp_path, capsys):
    """Longer than the model's max_len (sinusoids are extended) and than the drawing (average-pooled)."""
    text = " ".join(["a wonderful film and a dull one"] * 286)  # 2,002 words
    assert main(["plot", "attention", "--model", str(run), "--out", str(tmp_path / "long.png"), text]) == 0
    assert (tmp_path / "long.png").read_bytes().startswith(PNG)
    assert "sinusoids extended" in capsys.readouterr().err


def test_attention_maps_too_large_to_compute_are_one_error_line(run, tmp_path, capsys, monkeypatch):
    """A text whose maps pass ``MAX_WEIGHTS`` (layers x heads x tokens x tokens) is refused before the model runs: a
    20,000-token text made 12 GiB of weights and ended in the allocator's traceback. Lowered here, for speed."""
    import attnkit.analysis.attention as attention

    monkeypatch.setattr(attention, "MAX_WEIGHTS", 2 * 2 * 100 * 100 - 1)  # 2 layers x 2 heads x 100 x 100, less one
    text = " ".join(["film"] * 100)
    out = tmp_path / "a.png"
    assert main(["plot", "attention", "--model", str(run), "--out", str(out), text]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: plot attention: an input of 100 tokens makes 2 layer(s) x 2 heads x 100 x 100")
    assert "--layer" in line and not out.exists()
    # One layer fits: the same text is drawn.
    assert main(["plot", "attention", "--model", str(run), "--out", str(out), "--layer", "1", text]) == 0
    assert out.read_bytes().startswith(PNG)


def test_downsampled_rows_still_sum_to_one():
    import torch

    from attnkit.analysis.plots.attention import MAX_CELLS, downsample

    weights = torch.rand(1000, 700).softmax(-1)
    pooled, q, k = downsample(weights, [str(i) for i in range(1000)], [str(i) for i in range(700)])
    assert pooled.shape == (MAX_CELLS, MAX_CELLS) and len(q) == len(k) == MAX_CELLS
    torch.testing.assert_close(pooled.sum(-1), torch.ones(MAX_CELLS), atol=1e-4, rtol=0)


def test_curves_and_pe(run, tmp_path):
    assert main(["plot", "curves", "--run", str(run), "--out", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes().startswith(PNG)
    assert main(["plot", "pe", "--d-model", "32", "--max-len", "64", "--out", str(tmp_path / "pe.html")]) == 0
    assert "<svg" in (tmp_path / "pe.html").read_text()


@pytest.mark.parametrize(
    "config, says",
    [
        ("[1]", "expected a JSON object ({...}), found a list"),
        ('{"model": {}, "train": 3}', "not a run's config (expected an object with 'model' and 'train' objects)"),
    ],
)
def test_curves_of_a_run_whose_config_is_not_an_object(run, tmp_path, capsys, config, says):
    """config.json names the schedule and draws the loss floor; one that is JSON but not a run's config (edited by
    hand) ended in an AttributeError traceback."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "config.json").write_text(config, encoding="utf-8")
    assert main(["plot", "curves", "--run", str(copy), "--out", str(tmp_path / "c.png")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"error: {copy / 'config.json'}: {says}"
    assert not (tmp_path / "c.png").exists()


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--out", "x.gif"], "unsupported figure format .gif"),
        (["--out", "x.png", "--layer", "7"], "--layer 7"),
        (["--out", "x.png", "--head", "5"], "--head 5"),
    ],
)
def test_bad_plot_requests(run, tmp_path, capsys, argv, fragment):
    argv = [a if a != "x.png" and a != "x.gif" else str(tmp_path / a) for a in argv]
    assert main(["plot", "attention", "--model", str(run), *argv, "a film"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and fragment in err[0]


def test_attention_of_a_pretrained_encoder(tmp_path, capsys):
    """``plot attention`` on a pretrain (masked LM) run draws its encoder's self-attention, as for a classifier (it
    ended in an AttributeError): every row a distribution over the keys."""
    from attnkit.analysis.attention import attention_for_text

    out = tmp_path / "mlm"
    argv = ["pretrain", "--text", str(EXAMPLES), "--out", str(out), "--max-steps", "2", "--quiet", "--set"]
    assert main([*argv, "d_model=16", "n_heads=2", "d_ff=32", "n_layers=2", "min_freq=1"]) == 0
    assert main(["plot", "attention", "--model", str(out), "--out", str(tmp_path / "a.png"), "a wonderful film"]) == 0
    assert (tmp_path / "a.png").read_bytes().startswith(PNG)
    captured = attention_for_text(out, "a wonderful film")
    assert captured.kind == "encoder self-attention" and sorted(captured.maps) == [0, 1]
    for weights in captured.maps.values():  # (H, S, S)
        assert weights.shape[0] == 2 and weights.sum(-1).sub(1).abs().max() < 1e-5


def test_pe_plot_refuses_a_table_no_figure_can_show(tmp_path, capsys):
    assert main(["plot", "pe", "--d-model", "64", "--max-len", "100000000", "--out", str(tmp_path / "p.png")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: plot pe: --d-model 64 x --max-len 100000000 is over 4,194,304 cells")
    assert not (tmp_path / "p.png").exists()


def test_attention_of_a_korean_translator_has_one_warning_for_the_glyphs_no_font_has(tmp_path, capsys):
    # DejaVu Sans has no Hangul: matplotlib warned once per character (dozens of lines for one sentence); installed
    # CJK fonts are now tried after it, and what none of them has is one warning: line.
    from attnkit.analysis.plots.fonts import missing_glyphs

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(
        "태초에 하나님이\tIn the beginning God\n천지를 창조하시니라\tcreated the heavens\n" * 4, encoding="utf-8"
    )
    run = tmp_path / "mt"
    tiny = ["--set", "d_model=16", "n_heads=2", "d_ff=32", "n_layers=1", "vocab_size=300"]
    assert (
        main(["translate", "train", "--train", str(pairs), "--out", str(run), "--max-steps", "1", "--quiet", *tiny])
        == 0
    )
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert (
            main(["plot", "attention", "--model", str(run), "--out", str(tmp_path / "a.png"), "태초에 하나님이"]) == 0
        )
    assert not [w for w in caught if "Glyph" in str(w.message)]
    err = capsys.readouterr().err
    missing = missing_glyphs(["태초에 하나님이"])
    assert err.count("warning:") == (1 if missing else 0)
    if missing:
        assert f"no installed font has {len(missing)} character(s)" in err and "태" in err
