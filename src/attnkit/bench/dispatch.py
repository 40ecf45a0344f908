"""What a CPU can see of a GPU's work: the ATen calls a block of code dispatches, and the ones that would make the
host wait for a CUDA device.

On a GPU every ATen call is at least one kernel launch of a few microseconds of host time, so a step whose calls
grow with its batch, or that launches many more than another implementation of the same arithmetic, is launch-bound
there however fast the kernels are. A synchronising call (a scalar read: ``.item()``, ``int()``, ``bool()`` of a
tensor; ``nonzero`` and what is built on it: ``masked_select``, indexing by a boolean mask) stops the host until the
device's queue is empty, so the next kernels are not queued while the device works. Both counts are the same on any
device, so a CPU test can hold a GPU property (``tests/training/test_step_costs.py``, ``benchmarks/step_calls.py``).

Not counted: a copy to the host by ``.tolist()`` or ``.cpu()``, which on a CPU tensor dispatches nothing; the
training loop reads its device through one named function (``training.step.read_step``) that a count can watch.
"""

from __future__ import annotations

import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNCHRONISING = frozenset(
    {"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.is_nonzero", "aten.equal"}
)
INDEXING = frozenset({"aten.index", "aten.index_put", "aten.index_put_"})  # synchronising with a boolean index


class CallCount(TorchDispatchMode):
    """Within the block, ``calls`` counts every ATen call and ``syncs`` the synchronising ones by name."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.syncs: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        self.calls += 1
        if name in SYNCHRONISING:
            self.syncs[name] += 1
        elif name in INDEXING and len(args) > 1 and any(_is_bool(t) for t in (args[1] or ())):
            self.syncs[name + " (boolean mask)"] += 1
        return func(*args, **(kwargs or {}))

    def add(self, other: CallCount) -> None:
        """Count ``other``'s calls as this block's too."""
        self.calls += other.calls
        self.syncs.update(other.syncs)


def _is_bool(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.bool
