"""The training step replayed from CUDA graphs (config key ``cuda_graphs``): recorded once per batch shape, then
launched as two graphs instead of ~1,000 kernels one Python call at a time.

Why. At the sizes attnkit trains, a GPU computes a step faster than the host can queue it: on an H100 the base
model's bfloat16 step at 32,768 tokens ran its kernels in ~21 ms and took 39-52 ms, the GPU idle for the rest
(docs/gpu.md). A CUDA graph is the step's kernels recorded once with their arguments; replaying it costs the host a
few microseconds. Recorded whole (forward, loss, backward, clipping, Adam), the same step took 21.1 ms compiled and
30.8 ms eager, against Hugging Face Marian's 43.0 ms eager (one H100); the Bible recipe trained 2.6x faster
than eagerly on an H200.

What is recorded. Per batch shape, the forward pass, the loss, the backward pass and the gradient clipping
(``_ShapeGraph``); once, the optimizer's update. Between the two the host reads the step's loss, statistics and
gradient norm, as the eager step does (``step.read_step``: the step's one synchronisation), and the non-finite guard
decides on them whether the update runs. A graph replays on the memory it was recorded with, so:
- inputs: each shape's batch tensors are recorded with its graph, and a step copies its batch into them;
- gradients: allocated once, before the first recording; every graph zeroes them and its backward pass adds into
  them, and the update's graph reads them;
- learning rate: a tensor per parameter group (``lr * lr_scale``), filled before each update; the groups keep their
  float ``lr`` for the saved state;
- dropout: a replay draws from the generator's seed and offset at replay time, so the loop's per-batch seed gives
  the masks the eager step would draw for the same batch;
- shapes: the task pads its batches to a bounded set of shapes (``FixedShapes.fixed_shape``; translation:
  ``fixed_shape_batch``), ~50 for the Bible recipe; a shape is recorded when it first comes (two warm-up passes
  on a side stream, then the recording: about three eager steps), and every graph allocates from one memory pool,
  so memory is that of the largest shape, not of all of them.
The update is recorded at the second step of a process: the first runs eagerly, and makes the optimizer's state
and loads its kernels.

When: ``cuda_graphs`` unset (the default), wherever it can be: CUDA, one process, one batch a step, float32 or
bfloat16 (no float16 scaler), and a task whose batches can be padded to a bounded set of shapes (translation);
``cuda_graphs=true`` insists (``check_graphs`` names what is missing), ``false`` never records. The weights must not be
replaced while the graphs live (loading a state dict copies into them, which is fine).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from attnkit.config import TrainConfig
from attnkit.errors import InputError
from attnkit.training.precision import autocast
from attnkit.training.task import Batch, BatchLoss, StepTask, TrainContext

Loss = Callable[[nn.Module, Batch], BatchLoss]
WARMUP = 2  # passes on a side stream before a shape is recorded (kernels load, cuBLAS makes its workspaces)


@runtime_checkable
class FixedShapes(Protocol):
    """A task whose batches can be padded to a bounded set of shapes (translation: ``fixed_shape_batch``)."""

    def collate(self, indices: list[int]) -> Batch: ...

    def fixed_shape(self, batch: Batch) -> Batch: ...


def use_graphs(cfg: TrainConfig, task: object, context: TrainContext) -> bool:
    """Whether a run's steps are replayed from CUDA graphs: as ``cuda_graphs`` says (true that cannot be is an
    ``InputError`` naming what is missing, ``check_graphs``); unset (None), wherever they can be."""
    if cfg.cuda_graphs is None:
        return not _missing(cfg, task, context)
    if cfg.cuda_graphs:
        check_graphs(cfg, task, context)
    return cfg.cuda_graphs


def check_graphs(cfg: TrainConfig, task: object, context: TrainContext) -> None:
    """Raise ``InputError`` naming what steps replayed from CUDA graphs need and this run lacks. ``task``: the
    task, or its class."""
    if missing := _missing(cfg, task, context):
        raise InputError(f"config key cuda_graphs=true {missing}")


def _missing(cfg: TrainConfig, task: object, context: TrainContext) -> str:
    """What steps replayed from CUDA graphs need and this run lacks, said for the error; "" if nothing."""
    if context.device.type != "cuda":
        return f"needs a CUDA device; this run trains on {context.device.type}"
    if context.world_size > 1:
        return f"trains in one process; this run has {context.world_size}"
    if cfg.accum_steps != 1:
        return f"takes one batch a step; accum_steps={cfg.accum_steps}"
    if cfg.precision == "fp16":
        return "does not record precision=fp16's gradient scaler; use bf16"
    if not isinstance(task, FixedShapes):
        return "needs batches of a bounded set of shapes, which only translate train makes"
    return ""


def fixed_shape_collate(task: object) -> Callable[[list[int]], Batch]:
    """``task``'s batches padded to its bounded set of shapes, for the input pipeline (``use_graphs``)."""
    assert isinstance(task, FixedShapes), "use_graphs checked it"
    return lambda indices: task.fixed_shape(task.collate(indices))


@dataclass
class _ShapeGraph:
    """One batch shape's recorded forward and backward pass: its input tensors, what it scales the loss by for the
    backward pass (1 / the step's units, or batch size / units for a mean loss), and what it leaves for the host:
    ``values`` (the loss as computed, each statistic, the gradient norm; float64)."""

    replay: Callable[[], None]
    batch: Batch
    scale: Tensor
    values: Tensor
    mean: bool


