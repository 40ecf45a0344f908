"""Looking inside a model without training it.

``params``: parameter accounting. Every parameter of a classifier or an encoder-decoder is assigned to exactly one
row (embedding, positions, attention, LayerNorm, FFN, head, output projection), each row carrying the count read
from the module and the closed form of §3 evaluated from the module's dimensions; closed-form totals for a config.

``plots``: figures as PNG, SVG or HTML files, one module each (the sinusoidal positional encoding of §3.5,
attention maps, training curves) beside what they share (formats, canvas, sizes, fonts). Plotting imports matplotlib
lazily, so importing this package never needs it.
"""
