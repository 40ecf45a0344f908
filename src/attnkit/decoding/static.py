"""What greedy and beam search share: a batch made static for a call, and the loop that steps it.

A call decodes R rows against sources of S positions for at most L steps. All three are fixed when the call starts:
a finished sentence stays in the batch, masked, instead of leaving it (removing it would change every shape), and
the self-attention cache is preallocated to L positions. With a bucketed engine, R, S and L are rounded up
(``attnkit.inference.programs``): the rows added are copies of the first sentence, finished before they start;
the source positions added are padding, masked out of cross-attention; the cache positions added are never
reached.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.decoding.limits import longest_output
from attnkit.devices import model_device
from attnkit.inference.programs import Engine, Runner, batch_bucket, compiled_call, default_engine, length_bucket
from attnkit.model.attention import KVCache
from attnkit.model.layers import DecoderLayer, DecoderLayerCache
from attnkit.model.transformer import Transformer


@dataclass(frozen=True)
class Plan:
    """What a call decodes: ``sentences`` sources for at most ``steps`` steps, in a static batch of ``rows``
    sentences, ``source`` source positions and a cache of ``cache`` positions, on ``engine``, ``per_call`` steps
    at a time."""

    engine: Engine
    sentences: int
    steps: int
    rows: int
    source: int
    cache: int
    per_call: int = 1


def check_call(model: object, src: object, *, bos_id: int, eos_id: int, max_positions: int) -> None:
    """The arguments of a search, checked before anything runs: a ``TypeError`` for a model that is not an
    encoder-decoder or a ``src`` that is not a tensor of integer token ids, a ``ValueError`` naming an id outside the
    vocabulary or a length past the positional table (rather than an IndexError or an AttributeError from inside
    the model). The ids of ``src`` are read once a call, before the first step."""
    if not isinstance(model, Transformer):
        raise TypeError(f"model is a {type(model).__name__}, not an encoder-decoder attnkit Transformer")
    if not isinstance(src, Tensor):
        raise TypeError(f"src must be a (B, S) tensor of token ids, got {type(src).__name__}")
    if src.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"src must hold token ids as torch.long (or torch.int), got {src.dtype}")
    vocab, max_len = model.embeddings.token.num_embeddings, model.embeddings.position.max_len
    for name, token in (("bos_id", bos_id), ("eos_id", eos_id)):
        if not 0 <= token < vocab:
            raise ValueError(f"{name}={token} is not a token id of the model's vocabulary [0, {vocab})")
    if max_positions > max_len:
        raise ValueError(f"max_positions={max_positions} is past the model's positional table (max_len={max_len})")
    if src.dim() == 2 and src.size(1) > max_len:
        raise ValueError(f"src has {src.size(1)} positions, past the model's positional table (max_len={max_len})")
    if src.numel():
        low, high = torch.stack(torch.aminmax(src)).tolist()  # one read of the device, not one per value
        if low < 0 or high >= vocab:
            raise ValueError(
                f"src holds token id {low if low < 0 else high}, outside the model's vocabulary [0, {vocab})"
            )


def plan(
    model: Transformer,
    src: Tensor,
    engine: Engine | None,
    *,
    max_positions: int,
    max_extra: int,
    fixed_len: int | None,
) -> Plan:
    """The ``Plan`` of a call on ``src`` (B, S): B, S and the longest output themselves, or their buckets
    (``engine`` None: the device's default). The cache of a bucketed call holds the longest output of its source
    bucket (``longest_output``), so that it adds no bucket of its own. Where the engine runs several steps a call
    (``Engine.steps_per_call``: a compiled CPU step, a few sentences), the cache is rounded up to a multiple of
    them, so that the steps run after the longest output (at most ``per_call - 1``, on finished rows) still write
    inside it; or, where that would pass the positional limit, the call runs one step at a time."""
    engine = engine or default_engine(model_device(model))
    B, S = src.shape
    steps = longest_output(S, max_extra=max_extra, max_positions=max_positions, fixed_len=fixed_len)
    if not engine.bucketed:
        return Plan(engine, B, steps, B, S, steps)
    source = length_bucket(S, model.embeddings.position.max_len)
    cache = longest_output(source, max_extra=max_extra, max_positions=max_positions, fixed_len=None)
    if fixed_len is not None:
        cache = max(16, fixed_len)
    rows = batch_bucket(B)
    per_call = engine.steps_per_call(model_device(model), rows)
    rounded = -(-cache // per_call) * per_call
    if rounded > max_positions:
        return Plan(engine, B, steps, rows, source, cache)
    return Plan(engine, B, steps, rows, source, rounded, per_call)


@contextmanager
def evaluating(model: Transformer) -> Iterator[None]:
    """``model`` in evaluation mode inside the block (no dropout: §5.4 applies it in training only), in its own mode
    after it. A model already wholly in evaluation mode, as a decoding model is, is left alone: setting the mode
    walks every module, ~1.3 ms a call there and back for the small translator on a 2-core EPYC."""
    if not any(module.training for module in model.modules()):
        yield
        return
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def zeros(device: torch.device, *shape: int, dtype: torch.dtype = torch.long) -> Tensor:
    """A zeroed state tensor (long by default) for ``allocate``."""
    return torch.zeros(shape, dtype=dtype, device=device)


def pad_sources(src: Tensor, rows: int, length: int, pad_id: int) -> Tensor:
    """``src`` (B, S) in a (rows, length) batch: padding appended to every row, then copies of row 0 as rows
    B .. rows - 1 (a batch of real sentences, whose results are dropped)."""
    B, S = src.shape
    out = src.new_full((rows, length), pad_id)  # (rows, length)
    out[:B, :S] = src
    out[B:, :S] = src[:1]
    return out


def encode(model: Transformer, src: Tensor, engine: Engine) -> tuple[Tensor, Tensor]:
    """The encoder's memory (R, S, D) and the source mask (R, 1, 1, S) of a call's sources ``src`` (R, S): by one
    compiled program per shape where ``engine`` compiles on a CPU (``Engine.compiles_encoder``), else eagerly."""
    if engine.compiles_encoder(model_device(model)):
        return compiled_call(engine, _encode, model, src)
    return _encode(model, src)


def _encode(model: Transformer, src: Tensor) -> tuple[Tensor, Tensor]:
    memory, src_mask, _ = model.encode(src)
    return memory, src_mask


def empty_cache(model: Transformer, rows: int, src_length: int, length: int, like: Tensor) -> list[DecoderLayerCache]:
    """Zeroed decoder caches for ``rows`` rows: self-attention for ``length`` positions, cross-attention for
    ``src_length`` (filled by ``fill_cross``)."""
    caches = []
    for layer in model.decoder.layers:
        assert isinstance(layer, DecoderLayer)  # nn.ModuleList yields plain Modules to the type checker
        H, Dh = layer.self_attn.n_heads, layer.self_attn.d_head
        caches.append(
            DecoderLayerCache(KVCache.empty(rows, H, Dh, length, like), KVCache.empty(rows, H, Dh, src_length, like))
        )
    return caches


def fill_cross(model: Transformer, memory: Tensor, cache: list[DecoderLayerCache], repeat: int = 1) -> None:
    """Write the cross-attention keys and values of ``memory`` (B, S, D) into ``cache``, each row ``repeat`` times
    (the beams of a sentence share its source)."""
    for layer, layer_cache in zip(model.decoder.layers, cache):
        assert isinstance(layer, DecoderLayer)
        kv = layer.cross_attn.project_kv(memory)  # (B, H, S, Dh) each
        layer_cache.cross_kv.k.copy_(kv.k.repeat_interleave(repeat, dim=0))  # (B * repeat, H, S, Dh)
        layer_cache.cross_kv.v.copy_(kv.v.repeat_interleave(repeat, dim=0))


def written(cache: list[DecoderLayerCache], t: Tensor, prefix: bool) -> tuple[list[DecoderLayerCache], int | Tensor]:
    """The self-attention caches a step at position ``t`` (1,) attends over, and the offset to decode at. With
    ``prefix`` (``Engine.prefix``): views of positions 0 .. t of the buffers (the step writes position t into them,
    and they hold nothing after it) and t as an int, so that the query attends to them all without a mask; else the
    whole buffers, every unwritten position masked out, and ``t`` itself. Both give the same attention: the masked
    positions have weight 0."""
    if not prefix:
        return cache, t
    n = int(t) + 1  # a read of a CPU tensor: no synchronisation
    views = [
        DecoderLayerCache(KVCache(c.self_kv.k[:, :, :n], c.self_kv.v[:, :, :n]), c.cross_kv)  # (R, H, n, Dh)
        for c in cache
    ]
    return views, n - 1


def fill_source_mask(into: Tensor | None, src_mask: Tensor, prefix: bool) -> Tensor | None:
    """The source mask of a call's state: ``into`` (the state's own tensor, which a recorded graph reads) holding
    ``src_mask`` (R, 1, 1, S); or None where ``prefix`` (the eager step on a CPU, whose state is the call's own) and
    no source position is padding: eq. 1 without a mask runs PyTorch's faster path."""
    if prefix and bool(src_mask.all()):
        return None
    assert into is not None, "a state allocated with its source mask"
    into.copy_(src_mask)
    return into


def banned_tokens(vocab_size: int, banned: list[int], device: torch.device) -> Tensor:
    """(V,) True at the tokens a search never emits."""
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)  # (V,)
    mask[banned] = True
    return mask


def run_steps(runner: Runner, steps: int, stopped: Callable[[], Tensor], check_every: int) -> None:
    """Step ``runner`` until ``steps`` steps have run (``runner.steps_per_call`` a call); every ``check_every`` steps
    (or every call, where a call runs more) read ``stopped()`` (a 0-d bool tensor the step keeps on the device) on
    the host, the loop's only read, and stop once it is True."""
    n = runner.steps_per_call
    every = max(1, check_every // n)  # calls between two reads
    for call, done in enumerate(range(n, steps + n, n)):
        runner.step()
        if (call + 1) % every == 0 and done < steps and bool(stopped()):
            return
