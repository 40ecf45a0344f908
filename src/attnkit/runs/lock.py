"""One training at a time in a run directory: a lock on ``RUN/.lock`` held for the whole training.

Two trainings writing into one directory would leave one run's config beside the other's weights, under a manifest
that matches both. The lock is the kernel's (``fcntl.flock`` on the open file), so it goes away with the process
however it ends, a SIGKILL included: a lock file left by a dead process is simply taken over, and said to be. The
file holds who has the lock (process id, host, start time), so that the training refused can name it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from attnkit.errors import InputError
from attnkit.runs.files import LOCK

_held: set[tuple[int, Path]] = set()  # (thread, resolved run directory) of each lock this process holds


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a run directory's lock."""

    pid: int
    host: str
    started: str  # local time, "2026-01-31 14:05:09"

    def __str__(self) -> str:
        return f"process {self.pid} on {self.host}, started {self.started}"


@contextmanager
def run_lock(run_dir: str | Path, on_stale: Callable[[Holder], None] = lambda holder: None) -> Iterator[Path]:
    """Hold the lock of ``run_dir`` (created if missing) until the block ends; another process holding it is an
    InputError naming that process. ``on_stale(holder)`` is told of a lock file left by a process that ended
    without releasing it (killed), which is then taken over. Yields the directory.

    Within one thread the lock nests: a block inside another block that holds it (a train command around its
    task's train function, which takes it too) holds it already; the outermost one releases it."""
    import fcntl  # POSIX; attnkit's trainings run on Linux and macOS

    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise InputError(f"{run_dir}: exists and is not a directory")
    if (threading.get_ident(), run_dir.resolve()) in _held:
        yield run_dir
        return
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise InputError(f"{run_dir}: cannot be made, a folder on its path is a file") from None
    key = threading.get_ident(), run_dir.resolve()
    path = run_dir / LOCK
    while True:
        file = open(path, "a+", encoding="utf-8")  # created if missing, never truncated by opening
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.close()
            holder = _read_holder(path)
            who = f" ({holder})" if holder else ""
            raise InputError(
                f"{run_dir}: another training is writing this run directory{who}; wait for it to end, or choose "
                "another --out"
            ) from None
        # The holder before us may have removed the file between our open and our lock: then ours is a lock on a
        # file nobody else can find, and we try again on the one at the path now.
        if _same_file(file.fileno(), path):
            break
        file.close()
    try:
        stale = _read_holder(path)
        if stale is not None:
            on_stale(stale)
        file.seek(0)
        file.truncate()
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        file.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}))
        file.flush()
        _held.add(key)
        yield run_dir
    finally:
        _held.discard(key)
        with contextlib.suppress(OSError):  # a directory made read-only meanwhile: the lock still goes with the file
            path.unlink()  # before the lock goes: a process waiting for it then finds no file, or a new one
            if created and not any(run_dir.iterdir()):
                run_dir.rmdir()  # a training that failed before writing anything leaves nothing behind
        file.close()


def training_now(run_dir: str | Path) -> Holder | None:
    """Who is training ``run_dir`` right now, as far as this machine can tell: the holder its lock file names when
    that process is alive here (a training removes the file when it ends, however it ends but SIGKILL); None
    otherwise. Read without locking, which could refuse a training that starts at that moment."""
    holder = _read_holder(Path(run_dir) / LOCK)
    if holder is None or holder.host != socket.gethostname():
        return None
    try:
        os.kill(holder.pid, 0)  # signal 0: only whether the process exists
    except ProcessLookupError:
        return None
    except PermissionError:  # it exists, and belongs to another user
        pass
    return holder


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _read_holder(path: Path) -> Holder | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Holder(int(data["pid"]), str(data["host"]), str(data["started"]))
    except (OSError, ValueError, KeyError, TypeError):  # empty (just created), or not ours
        return None
