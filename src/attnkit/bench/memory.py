"""Peak resident memory of a block of code on a CPU (``PeakRSS``; a GPU's counterpart is ``gpu.PeakCUDA``).

The resident set size (on Linux) is the honest measure on a CPU: it includes memory that any allocator (PyTorch's,
CTranslate2's, NumPy's) holds. ``getrusage``'s ru_maxrss is process-wide and never falls, so instead the kernel's
high-water mark (VmHWM in /proc/self/status) is reset to the current RSS by writing "5" to /proc/self/clear_refs just
before the measured calls, and peak_mib = VmHWM after them - VmRSS before them. Memory freed by an earlier
measurement may stay resident in the allocator and be reused without raising the mark, so a suite that reports memory
runs every measurement in a fresh subprocess (``scaling``).
"""

from __future__ import annotations

import gc
from pathlib import Path


class PeakRSS:
    """Peak resident memory added by the block, in MiB (``peak_mib``; None where /proc is unavailable).

    Resets the kernel's high-water mark on entry (see the module docstring). Meaningful in a fresh process.
    """

    def __init__(self) -> None:
        self.peak_mib: float | None = None
        self._base_kib: int | None = None

    def __enter__(self) -> PeakRSS:
        gc.collect()
        try:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
            self._base_kib = _proc_status_kib("VmRSS")
        except OSError:
            self._base_kib = None
        return self

    def __exit__(self, *exc) -> None:
        if self._base_kib is not None:
            self.peak_mib = max(0, _proc_status_kib("VmHWM") - self._base_kib) / 1024


def _proc_status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])  # "VmHWM:   123456 kB"
    raise OSError(f"{key} not in /proc/self/status")
