"""What a CPU can see of a GPU training step (STYLE.md, "Fast on the device it runs on"): the ATen calls of one
optimizer step of ``translate train`` (each a kernel launch on a GPU) do not grow with the batch and stay near Hugging
Face Marian's; the step reads the device at most once (each synchronising call stops a GPU's queue); and the
compiled step traces into one graph that computes the eager loss.

The GPU's choices are taken on the CPU (``gpu_choices``): the loss's fused pass instead of the CPU's cache-sized
blocks, and the padded encoder instead of the CPU's packing of real tokens (``losses.blocked_loss``,
``transformer.skips_padding``); everything else is the code every device runs.
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Callable

import pytest
import torch

from attnkit.bench.dispatch import CallCount as Count
from attnkit.bench.train_inputs import reversal_pairs
from attnkit.config import task_configs
from attnkit.data.readers.parallel import Pair
from attnkit.model import transformer
from attnkit.tasks.translate import train_translator
from attnkit.training import loop, losses
from attnkit.training import step as step_module
from attnkit.training.task import TrainContext


@pytest.fixture
def gpu_choices(monkeypatch):
    """The per-device choices a CUDA device makes, taken on the CPU."""
    monkeypatch.setattr(losses, "blocked_loss", lambda logits: False)
    monkeypatch.setattr(transformer, "skips_padding", lambda device: False)


def per_step(tmp_path, data: list[Pair], max_tokens: int, steps: int) -> tuple[list[Count], list[int]]:
    """``translate train`` (a tiny model) for ``steps`` steps of ``max_tokens``-token batches: the ATen calls of each
    optimizer step (``step.train_step``, the batches' collation included) and the step's reads of the device."""
    model_cfg, train_cfg = task_configs(
        "translate",
        None,
        dict(
            d_model=16, n_heads=2, d_ff=32, n_layers=1, min_freq=1, tokenizer="word", valid_bleu=False,
            max_steps=steps, max_tokens=max_tokens, checkpoint_every=10_000, dropout=0.1,
        ),
    )  # fmt: skip
    counts: list[Count] = []
    reads: list[int] = []

    def counted(fn: Callable, into: Callable[[], list]) -> Callable:
        def wrapper(*args, **kwargs):
            with Count() as count:
                result = fn(*args, **kwargs)
            into().append(count)
            return result

        return wrapper

    def read_step(values):
        reads[-1] += 1
        return real_read(values)

    real_read, real_step, real_prefetched = step_module.read_step, loop.train_step, loop.prefetched

    def train_step(*args, **kwargs):
        reads.append(0)
        return counted(real_step, lambda: counts)(*args, **kwargs)

    def prefetched(groups, collate, context):  # the collation of each step's batches, counted with its step
        collations: list[Count] = []
        for mine in real_prefetched(groups, counted(collate, lambda: collations), context):
            yield mine
            if counts:
                for count in collations:
                    counts[-1].add(count)
            collations.clear()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_module, "read_step", read_step)
        patch.setattr(loop, "train_step", train_step)
        patch.setattr(loop, "prefetched", prefetched)
        train_translator(data, None, model_cfg=model_cfg, train_cfg=train_cfg, out_dir=tmp_path / f"run{max_tokens}")
    assert len(counts) == steps
    return counts, reads


@pytest.mark.slow
def test_a_steps_calls_do_not_grow_with_its_tokens(tmp_path, gpu_choices):
    """One optimizer step at 32,768 tokens a batch dispatches at most 1.1x the ATen calls of one at 4,096 (the loss
    over 16-row blocks made it 6.2x, ~23,500 launches a step on a GPU)."""
    data = reversal_pairs(3000)
    small, _ = per_step(tmp_path, data, 4096, steps=3)
    large, _ = per_step(tmp_path, data, 32768, steps=3)
    small_calls, large_calls = small[-1].calls, large[-1].calls  # after the first step (the optimizer's state)
    assert large_calls <= 1.1 * small_calls, (small_calls, large_calls)


def test_a_step_reads_the_device_at_most_once(tmp_path, gpu_choices):
    """Over 20 steps, the calls that synchronise on CUDA plus the loop's own read: at most one a step."""
    counts, reads = per_step(tmp_path, reversal_pairs(800), 512, steps=20)
    syncs = sum((count.syncs for count in counts), collections.Counter())
    assert sum(syncs.values()) + sum(reads) <= 20, (dict(syncs), sum(reads))
    assert reads == [1] * 20  # the loss, statistics and gradient norm come back together, once a step


def test_on_a_cpu_too_a_step_reads_the_device_at_most_once(tmp_path):
    """The CPU's own choices (cache-sized loss blocks, real tokens packed from host-made rows) read nothing either."""
    counts, reads = per_step(tmp_path, reversal_pairs(300), 512, steps=5)
    syncs = sum((count.syncs for count in counts), collections.Counter())
    assert not syncs and reads == [1] * 5, dict(syncs)


@pytest.mark.parametrize("tokens", [4096, 32768])
def test_the_benchs_step_dispatches_about_what_hugging_faces_does(tokens, gpu_choices):
    """``bench train``'s attnkit step (forward, loss, backward, fused Adam) dispatches at most 1.2x the ATen calls of
    Hugging Face Marian's at the same shapes, whatever the batch (the blocked loss made it 3.4x at 4,096 tokens and
    21x at 32,768)."""
    pytest.importorskip("transformers")
    from attnkit.bench import train_inputs, train_steps
    from attnkit.bench.token_ids import PAD_ID
    from attnkit.config import TranslatorConfig
    from attnkit.model.build import build_translator

    cfg = TranslatorConfig(vocab_size=500, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_len=64)
    src, tgt_in, tgt_out = train_inputs.make_batch(cfg, 32, tokens, seed=0)  # (B, 32) each
    ours = build_translator(cfg, pad_id=PAD_ID)
    calls = {}
    for impl in ("attnkit", "transformers"):
        torch.manual_seed(0)
        model, forward = train_steps.forward_fn(impl, cfg, ours)
        step = train_steps.training_step(model, forward, src, tgt_in, tgt_out)
        step()  # the optimizer's state is made at the first step
        with Count() as count:
            step()
        calls[impl] = count.calls
    assert calls["attnkit"] <= 1.2 * calls["transformers"], calls


def test_the_compiled_step_is_one_graph_and_computes_the_eager_loss(tmp_path):
    """``compile=true``: the translation task's forward pass and loss traced with ``fullgraph=True`` (a graph break
    raises) give the eager step's loss to 1e-5, on batches of three shapes (padded source, unpadded, one sentence).
    Traced with AOT autograd and run without generated kernels: Inductor's own compilation takes minutes on a CPU
    (tests/test_cuda.py compiles with it on a GPU)."""
    from attnkit.training.kernels import compiled
    from attnkit.training.task import TrainContext

    task, eager = translation_task(dropout=0.0)
    traced = copy.deepcopy(eager)
    loss_fn = compiled(task.loss, backend="aot_eager")
    runs = [(eager, task.loss), (traced, loss_fn)]
    optimizers = [torch.optim.AdamW(model.parameters(), lr=1e-3) for model, _ in runs]
    for step, indices in enumerate([[0, 1, 2], [3, 4], [5]], start=1):
        batch = task.collate(indices)
        eager_step, traced_step = (
            step_module.train_step(model, opt, task, [(0, batch)], task.cfg, TrainContext(), step=step, loss=fn)
            for (model, fn), opt in zip(runs, optimizers)
        )
        assert traced_step.problem is None
        assert traced_step.loss_sum == pytest.approx(eager_step.loss_sum, rel=1e-5, abs=1e-5)


def translation_task(dropout: float):
    """A tiny translator and its training task over six pairs: sources of lengths 3, 5, 4 (padded), 6, 6 (not) and 2."""
    from attnkit.model.build import build_translator
    from attnkit.tasks.translate.data import encode_pairs
    from attnkit.tasks.translate.train import TranslationTask
    from attnkit.tokenization import train_tokenizer

    texts = ["a b", "c d e f", "g h i", "a c e g i", "b d f h j", "j"]
    data = [Pair(t, " ".join(reversed(t.split())), i + 2) for i, t in enumerate(texts)]
    model_cfg, train_cfg = task_configs(
        "translate", None, dict(d_model=16, n_heads=2, d_ff=32, n_layers=1, min_freq=1, dropout=dropout,
                                tokenizer="word", valid_bleu=False, label_smoothing=0.1),
    )  # fmt: skip
    tokenizer = train_tokenizer(
        (s for p in data for s in (p.source, p.target)), kind="word", vocab_size=model_cfg.vocab_size, min_freq=1
    )
    torch.manual_seed(0)
    model = build_translator(model_cfg, pad_id=tokenizer.pad_id).train()
    parallel = encode_pairs(tokenizer, data, model_cfg.max_len, "truncate")
    task = TranslationTask(parallel, None, [], tokenizer, train_cfg, model_cfg.d_model, "test", model_cfg.max_len)
    return task, model


def test_a_fixed_shape_batch_gives_the_batchs_loss_and_gradients():
    """``cuda_graphs=true`` records a step per batch shape, so the translator's batches are padded to a bounded set
    of shapes (``fixed_shape_batch``: rows to a multiple of 8, copies of row 0; lengths to a multiple of 16, within
    the positional limit; every target position read, padding as the target the loss leaves out): the loss and the
    gradients are the batch's own, and its size is still its real target tokens."""
    from attnkit.config import TranslatorTrainConfig
    from attnkit.tasks.translate.data import fixed_shape_batch
    from attnkit.training.graphs import fixed_shape_collate, use_graphs

    task, model = translation_task(dropout=0.0)
    batch = task.collate([0, 1, 2])  # 3 pairs, source lengths 3, 5, 4 (+ EOS)
    fixed = fixed_shape_batch(batch, task.tokenizer.pad_id, max_positions=64)
    assert [tuple(t.shape) for t in fixed.tensors] == [(8, 16), (8, 16), (128,), (128,)]
    assert fixed.size == batch.size == int((fixed.tensors[3] != task.tokenizer.pad_id).sum())
    assert (fixed.tensors[0][3:] == fixed.tensors[0][0]).all()  # the added rows: copies of row 0
    # within the positional limit: no length past max_positions, unless the batch's own is longer
    assert batch.tensors[0].shape == (3, 5)
    # as the loop collates for a run whose steps are replayed (``graphs.use_graphs``: this task, on a GPU)
    assert use_graphs(TranslatorTrainConfig(), task, TrainContext(torch.device("cuda")))
    assert [t.shape for t in fixed_shape_collate(task)([0, 1, 2]).tensors] == [t.shape for t in fixed.tensors]
    assert fixed_shape_batch(batch, task.tokenizer.pad_id, max_positions=6).tensors[0].shape == (8, 6)
    assert fixed_shape_batch(batch, task.tokenizer.pad_id, max_positions=4).tensors[0].shape == (8, 5)

    def loss_and_grads(b):
        model.zero_grad()
        out = task.loss(model, b)
        out.value.backward()
        return out.value.detach(), [p.grad.clone() for p in model.parameters()]

    loss, grads = loss_and_grads(batch)
    fixed_loss, fixed_grads = loss_and_grads(fixed)
    torch.testing.assert_close(fixed_loss, loss, rtol=1e-5, atol=1e-6)
    for fixed_grad, grad in zip(fixed_grads, grads):
        torch.testing.assert_close(fixed_grad, grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "settings, context, needle",
    [
        ({}, TrainContext(), "needs a CUDA device"),
        ({}, TrainContext(torch.device("cuda"), rank=0, world_size=2), "one process"),
        ({"accum_steps": 2}, TrainContext(torch.device("cuda")), "accum_steps=2"),
        ({"precision": "fp16"}, TrainContext(torch.device("cuda")), "fp16"),
    ],
)
def test_cuda_graphs_names_what_it_needs_and_the_run_lacks_and_unset_records_where_it_can(settings, context, needle):
    from attnkit.config import TranslatorTrainConfig
    from attnkit.errors import InputError
    from attnkit.tasks.translate.train import TranslationTask
    from attnkit.training.graphs import check_graphs, use_graphs

    cfg = TranslatorTrainConfig(cuda_graphs=True, **settings)
    with pytest.raises(InputError, match=needle):
        check_graphs(cfg, TranslationTask, context)
    with pytest.raises(InputError, match="only translate train"):  # a task whose batches have no bounded shapes
        check_graphs(TranslatorTrainConfig(cuda_graphs=True), object(), TrainContext(torch.device("cuda")))
    # unset (the default): wherever it can be, and silently not elsewhere; false: never
    unset = TranslatorTrainConfig(**settings)
    assert use_graphs(unset, TranslationTask, context) is False
    assert use_graphs(TranslatorTrainConfig(), TranslationTask, TrainContext(torch.device("cuda"))) is True
    assert (
        use_graphs(TranslatorTrainConfig(cuda_graphs=False), TranslationTask, TrainContext(torch.device("cuda")))
        is False
    )
    assert use_graphs(TranslatorTrainConfig(), object(), TrainContext(torch.device("cuda"))) is False


def test_a_step_replayed_from_its_recording_trains_as_the_eager_step(replayed_step):
    """The loop's step with ``graphs`` (``training.graphs.GraphedStep``: the batch copied into the recorded inputs,
    the gradients zeroed and summed into tensors it holds, the loss scaled by the step's units, the values read
    once, the first update eager and the later ones replayed) gives the eager step's losses and weights, step by
    step, on batches of 3, 2 and 1 sentence pairs, which pad to one shape, recorded once (no dropout). Here each
    recording stands in for itself (a replay runs the recorded work again, which is what a CUDA graph's replay
    computes), so that the bookkeeping runs on a CPU; on a GPU the recordings are CUDA graphs (tests/test_cuda.py)."""
    task, model = translation_task(dropout=0.0)
    twin = copy.deepcopy(model)
    # SGD: Adam would scale the rounding differences of near-zero gradients (padded sums) up to its step size
    eager_opt, graphed_opt = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, twin))
    graphs = replayed_step(twin, graphed_opt, task, task.loss, task.cfg)
    for step, indices in enumerate([[0, 1, 2], [3, 4], [5], [0, 1, 2]], start=1):
        batch = task.collate(indices)
        eager = step_module.train_step(model, eager_opt, task, [(0, batch)], task.cfg, TrainContext(), step=step)
        graphed = step_module.train_step(
            twin, graphed_opt, task, [(0, task.fixed_shape(batch))], task.cfg, TrainContext(), step=step, graphs=graphs
        )
        assert graphed.problem is None and graphed.size == eager.size
        assert graphed.loss_sum == pytest.approx(eager.loss_sum, rel=1e-5)
        for a, b in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6)
    assert len(graphs.shapes) == 1 and graphs.updates == 4  # batches of 3, 2 and 1 pairs: one shape, recorded once
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
