"""Figures: PNG, SVG, or a self-contained HTML page with the figure inline as SVG, chosen by the file extension.
matplotlib is imported inside each function, on its own Agg canvas (no pyplot state), never at import.

One module per figure, and the two things the figures share:

``figure``: the file formats, the canvas, the atomic save and the width and font sizes every figure keeps to.
``positional``: the sinusoidal positional encoding of §3.5 (``attnkit plot pe``).
``attention``: attention maps as a grid of layers x heads (``attnkit plot attention``).
``curves``: training curves from a run's metrics log (``attnkit plot curves``).
``fonts``: the fonts that draw token labels in Korean, Chinese or Japanese, and the characters none of them has.

Import each name from its module; this package re-exports nothing.
"""
