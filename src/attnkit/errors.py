"""The one error type that means "the user gave us something we cannot use", and the check of a model's texts.

The CLI turns it into a single ``error: <message>`` line on stderr and exit code 2, so its message must name
the file and line, or the config key, that is at fault. Anything else that escapes is a bug (exit code 1).
"""

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TypeVar

T = TypeVar("T")


class InputError(ValueError):
    """Bad input from the user: a file, a row, a config value, a run directory."""


class NonFiniteError(RuntimeError):
    """Training produced NaN or infinity. The message names the step and the module where it first appeared; the
    CLI prints it as one ``error:`` line (exit code 1: the input was readable, the training diverged)."""


def _refuse_non_list(values: object, of: str, *, what: str, one_string: str) -> None:
    """An ``InputError`` unless ``values`` is an iterable other than one string: a string would be read as a list of
    its characters, and None or a number would fail deep inside with a TypeError that names no argument."""
    if isinstance(values, str):
        raise InputError(f"{what}expected a list of {of}, got one string ({values[:40]!r}): {one_string}")
    if isinstance(values, (bytes, Mapping)) or not isinstance(values, Iterable):
        raise InputError(f"{what}expected a list of {of}, got {type(values).__name__}")


def check_texts(texts: Iterable[str], each: str = "input text #{}") -> list[str]:
    """``texts`` as the list of non-empty strings a model reads, else an ``InputError`` naming the first bad one
    (``each`` formatted with its number, counted from 1). One string is refused, not read as a list of its
    characters, and so is anything that is not a list (None, a number)."""
    _refuse_non_list(texts, "texts", what="", one_string="pass [text]")
    listed: list[str] = list(texts)
    for i, text in enumerate(listed, start=1):
        if not isinstance(text, str):
            raise InputError(f"{each.format(i)} is of type {type(text).__name__}, not a string")
        if not text.strip():
            raise InputError(f"{each.format(i)} is empty")
    return listed


def check_records(
    records: Iterable[T], kind: type[T], what: str, *, reader: str, empty_ok: bool = False, file: str | None = None
) -> list[T]:
    """``records`` as a list of ``kind`` (the ``Example`` or ``Pair`` rows that the function ``reader`` reads from a
    file), else an ``InputError`` naming the argument ``what`` and the first item of another type (counted from 1),
    or whose text fields (a dataclass's ``str`` fields: text and label, source and target) are not strings or are
    blank, as ``reader`` refuses them in a file; with ``file`` (where the records were read), such an item's line
    of it too. One string, such as a file's path, is refused, not read as a list of its characters; so is an empty
    list, unless ``empty_ok``."""
    _refuse_non_list(records, f"{kind.__name__}s", what=f"{what}: ", one_string=f"read the file with {reader}(path)")
    listed: list[T] = list(records)
    if not listed and not empty_ok:
        raise InputError(f"{what}: the list is empty; expected {kind.__name__}s ({reader} reads them from a file)")
    for i, record in enumerate(listed, start=1):
        if not isinstance(record, kind):
            raise InputError(
                f"{what} item #{i} is of type {type(record).__name__}, not {kind.__name__} ({reader} reads them "
                "from a file)"
            )
        line = getattr(record, "line", None)
        item = f"{what} item #{i}" + (f" ({file}:{line})" if file not in (None, what) and isinstance(line, int) else "")
        for field in dataclasses.fields(record):  # type: ignore[arg-type]
            value = getattr(record, field.name)
            if field.type not in ("str", str):
                continue
            if not isinstance(value, str):
                raise InputError(
                    f"{item}: its {field.name} is of type {type(value).__name__}, not a string"
                    + (f" (labels are names: str({value!r}))" if field.name == "label" else "")
                )
            if not value.strip():
                raise InputError(f"{item}: empty {field.name}")
    return listed
