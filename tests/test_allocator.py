"""glibc's malloc thresholds (attnkit.allocator): set by the command line, left alone on request, and what they are
for: a freed multi-megabyte activation is reused instead of being unmapped and faulted in again."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from attnkit import allocator

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's"
)

# Ten forward passes of a classifier over a 32 x 128 batch (the classify suite's shape); print their minor page faults.
FAULTS = """
import resource, sys, torch
from attnkit import allocator
from attnkit.config import ClassifierConfig
from attnkit.inference import prepare_for_inference
from attnkit.model.build import build_classifier
if sys.argv[1] == "tuned":
    assert allocator.tune_malloc()
torch.set_num_threads(1)
cfg = ClassifierConfig(vocab_size=100, d_model=128, n_heads=4, d_ff=512, n_layers=2, max_len=128)
model = prepare_for_inference(build_classifier(cfg, pad_id=0))
ids = torch.randint(1, 100, (32, 128))
with torch.inference_mode():
    for _ in range(3):  # the first passes fault the working set in (and glibc's adaptive threshold settles)
        model(ids)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        model(ids)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True)
    return int(done.stdout)


@glibc
def test_tuned_malloc_reuses_freed_buffers_instead_of_faulting_them_in_again():
    # Measured, ten passes after three: 14,000-110,000 with glibc's defaults (each pass faults up to ~27 MiB of
    # activations in again), 0-4,608 tuned. glibc's adaptive thresholds make the default's count vary from one
    # process to the next (once 4,096, in a CI run at e873260), so the baseline is the largest of up to three.
    # The tuned count is steady-state reuse plus one-off faults (a heap that grows once, a lazily touched page: 512
    # to 2,561 on one machine, 4,608 once in a CI run at 092a836 against a 22,912 baseline), and one-off faults only
    # add, so it is the smallest of up to three processes.
    default = 0
    for _ in range(3):
        default = max(default, faults("default"))
        if default > 10 * 1000:
            break
    assert default > 10 * 1000, default
    tuned = faults("tuned")
    for _ in range(2):
        if tuned < default / 8:
            break
        tuned = min(tuned, faults("tuned"))
    assert tuned < default / 8, (default, tuned)


@glibc
def test_the_command_line_tunes_malloc_and_the_bench_record_says_so(monkeypatch):
    from attnkit.bench.machine import machine_info
    from attnkit.cli import main

    monkeypatch.setattr(allocator, "_applied", None)
    assert main(["data", "list"]) == 0
    assert allocator._applied is True
    assert machine_info(threads=1)["malloc"].startswith("glibc malloc, mmap threshold 32 MiB")


def test_attnkit_malloc_system_leaves_the_defaults(monkeypatch):
    monkeypatch.setenv("ATTNKIT_MALLOC", "system")
    monkeypatch.setattr(allocator, "_applied", None)
    assert allocator.tune_malloc() is False
    assert allocator.setting() == "the C library's defaults"
