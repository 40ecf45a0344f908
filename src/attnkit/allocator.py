"""The C allocator under PyTorch's CPU tensors: keep freed buffers in the process instead of handing them back to the
operating system after every operator.

PyTorch allocates a CPU tensor's memory with the C library's ``malloc``. glibc serves a request of 128 KiB or more
with a fresh ``mmap`` (its adaptive threshold, which stops growing at 32 MiB) and unmaps it on ``free``, and gives
the top of its heap back past 128 KiB of free space. An encoder forward pass over a 32 x 128 batch allocates and
frees dozens of buffers of one to eight megabytes, so every operator writes into pages the kernel has to fault in
and zero first (a median of 2,000-9,000 page faults a pass; tests/test_allocator.py). Measured on the classify
suite's batch in a process that only runs inference (``python benchmarks/profile_classify.py``, 2 threads, AMD EPYC,
two runs each way): 35.9 / 39.7 ms a pass with glibc's defaults against 33.6 / 30.0 ms with the settings below,
BERT's alike. A process that has freed larger buffers before has already raised glibc's adaptive threshold and
gains less. jemalloc and tcmalloc, which PyTorch's CPU performance guide suggests preloading, avoid the same cost by
design; ``mallopt`` gets it without a second library.

``tune_malloc`` raises the mmap threshold to glibc's maximum (32 MiB on 64-bit) and the trim threshold to 1 GiB:
buffers up to 32 MiB are recycled from the heap, larger ones still come and go with ``mmap``. The cost is memory the
process keeps after a peak (up to the heap's free space), the usual trade for a service or a training run. Only the
command line and the inference worker process call it; a program importing attnkit keeps its own allocator settings.
``ATTNKIT_MALLOC=system`` leaves glibc's defaults; other C libraries (macOS, musl) are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

from attnkit.errors import InputError

M_TRIM_THRESHOLD = -1  # <malloc.h>: free heap top above which glibc returns memory to the OS
M_MMAP_THRESHOLD = -3  # <malloc.h>: requests at least this large get an mmap of their own
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest accepted value on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 2**30
ENV = "ATTNKIT_MALLOC"

_applied: bool | None = None  # the outcome of the first call; later calls return it


def tune_malloc() -> bool:
    """Set glibc's mmap and trim thresholds (see the module docstring) once per process; True if they were set,
    False where the C library is not glibc, ``mallopt`` refused, or ``ATTNKIT_MALLOC=system`` says to leave them."""
    global _applied
    chosen = os.environ.get(ENV, "").strip().lower()
    if chosen not in ("", "system"):  # a typo would silently keep attnkit's settings
        raise InputError(f"{ENV}={chosen!r}: expected system (glibc's own settings), or leave it unset")
    if _applied is None:
        _applied = _set_thresholds()
    return _applied


def _set_thresholds() -> bool:
    if os.environ.get(ENV, "").strip().lower() == "system":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success; setting either threshold also switches off glibc's adaptive mmap threshold
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def setting() -> str:
    """What this process's allocator runs with, for a benchmark's machine record."""
    if _applied:
        return f"glibc malloc, mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim threshold {TRIM_THRESHOLD >> 20} MiB"
    return "the C library's defaults"
