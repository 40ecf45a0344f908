"""The one error type that means "the user gave us something we cannot use", and the check of a model's texts.

The CLI turns it into a single ``error: <message>`` line on stderr and exit code 2, so its message must name
the file and line, or the config key, that is at fault. Anything else that escapes is a bug (exit code 1).
"""

from collections.abc import Iterable


class InputError(ValueError):
    """Bad input from the user: a file, a row, a config value, a run directory."""


class NonFiniteError(RuntimeError):
    """Training produced NaN or infinity. The message names the step and the module where it first appeared; the
    CLI prints it as one ``error:`` line (exit code 1: the input was readable, the training diverged)."""


def check_texts(texts: Iterable[str], each: str = "input text #{}") -> list[str]:
    """``texts`` as the list of non-empty strings a model reads, else an ``InputError`` naming the first bad one
    (``each`` formatted with its number, counted from 1). One string is refused, not read as a list of its
    characters."""
    if isinstance(texts, str):
        raise InputError(f"expected a list of texts, got one string ({texts[:40]!r}): pass [text]")
    listed: list[str] = list(texts)
    for i, text in enumerate(listed, start=1):
        if not isinstance(text, str):
            raise InputError(f"{each.format(i)} is of type {type(text).__name__}, not a string")
        if not text.strip():
            raise InputError(f"{each.format(i)} is empty")
    return listed
