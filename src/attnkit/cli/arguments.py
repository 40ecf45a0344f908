"""The parser class of the commands, and their argparse value types: counts, thread counts, the length-penalty
exponent, a port. Each type turns a bad value into a usage error naming the flag (one ``error:`` line, exit 2),
before a huge one reaches C code that overflows or allocates without bound."""

from __future__ import annotations

import argparse

from attnkit.errors import InputError


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``error:`` line and exit code 2, like every other bad input; and an
    argument a command does not take is named by that command (argparse leaves it to the top-level parser, which
    names only ``attnkit``), with a hint where the mix-up is a likely one: ``hints``, by the argument's name
    (``--model``) or, for a word without a dash, ``TEXT``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hints: dict[str, str] = {}

    def error(self, message: str) -> None:  # type: ignore[override]
        raise InputError(f"{self.prog}: {message}")

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self._subparsers is None:  # a command, not a group of commands: nothing else will take them
            keys = [extra.split("=", 1)[0] if extra.startswith("-") else "TEXT" for extra in extras]
            hint = next((f" ({self.hints[key]})" for key in keys if key in self.hints), "")
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return namespace, extras


COUNT_CEILING = 2**16  # a count given on the command line (a beam, a batch size): far above any use of it


def positive_int(text: str, *, high: int = COUNT_CEILING) -> int:
    """An argparse type: an integer from 1 to ``high`` (a beam, a batch size); anything else is a usage error naming
    the flag (a huge value would reach C code that overflows or allocates without bound)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    if value > high:
        raise argparse.ArgumentTypeError(f"{value} is over attnkit's ceiling of {high:,}")
    return value


def thread_count(text: str) -> int:
    """An argparse type: a number of CPU threads, 1 to ``attnkit.config.MAX_THREADS``."""
    from attnkit.config import MAX_THREADS

    return positive_int(text, high=MAX_THREADS)


def length_penalty_alpha(text: str) -> float:
    """An argparse type: the length-penalty exponent, a number from 0 to ``MAX_ALPHA`` (the server's bound too)."""
    from attnkit.decoding.penalty import MAX_ALPHA

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= MAX_ALPHA:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text} must be in [0, {MAX_ALPHA:g}]")
    return value


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0 to 65535; 0: any free port)")
    return value
