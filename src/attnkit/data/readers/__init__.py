"""Readers for the plain files a user gives us: labeled examples, texts to predict on, and sentence pairs.

Every reader streams its file through one byte-to-line layer (``lines``) and adds the checks of its format:

- ``lines``: bytes to lines, the checks every format shares: strict UTF-8, line ends, a BOM, errors that name
  file and line; standard input decoded the same way.
- ``labeled``: labeled examples from tables (``.tsv``, ``.csv``) and JSON lines (``.jsonl``).
- ``texts``: texts to predict on (the labeled formats with the label optional, or ``.txt``), and raw text for
  pretraining.
- ``parallel``: sentence pairs, from a ``source<TAB>target`` file or from two files aligned line by line.

Every file is decoded as strict UTF-8 (a leading byte-order mark is dropped), and CRLF or lone CR line ends
count as one line break, so no ``\\r`` reaches a text or a label. Surrounding whitespace is stripped from
every field. Line numbers are 1-based physical lines, the header being line 1; a CSV record that spans
several lines carries the line where it starts.

Anything we cannot use raises ``InputError`` with a message that starts ``"{path}:{line}: "`` (or just
``"{path}: "`` when the file as a whole is at fault), which the CLI prints as is.
"""