class GraphedStep:
    """A training step's two halves replayed from CUDA graphs: ``gradients`` (forward, loss, backward, clipping) and
    ``update`` (the optimizer's step). See the module docstring."""

    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, task: StepTask, loss: Loss, cfg: TrainConfig
    ):
        self.model, self.optimizer, self.task, self.loss, self.cfg = model, optimizer, task, loss, cfg
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.device = self.params[0].device
        self.pool: Any = None  # the memory pool every graph allocates from (torch's handle, made at the first)
        self.shapes: dict[tuple, _ShapeGraph] = {}
        self.grads: list[Tensor] = []  # (held: a graph writes where they were when it was recorded)
        self.lr = [torch.zeros((), device=self.device) for _ in optimizer.param_groups]  # () float32 each
        self.updates = 0
        self.update_graph: Callable[[], None] | None = None  # its replay

    def gradients(self, batch: Batch, seed: int) -> tuple[Tensor, float, Batch]:
        """Replay the graph of ``batch``'s shape (recorded at its first sight) on ``batch`` (host memory, pinned),
        its dropout drawn from ``seed``. Returns ``values`` (1 + K + 1,) float64 on the device (the summed loss, the
        K statistics, the gradient norm), the factor that turns the first into the summed loss, and the batch as the
        graph read it (on the device)."""
        key = tuple((t.shape, t.dtype) for t in batch.tensors)
        shape = self.shapes.get(key) or self._record(batch, key)
        for static, t in zip(shape.batch.tensors, batch.tensors):
            static.copy_(t, non_blocking=True)
        shape.scale.fill_(1.0 if shape.mean else 1.0 / batch.size)  # one batch a step: its units are the step's
        torch.manual_seed(seed)  # a replay reads the generator's seed: the masks an eager step would draw
        shape.replay()
        return shape.values, float(batch.size) if shape.mean else 1.0, Batch(shape.batch.tensors, batch.size)

    def update(self) -> None:
        """The optimizer's step at the groups' learning rates: eager the first time (it makes the optimizer's state),
        recorded the second, replayed after."""
        self.updates += 1
        if self.updates == 1:
            self._attach()
            self.optimizer.step()
            return
        for lr, group in zip(self.lr, self.optimizer.param_groups):
            lr.fill_(group["lr"])
        if self.update_graph is None:
            self.update_graph = self._record_update()
        self.update_graph()

    def _attach(self) -> None:
        """The held gradients as the parameters' ``.grad``, for what runs eagerly or is being recorded (the backward
        pass adds into them, the optimizer reads them): nothing else may have replaced them meanwhile."""
        for p, grad in zip(self.params, self.grads):
            p.grad = grad

    def _pass(self, shape: _ShapeGraph) -> None:
        """The recorded work of one shape: gradients zeroed, forward and loss, backward, clipping, the values."""
        self._attach()
        torch._foreach_zero_(self.grads)
        with autocast(self.cfg.precision, self.device):
            out = self.loss(self.model, shape.batch)
        (out.value * shape.scale).backward()
        norm = nn.utils.clip_grad_norm_(self.params, self.cfg.clip_norm or float("inf"))
        stats = [_stat(out.sums[key], self.device) for key in self.task.stats]
        shape.values.copy_(torch.stack([out.value.detach().double(), *stats, norm.double()]))
        shape.mean = out.mean

    def _record(self, batch: Batch, key: tuple) -> _ShapeGraph:
        if not self.grads:  # once: the gradients every graph writes and the update reads, held here
            self.grads = [torch.zeros_like(p) for p in self.params]
        inputs = Batch(tuple(t.to(self.device) for t in batch.tensors), batch.size)
        values = torch.zeros(2 + len(self.task.stats), dtype=torch.float64, device=self.device)
        scale = torch.ones((), device=self.device)
        shape = _ShapeGraph(lambda: None, inputs, scale, values, mean=False)
        self._warm_up(lambda: self._pass(shape))
        shape.replay = self._capture(lambda: self._pass(shape))
        self.shapes[key] = shape
        return shape

    def _warm_up(self, work: Callable[[], None]) -> None:
        """``work`` run ``WARMUP`` times on a side stream before it is recorded (as PyTorch's docs do)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                work()
        torch.cuda.current_stream().wait_stream(side)

    def _capture(self, work: Callable[[], None]) -> Callable[[], None]:
        """``work`` recorded as a CUDA graph in this step's memory pool (recording runs nothing); returns its
        replay."""
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the collating thread may pin memory meanwhile (global mode would fail the recording)
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            work()
        return graph.replay

    def _record_update(self) -> Callable[[], None]:
        """The optimizer's step recorded with tensor learning rates (``self.lr``); the groups get their floats back,
        and ``capturable`` off, so that the saved state is as an eager run saves it."""
        self._attach()
        groups = self.optimizer.param_groups
        floats = [(group["lr"], group.get("capturable", False)) for group in groups]
        for lr, group in zip(self.lr, groups):
            group["lr"], group["capturable"] = lr, True
        try:
            return self._capture(self.optimizer.step)
        finally:
            for (lr, capturable), group in zip(floats, groups):
                group["lr"], group["capturable"] = lr, capturable


def _stat(value: Tensor | float, device: torch.device) -> Tensor:
    """A batch statistic as a () float64 tensor; a recorded graph cannot read a Python number that changes."""
    if not isinstance(value, Tensor):
        raise TypeError("cuda_graphs: a task's statistics must be tensors (a recorded float would never change)")
    return value.detach().to(device=device, dtype=torch.float64).reshape(())


def stepped(batches: Sequence[tuple[int, Batch]]) -> tuple[int, Batch]:
    """The one (index, batch) of a graphed step (``check_graphs``: one batch a step, one process)."""
    (only,) = batches
    return only
