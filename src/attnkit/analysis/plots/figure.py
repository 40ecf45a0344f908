"""What every figure shares: the file formats, a canvas without pyplot state, the atomic save, the sizes.

Figures meant to be read at the width a Markdown page shows them (``DOC_WIDTH_PX``, about GitHub's column) are no
wider than that at ``DPI``, so they are not scaled down, and their text is at least ``MIN_FONT`` points.
"""

from __future__ import annotations

import html
import io
from pathlib import Path

from attnkit.atomic import open_atomic
from attnkit.errors import InputError

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
