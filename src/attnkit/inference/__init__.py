"""The inference engine, kept outside the paper's modules (as gpt-fast keeps ``quantize.py`` beside ``model.py``).

``prepare`` readies a loaded model by swapping modules: a fused self-attention built from a ``MultiHeadAttention``'s
weights (``fused``), int8 linear layers and embeddings (``quantize``). The decoding searches (``attnkit.decoding``)
run their steps through ``programs``: eager, compiled per shape bucket, or replayed as CUDA graphs.
"""

from attnkit.inference.prepare import prepare_for_inference, quantize_for_inference

__all__ = ["prepare_for_inference", "quantize_for_inference"]
