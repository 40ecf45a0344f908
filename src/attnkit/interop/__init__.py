"""Weights and masks in and out of attnkit, at the package boundary.

``torch_nn`` copies weights between attnkit modules and PyTorch's reference ``torch.nn`` modules
(``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``, ``nn.TransformerDecoderLayer``, ``nn.Transformer``) and
converts masks between attnkit's convention (boolean, True = may attend) and PyTorch's opposite one (True or -inf =
masked out). Tests use it to check the model against an independent implementation; benchmarks use it to time a
``torch.nn`` peer that holds the same weights.

``bert`` loads Hugging Face BERT-format folders into attnkit's own encoder and writes them back; ``ct2`` converts a
translator to CTranslate2 and runs it; ``onnx_export`` exports a classifier to ONNX, which ``onnx_check`` checks
with onnxruntime; ``pickle_import`` reads a PyTorch pickle, only when the user says they trust it.
"""
