"""`attnkit ablate`: one run per variant with the same budget, a Table-3-shaped report with counted parameters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnkit.analysis.ablation import parse_grid
from attnkit.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "seed000_train.tsv"


def test_grid_varies_one_setting_at_a_time():
    names = [v.name for v in parse_grid(["n_heads=1,4", "positional=learned"])]
    assert names == ["base", "n_heads=1", "n_heads=4", "positional=learned"]


def test_ablate_writes_a_report_whose_params_match_the_variants(tmp_path, capsys):
    out = tmp_path / "abl"
    code = main(
        [
            "ablate",
            "--task",
            "classify",
            "--train",
            str(EXAMPLES),
            "--valid",
            str(EXAMPLES),
            "--grid",
            "d_ff=64",
            "--grid",
            "positional=learned",
            "--out",
            str(out),
            "--set",
            "d_model=16",
            "n_heads=2",
            "d_ff=32",
            "n_layers=1",
            "epochs=1",
            "min_freq=1",
        ]
    )
    assert code == 0
    rows = {r["name"]: r for r in json.loads((out / "ablation.json").read_text())}
    assert set(rows) == {"base", "d_ff=64", "positional=learned"}
    d, vocab, max_len = 16, rows["base"]["params"], 128
    assert rows["d_ff=64"]["params"] - rows["base"]["params"] == 2 * d * 32 + 32  # FFN: 2*d*d_ff + d_ff grows by 32
    assert rows["positional=learned"]["params"] - vocab == max_len * d  # learned table: max_len * d trainable
    table = (out / "ablation.md").read_text()
    assert "| variant | params | valid accuracy |" in table and "positional=learned" in table
    assert (out / "ablation.png").read_bytes().startswith(b"\x89PNG")


def test_a_bad_variant_is_refused_before_anything_trains(tmp_path, capsys):
    code = main(
        [
            "ablate",
            "--task",
            "classify",
            "--train",
            str(EXAMPLES),
            "--valid",
            str(EXAMPLES),
            "--grid",
            "n_heads=3",
            "--out",
            str(tmp_path / "abl"),
            "--set",
            "d_model=16",
        ]
    )
    assert code == 2
    assert "n_heads=3" in capsys.readouterr().err
    assert not (tmp_path / "abl" / "base").exists()


def test_report_only_rewrites_the_report_from_the_results(tmp_path, capsys):
    out = tmp_path / "abl"
    argv = [
        "ablate",
        "--task",
        "classify",
        "--train",
        str(EXAMPLES),
        "--valid",
        str(EXAMPLES),
        "--grid",
        "n_heads=1",
        "--out",
        str(out),
        "--set",
        "d_model=16",
        "n_heads=2",
        "d_ff=32",
        "n_layers=1",
        "epochs=1",
        "min_freq=1",
    ]
    assert main(argv) == 0
    rows = json.loads((out / "ablation.json").read_text())
    rows[1]["valid"] = 0.125  # a result the report must now show, without training again
    (out / "ablation.json").write_text(json.dumps(rows))
    (out / "base").rename(out / "moved")  # nothing is trained or read from the runs
    assert main([*argv, "--report-only", "--budget", "one epoch"]) == 0
    table = (out / "ablation.md").read_text()
    assert "| A | n_heads=1 |" in table and "0.1250" in table and "Budget: one epoch." in table
    assert "one standard error" in table and not (out / "base").exists()


def test_report_only_without_results_is_an_error(tmp_path, capsys):
    code = main(
        [
            "ablate",
            "--task",
            "classify",
            "--train",
            str(EXAMPLES),
            "--valid",
            str(EXAMPLES),
            "--grid",
            "n_heads=1",
            "--out",
            str(tmp_path),
            "--report-only",
        ]
    )
    assert code == 2
    assert "ablation.json" in capsys.readouterr().err


def test_bar_chart_starts_at_zero_and_shows_the_values(tmp_path, monkeypatch):
    # A y-axis cut just below the lowest bar (it was cut at 0.725) magnifies differences within the noise.
    from attnkit.analysis import plots
    from attnkit.analysis.ablation import Variant, plot_ablation

    figures = []
    save = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, out, title="": figures.append(fig) or save(fig, out, title))
    variants = [
        Variant("base", {}, valid=0.775),
        Variant("n_heads=1", {"n_heads": "1"}, valid=0.765),
        Variant("dropout=0.0", {"dropout": "0.0"}, valid=0.781),
    ]
    plot_ablation(variants, "classify", tmp_path / "a.png", n_valid=1057)
    (ax,) = figures[0].axes
    assert ax.get_ylim()[0] == 0
    assert ax.get_ylim()[1] > 0.781
    assert {t.get_text() for t in ax.texts} >= {"0.775", "0.765", "0.781"}


def test_variant_configs_start_from_the_task_preset_and_apply_the_overrides():
    from attnkit.analysis.ablation import variant_configs
    from attnkit.config import ClassifierConfig, TranslatorConfig
    from attnkit.errors import InputError

    model_cfg, _ = variant_configs("classify", None, {"n_heads": "2", "d_model": "16"})
    assert isinstance(model_cfg, ClassifierConfig) and (model_cfg.n_heads, model_cfg.d_model) == (2, 16)
    model_cfg, _ = variant_configs("translate", None, {})
    small, _ = variant_configs("translate", "small", {})
    assert isinstance(model_cfg, TranslatorConfig) and model_cfg == small
    with pytest.raises(InputError, match="n_heads=3"):
        variant_configs("classify", None, {"d_model": "16", "n_heads": "3"})
