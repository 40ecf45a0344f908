"""Atomic files: every artifact attnkit writes appears complete or not at all.

The data goes to a fresh hidden name in the same directory, is flushed and fsynced, and is renamed over the
target (``os.replace`` is atomic on one file system). A kill at any moment leaves either the previous file or the
new one. The temporary name is opened with mode "x" rather than through ``mkstemp``, whose files are private
(0600): run directories are shared, so their files get the umask's permissions like any other file.
"""

from __future__ import annotations

import json
import os
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
        tmp.unlink(missing_ok=True)
        if err.filename is None and err.errno is not None:  # write()/fsync() errors (a full disk) name no file
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with open_atomic(path) as f:
        f.write(data)


def atomic_write_json(path: str | Path, obj: object) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
