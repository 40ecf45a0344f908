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


@pytest.mark.filterwarnings("error")
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
    # Before minutes of training, the runs to come are announced; then one line as each ends.
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"ablate: 3 runs to train one after another into {out} (base, d_ff=64, positional=learned)"
    # The data's warning (--valid is --train here) as the train commands print it, once: it was a Python warning
    # with its source line, once a variant.
    assert err[1].startswith("warning: valid: 20 of the 20 validation texts (100.0%) are training texts too")
    assert [line.split(":")[0] for line in err[2:]] == ["base", "d_ff=64", "positional=learned"]
    rows = {r["name"]: r for r in json.loads((out / "ablation.json").read_text())["variants"]}
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
    first = (out / "ablation.md").read_text()
    results = json.loads((out / "ablation.json").read_text())
    results["variants"][1]["valid"] = 0.125  # a result the report must now show, without training again
    (out / "ablation.json").write_text(json.dumps(results))
    (out / "base").rename(out / "moved")  # nothing is trained or read from the runs
    # Only --task and --out: no data (it asked for --dataset or --train and --valid, and took the budget and the
    # validation set's size, hence the error bars, from whatever was given) and no --grid.
    report_only = ["ablate", "--task", "classify", "--out", str(out), "--report-only"]
    assert main(report_only) == 0
    table = (out / "ablation.md").read_text()
    assert "| A | n_heads=1 |" in table and "0.1250" in table
    assert table.replace("0.1250", first.split("| A | n_heads=1 | ")[1].split(" | ")[1]) == first  # else the same
    assert "Validation set: 20 examples" in table and not (out / "base").exists()
    assert main([*report_only, "--budget", "one epoch"]) == 0
    assert "Budget: one epoch." in (out / "ablation.md").read_text()
    assert main(["ablate", "--task", "translate", "--out", str(out), "--report-only"]) == 2
    assert "the results of a classify ablation, not translate" in capsys.readouterr().err


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
    from attnkit.analysis.ablation import Variant, plot_ablation
    from attnkit.analysis.plots import figure

    figures = []
    save = figure.save_figure
    monkeypatch.setattr(figure, "save_figure", lambda fig, out, title="": figures.append(fig) or save(fig, out, title))
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


def test_a_variant_given_twice_is_refused():
    """Each variant trains into OUT/<key-value>: one given twice trained twice into the same directory, and the
    report listed it twice."""
    from attnkit.errors import InputError

    with pytest.raises(InputError, match=r"--grid n_heads=1,1: n_heads=1 is given twice"):
        parse_grid(["n_heads=1,1"])
    with pytest.raises(InputError, match=r"--grid n_heads=2,1: n_heads=1 is given twice"):
        parse_grid(["n_heads=1", "n_heads=2,1"])


def test_a_translation_report_without_bleu_has_a_dash(tmp_path):
    """Variants trained with valid_bleu=false have no BLEU: the report ended in a TypeError traceback after every
    variant had trained."""
    from attnkit.analysis.ablation import Variant, write_report

    variants = [Variant("base", {}, 1000, 20.5, None, 60.0), Variant("n_heads=1", {"n_heads": "1"}, 1000, 21.0, None)]
    table, figure = write_report(variants, "translate", "valid_bleu=false", tmp_path)
    lines = table.read_text(encoding="utf-8").splitlines()
    assert "|  | base | 0.00M | 20.50 | - | 1.0 min |" in lines
    assert "| A | n_heads=1 | 0.00M | 21.00 | - | 0.0 min |" in lines
    assert figure.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(("task", "dataset"), [("classify", "bible"), ("translate", "rt-polarity")])
def test_a_recipe_of_another_task_is_refused_before_it_is_fetched(tmp_path, capsys, monkeypatch, task, dataset):
    """`ablate --task classify --dataset bible` fetched the Bible, then failed on its header (the train commands
    refuse a recipe of another task before fetching it)."""
    import attnkit.data.recipes as recipes

    def no_fetch(*args, **kwargs):
        raise AssertionError("fetched a recipe of another task")

    monkeypatch.setattr(recipes, "fetch", no_fetch)
    argv = ["ablate", "--task", task, "--dataset", dataset, "--grid", "n_heads=1", "--out", str(tmp_path / "abl")]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    other = "translate" if task == "classify" else "classify"
    assert line.startswith(f"error: dataset {dataset}: a {other} recipe, not {task} data")
    assert not (tmp_path / "abl").exists()
