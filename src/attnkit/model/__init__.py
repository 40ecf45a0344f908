"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), written out module by module.

Read it in dependency order: ``masking`` (the one mask convention), ``attention`` (§3.2), ``positional`` (§3.5),
``layers`` (§3.1, §3.3: the feed-forward network, the residual sub-layer, encoder and decoder layers),
``transformer`` (§3.4: embeddings, the encoder and decoder stacks, the encoder-decoder), ``classifier`` (an encoder
with a pooling head), and ``build`` (the only place where a config becomes modules: the containers receive their
sub-modules built). The inference engine (fused projections, int8, compiled decoding steps) is not here: it lives
in ``attnkit.inference`` and swaps modules from outside.

Shape legend used in every docstring and shape comment:
    B batch, S source length, T target length, D d_model, H heads, Dh head dim, F d_ff, V vocab, C classes.

Mask convention (everywhere in the package): a boolean tensor, True = "may attend", broadcastable to
(B, H, T, S). A query row whose keys are all masked gets zeros, never NaN.
"""
