"""Benchmarks: attnkit side by side with the alternatives a user would pick, in one run, on the same inputs.

Suites (each a module with ``run(*, quick=False, threads=2, ...) -> list[Result]`` and the generator
``iter_results`` behind it):

    train      translation training steps (small and base encoder-decoder), target tokens/s and MFU
    classify   the seed-000 classifier, training and inference sentences/s, with and without padding
    decode     greedy and beam-4 decoding of exactly 32 tokens, target tokens/s
    scaling    one encoder layer at lengths 128 .. 8,192, time and peak memory, inference and training

Peers (``peers``): ``torch.nn`` always; Hugging Face ``transformers`` and CTranslate2 when installed (the ``bench``
extra). The train suite's batches are ``train_inputs``, each implementation's step ``train_steps``; each
implementation's decoding call is ``decode_calls``. What the suites measure with: ``timing`` (the median, the
implementations of a table timed in turns, threads), ``memory`` (peak resident memory), ``flops`` (model FLOPs, MFU) and
``ceiling`` (the matmul ceiling MFU is relative to); ``results`` is the row every suite yields, with its JSON and the
table; ``token_ids`` the ids every input uses. ``iter_suite`` runs one suite; the command line (``attnkit bench SUITE``,
in ``attnkit.cli.bench``) prints what it yields, after the machine record of ``machine`` (CPU, features, threads,
versions, load; the GPU on ``--device cuda``). ``gpu`` holds what timing on a GPU adds (the device's clock, the
data-sheet bfloat16 ceiling MFU is relative to there). The CTranslate2 peer runs attnkit's weights converted by
``attnkit.interop.ct2``, in a child process of its own (``isolated``: its thread pool and PyTorch's would slow each
other in one process).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence

from attnkit.config import MAX_THREADS
from attnkit.errors import InputError

SUITES = ("train", "classify", "decode", "scaling")
IMPL_CHOICES = ("attnkit", "torch.nn", "transformers", "ctranslate2")  # every suite's IMPLS is a subset


def suite_module(name: str):
    """The module of suite ``name`` (imported on demand: suites import torch and, lazily, the peers)."""
    if name not in SUITES:
        raise ValueError(f"unknown benchmark suite {name!r}; expected one of {', '.join(SUITES)}")
    return importlib.import_module(f"attnkit.bench.{name}")


def iter_suite(
    name: str,
    *,
    quick: bool = False,
    threads: int = 2,
    impls: Sequence[str] | None = None,
    device=None,
    compiled: bool = False,
) -> Iterator:
    """The results of suite ``name`` as they are measured (``Result`` objects of ``attnkit.bench.results``), on
    ``device`` (a ``torch.device``; default the CPU; ``gpu`` says what changes on a GPU).

    ``impls`` keeps only those of the suite's implementations (default: all installed); naming none that the suite
    runs is an ``InputError``, as is ``threads`` outside 1 to ``MAX_THREADS``. ``compiled`` (the train suite's): also
    attnkit's step compiled as ``--set compile=true`` trains it, in bfloat16 where the device computes it natively,
    else in float32. All are checked here, before the first measurement."""
    if threads < 1:
        raise InputError(f"bench: --threads={threads} must be >= 1")
    if threads > MAX_THREADS:  # libgomp crashes on ~100,000
        raise InputError(f"bench: --threads={threads} is over attnkit's ceiling of {MAX_THREADS:,}")
    if compiled and name != "train":
        raise InputError(f"bench {name} --compiled: only the train suite has compiled rows (decode: ATTNKIT_ENGINE)")
    module = suite_module(name)
    kwargs: dict = {"quick": quick, "threads": threads}
    if compiled:
        kwargs["compiled_precisions"] = ("bf16", "fp32")  # the first of them the suite runs on the device
    if device is not None:
        kwargs["device"] = device
    if impls:
        chosen = tuple(i for i in impls if i in module.IMPLS)
        if not chosen:
            raise InputError(f"bench: suite {name} runs {', '.join(module.IMPLS)}; --impl chose none of them")
        kwargs["impls"] = chosen
    return module.iter_results(**kwargs)
