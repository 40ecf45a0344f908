"""Figures written as PNG files. matplotlib is imported inside each function, on the Agg canvas, never at import.

§3.5 chooses sinusoids because "for any fixed offset k, PE_{pos+k} can be represented as a linear function of
PE_pos". One visible consequence: PE(pos) . PE(pos + k) = sum_i cos(w_i k), with w_i = 10000^(-2i/d_model), depends
on the offset k and not on pos. ``plot_positional_encoding`` draws the table and that dot product.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from attnkit.atomic import open_atomic
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
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out)
    table = sinusoidal_table(max_len, d_model)  # (max_len, D)
    positions = sorted({0, max_len // 4, max_len // 2})
    max_offset = max_len - 1 - positions[-1]
    similarity = offset_similarity(table, positions, max_offset)  # (P, K + 1)

    # A figure on its own Agg canvas: no pyplot state, no global backend switch.
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
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

    out.parent.mkdir(parents=True, exist_ok=True)
    with open_atomic(out) as f:
        fig.savefig(f, format="png", dpi=100)
    return out
