"""Benchmarks: attnkit side by side with the alternatives a user would pick, in one run, on the same inputs.

Suites (each a module with ``run(*, quick=False, threads=2, ...) -> list[Result]`` and the generator
``iter_results`` behind it):

    train      translation training steps (small and base encoder-decoder), target tokens/s and MFU
    classify   the seed-000 classifier, training and inference sentences/s, with and without padding
    decode     greedy and beam-4 decoding of exactly 32 tokens, target tokens/s
    scaling    one encoder layer at lengths 128 .. 8,192, time and peak memory, inference and training

Peers (``peers``): ``torch.nn`` always; Hugging Face ``transformers`` and CTranslate2 when installed (the ``bench``
extra). ``common`` holds timing, peak memory, the matmul ceiling and the FLOP formulas; ``cli_entry`` is the
command line (``attnkit bench SUITE``). The CTranslate2 peer runs attnkit's weights converted by
``attnkit.interop.ct2``.
"""

from __future__ import annotations

import importlib

SUITES = ("train", "classify", "decode", "scaling")


def suite_module(name: str):
    """The module of suite ``name`` (imported on demand: suites import torch and, lazily, the peers)."""
    if name not in SUITES:
        raise ValueError(f"unknown benchmark suite {name!r}; expected one of {', '.join(SUITES)}")
    return importlib.import_module(f"attnkit.bench.{name}")


def main(argv: list[str] | None = None) -> int:
    """``attnkit bench SUITE [--json] [--quick] [--threads N]`` as a stand-alone entry point."""
    from attnkit.bench.cli_entry import main as cli_main

    return cli_main(argv)
