"""Atomic files: every artifact attnkit writes appears complete or not at all.

The data goes to a fresh hidden name in the same directory, is flushed and fsynced, and is renamed over the
target (``os.replace`` is atomic on one file system). A kill at any moment leaves either the previous file or the
new one. The temporary name is opened with mode "x" rather than through ``mkstemp``, whose files are private
(0600): run directories are shared, so their files get the umask's permissions like any other file.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def open_atomic(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file that appears at ``path`` when the ``with`` block ends without error, and never half-written."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "xb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        _remove(tmp)
        if err.errno is not None and err.filename in (None, str(tmp)):  # name the file the caller asked for, not
            raise OSError(err.errno, err.strerror, str(path)) from err  # the temporary (a full disk names none)
        raise
    except BaseException:
        _remove(tmp)
        raise


def _remove(tmp: Path) -> None:
    """Remove the temporary ``tmp`` if it exists. A read-only file system refuses even to remove a name it does not
    hold (EROFS, not ENOENT): that refusal must not replace the error being reported, which names the target."""
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with open_atomic(path) as f:
        f.write(data)


def atomic_write_json(path: str | Path, obj: object) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


@contextmanager
def atomic_directory(out_dir: str | Path) -> Iterator[Path]:
    """A fresh directory to fill; when the ``with`` block ends without error it replaces ``out_dir`` whole.

    Its files are fsynced, any earlier ``out_dir`` is moved aside and removed after the rename, so readers see the
    old directory or the complete new one, never a mix. On error the work directory is removed.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = out_dir.with_name(f".{out_dir.name}.partial-{uuid.uuid4().hex}")
    try:
        work.mkdir()  # not mkdtemp, whose 0700 mode would make the directory private
    except OSError as err:  # name the directory the caller asked for, not the hidden work directory
        raise OSError(err.errno, err.strerror, str(out_dir)) from err
    try:
        yield work
        for path in work.rglob("*"):  # libraries that write files themselves do not fsync
            if path.is_file():
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
        old = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex}")
        if out_dir.exists():
            os.replace(out_dir, old)
        os.replace(work, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
