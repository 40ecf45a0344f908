"""The ``attnkit`` command: argument parsing only. Each command group is one module here (``classify``,
``translate``, ``pretrain``, ``runs`` for average and convert, ``ablate``, ``params``, ``plot``, ``data``, ``embed``,
``bench``, ``export``; ``common`` holds what they share); each command parses, validates, calls one library function
and prints its result. The library does the work and never prints. Library imports happen inside the ``cmd_``
functions, so that parsing arguments (and ``--help``) does not import torch.

Exit codes: 0 success; 2 bad usage or bad input, with one ``error:`` line on stderr naming the file and line or
the key at fault; 1 a training that diverged (one ``error:`` line) or anything unexpected (a bug: the traceback is
shown); 130 Ctrl-C and 143 SIGTERM (a train command then says what its run directory keeps); 141 a training whose
output pipe closed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator

from attnkit.cli import ablate, bench, classify, data, embed, export, params, plot, pretrain, runs, serve, translate
from attnkit.cli.arguments import Parser
from attnkit.errors import InputError, NonFiniteError


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="attnkit", description="The Transformer of 'Attention Is All You Need', from scratch.")
    parser.add_argument("--version", action="version", version=f"attnkit {__import__('attnkit').__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    # The order here is the order of `attnkit --help`.
    classify.add_commands(commands)
    translate.add_commands(commands)
    pretrain.add_commands(commands)
    runs.add_average_command(commands)
    ablate.add_commands(commands)
    runs.add_convert_command(commands)
    params.add_commands(commands)
    plot.add_commands(commands)
    data.add_commands(commands)
    embed.add_commands(commands)
    bench.add_commands(commands)
    export.add_commands(commands)
    serve.add_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = None
    try:
        argv = sys.argv[1:] if argv is None else argv
        check_utf8(argv)
        args = build_parser().parse_args(argv)
        from attnkit.allocator import tune_malloc

        tune_malloc()  # keep freed tensor buffers in the process (glibc; attnkit.allocator)
        library_notes()
        if getattr(args, "needs_torch", True):  # `data prepare` never loads a model: it runs without torch
            from attnkit.compat import check_torch

            check_torch()  # before anything is loaded: older torch has known weights_only unpickler holes
        with terminated_as_interrupted(training=getattr(args, "resume", None) is not None):
            args.func(args)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`attnkit ... | head`): nothing more to say, but a training it
        return 141 if getattr(args, "resume", None) is not None else 0  # stopped did not finish (128 + SIGPIPE)
    except OSError as err:  # a full disk, a read-only directory: the user's environment, not a bug
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}", file=sys.stderr)
        return 2
    except NonFiniteError as err:  # training diverged: say where, without a traceback
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as stop:
        if os.environ.get("RANK", "0") != "0":  # under torchrun every rank is stopped: rank 0 alone says so, as it
            return 143 if isinstance(stop, Terminated) else 130  # alone reports (it wrote the run directory)
        print(f"error: {'terminated' if isinstance(stop, Terminated) else 'interrupted'}", file=sys.stderr)
        note_what_is_kept(args)
        return 143 if isinstance(stop, Terminated) else 130
    except RuntimeError as err:
        if not peer_lost(err):
            raise
        # Under torchrun: another rank ended (killed, or refused an input it alone met) or stopped answering, and a
        # collective of this one failed: one line, not gloo's traceback; torchrun stops the rest.
        print(f"error: another process of this run ended or stopped answering ({peer_lost(err)})", file=sys.stderr)
        if os.environ.get("RANK", "0") == "0":
            note_what_is_kept(args)
        return 1
    return 0


def peer_lost(err: RuntimeError) -> str | None:
    """What failed, in a few words, when ``err`` is a collective's failure in a torchrun process (torch's
    DistBackendError; gloo raises a plain RuntimeError naming its transport: "[.../gloo/transport/tcp/pair.cc:537]
    Read error [127.0.0.1]:37261: Connection reset by peer. This is typically ..."); None for any other error."""
    distributed = sys.modules.get("torch.distributed")
    text = str(err).strip()
    if distributed is None or os.environ.get("WORLD_SIZE", "1") == "1":
        return None
    if not isinstance(err, distributed.DistBackendError) and "/gloo/" not in text:
        return None
    first = text.splitlines()[0] if text else type(err).__name__
    return re.sub(r"^\[[^\]]*\]\s*", "", first).split(". ")[0]  # without the source file, the first sentence


def note_what_is_kept(args: argparse.Namespace | None) -> None:
    """After a train command stopped part-way: a ``note:`` of what its run directory keeps (``state.interrupted``)."""
    out = getattr(args, "out", None)
    if out and getattr(args, "resume", None) is not None:  # a train command (the others have no --resume)
        from attnkit.training.state import interrupted

        print(f"note: {interrupted(out)}", file=sys.stderr)


class Terminated(KeyboardInterrupt):
    """SIGTERM during a training (a scheduler's preemption, ``kill``, torchrun stopping the other ranks), raised
    where the process is, as Ctrl-C's KeyboardInterrupt is: the command says what the run directory keeps."""


@contextlib.contextmanager
def terminated_as_interrupted(training: bool) -> Iterator[None]:
    """For a train command (``training``), SIGTERM raises ``Terminated`` while the block runs; the handler before
    is restored after. Python's default for SIGTERM ends the process without a word (exit 143)."""
    if not training or threading.current_thread() is not threading.main_thread():  # signals reach the main thread
        yield
        return

    def terminate(signum, frame) -> None:
        raise Terminated

    before = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def library_notes() -> None:
    """What the tasks log at WARNING (``1 of 2 texts truncated to 128 tokens``) as this command's ``note:`` lines on
    stderr, as ``translate run`` words its own; Python's last-resort handler printed them bare. Once a process."""
    logger = logging.getLogger("attnkit.tasks")
    if not any(isinstance(handler, _Notes) for handler in logger.handlers):
        logger.addHandler(_Notes())


class _Notes(logging.StreamHandler):
    """``note: MESSAGE`` on whatever ``sys.stderr`` is when a line is logged (a test may have replaced it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("note: %(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def check_utf8(argv: list[str]) -> None:
    """Every argument is UTF-8 text (file names included). Python hands the bytes of an argument that are not UTF-8
    over as lone surrogates (surrogateescape), which fail later, wherever the text is printed or tokenized: refused
    here, naming the argument and its bytes."""
    for position, arg in enumerate(argv, start=1):
        surrogates = {c for c in arg if "\ud800" <= c <= "\udfff"}
        if surrogates:
            shown = "".join(f"\\x{ord(c) & 0xFF:02x}" if c in surrogates else c for c in arg)
            bad = " ".join(f"{ord(c) & 0xFF:02x}" for c in arg if c in surrogates)
            raise InputError(f"argument {position} ({shown}) is not valid UTF-8 (bytes {bad}); arguments must be UTF-8")
