"""attnkit translators as CTranslate2 models: the conversion, ``attnkit export ct2`` and ``--engine ct2``.

CTranslate2 (``ctranslate2``, an optional dependency) runs Transformer inference in C++. Its converters fill a
``ctranslate2.specs.TransformerSpec`` with weights and save it. One module per step, each reading the one before:

``convert``: ``attnkit_to_ct2`` fills the same specification from an ``attnkit.model.transformer.Transformer``
(benchmarks compare the two engines on the same weights); the map of every attnkit tensor to its place there.
``export``: ``export_ct2`` turns a translator run directory into a deployable CTranslate2 model directory (the
conversion saved with its tokenizer and what attnkit adds, ``attnkit_ct2.json``).
``translator``: ``CT2Translator`` translates text with such a directory, tokenized and detokenized by attnkit's own
tokenizer, with attnkit's decoding conventions.

Import each name from its module; this package re-exports nothing, and importing it never imports ``ctranslate2``.
"""
