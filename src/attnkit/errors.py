"""The one error type that means "the user gave us something we cannot use".

The CLI turns it into a single ``error: <message>`` line on stderr and exit code 2, so its message must name
the file and line, or the config key, that is at fault. Anything else that escapes is a bug (exit code 1).
"""


class InputError(ValueError):
    """Bad input from the user: a file, a row, a config value, a run directory."""


class NonFiniteError(RuntimeError):
    """Training produced NaN or infinity. The message names the step and the module where it first appeared; the
    CLI prints it as one ``error:`` line (exit code 1: the input was readable, the training diverged)."""
