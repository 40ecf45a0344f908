"""What a benchmark ran on: the CPU and the features its kernels dispatch on, threads, library versions, the load.

Speed depends on the CPU generation as much as on the code (AVX2 against AVX-512, native bfloat16, VNNI and AMX
for int8), and a shared machine's load moves every figure, so each run records them next to its results
(``machine_info``) and names them in one line (``describe_machine``). Imports no optional package: versions are read
from the installed distributions' metadata.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

from attnkit import allocator

# The CPU flags (as /proc/cpuinfo spells them) that decide which kernels PyTorch's oneDNN/MKL and CTranslate2 run:
# vector width (avx2, avx512f), fused multiply-add, bfloat16 dot products, int8 dot products (VNNI) and the AMX tiles.
FEATURES = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_bf16",
    "avx512_vnni",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
LIBRARIES = ("torch", "ctranslate2", "onnxruntime", "transformers", "numpy")


def cpu_model_and_flags(cpuinfo: str | None = None) -> tuple[str, set[str]]:
    """The CPU's model name and its flags, from /proc/cpuinfo (``("unknown", set())`` where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return platform.processor() or "unknown", set()
    model, flags = "unknown", set[str]()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown":
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, flags


def library_versions(names: tuple[str, ...] = LIBRARIES) -> dict[str, str | None]:
    """Installed version of each library, None where it is not installed."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (runnable processes), None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info(*, threads: int) -> dict:
    """The record every run starts with: CPU, its features, cores, the threads given to each engine, versions, load.

    ``features`` lists those of ``FEATURES`` the CPU has; ``threads`` is what every engine was given
    (``torch.set_num_threads`` in this process, ``intra_threads`` in a child process)."""
    model, flags = cpu_model_and_flags()
    return {
        "cpu": model,
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "features": [f for f in FEATURES if f in flags],
        "threads": threads,
        "python": platform.python_version(),
        "versions": library_versions(),
        "load_average": load_average(),
        "malloc": allocator.setting(),  # glibc's thresholds move encoder timings (attnkit.allocator)
    }


def describe_machine(info: dict) -> str:
    """One line naming what ``machine_info`` recorded: CPU, features, threads, versions, load (and the GPU,
    where the run timed one: ``gpu.gpu_info``)."""
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v)
    load = info["load_average"]
    gpu = info.get("gpu")
    on_gpu = ""
    if gpu:
        on_gpu = f"{gpu['name']} (compute {gpu['capability']}, {gpu['memory_gib']} GiB, CUDA {gpu['cuda']}); "
    return (
        f"{on_gpu}{info['cpu']} ({info['cores']} cores; {' '.join(info['features']) or 'no AVX2'}); "
        f"{info['threads']} threads per engine; {versions}; {info.get('malloc', 'malloc not recorded')}; "
        f"load average {load}"
    )
