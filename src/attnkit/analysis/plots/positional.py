"""The sinusoidal positional encoding of §3.5 as a figure: the table, and the dot product its choice implies.

§3.5 chooses sinusoids because "for any fixed offset k, PE_{pos+k} can be represented as a linear function of
PE_pos" (a rotation of each (sin, cos) pair by the angle w_i k). The figure cannot draw that reason directly; it
draws one consequence of it: PE(pos) . PE(pos + k) = sum_i cos(w_i k), with w_i = 10000^(-2i/d_model), depends on the
offset k and not on pos. ``plot_positional_encoding`` draws the table and that dot product.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from attnkit.analysis.plots.figure import DOC_WIDTH_PX, DPI, MIN_FONT, check_format, new_figure, save_figure
from attnkit.model.positional import sinusoidal_table


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
