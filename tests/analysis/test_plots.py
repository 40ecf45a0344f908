"""The positional-encoding figure: a real PNG written atomically, and the §3.5 offset property it shows."""

from __future__ import annotations

import struct

import pytest
import torch

from attnkit.analysis.plots import offset_similarity, plot_positional_encoding
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
