"""The oldest PyTorch that attnkit trusts to open a pickle file, and the check that enforces it.

attnkit's own artifacts are safetensors and JSON, which cannot run code when loaded. Only ``attnkit convert
--from-pickle`` reads a pickle (``torch.save`` output), and then only through ``torch.load(weights_only=True)``,
whose restricted unpickler is the one thing standing between a malicious file and code execution.
"""

from __future__ import annotations

import re

import torch

from attnkit.errors import InputError

# torch.load's weights_only unpickler could be made to run code by a crafted file: CVE-2025-32434 was fixed in
# torch 2.6.0, and CVE-2026-24747 (advisory GHSA-63cw-57p8-fm3p: affected <= 2.9.1) in torch 2.10.0. Below 2.10,
# weights_only=True is not a safety boundary, so attnkit refuses to unpickle anything there.
MIN_TORCH = (2, 10)
RECOMMENDED_TORCH = "2.13.0"  # the version attnkit is tested with

# "2.13.0", "2.13.0+cpu", "2.10.0a0+git1234", "2.11.0.dev20260101", "2.10.0rc1", "2.10.0.post1", "2.10"
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?(?P<rest>[^+]*)(?:\+.*)?")
_PRE_RELEASE = re.compile(r"\.?(a|b|rc|dev|alpha|beta|pre)", re.IGNORECASE)


def parse_torch_version(version: str) -> tuple[tuple[int, int, int], bool]:
    """``"2.10.0a0+git"`` -> ``((2, 10, 0), True)``: the release numbers and whether it is a pre-release.

    Raises InputError for a string that does not start with ``MAJOR.MINOR``.
    """
    match = _VERSION.fullmatch(str(version).strip())
    if match is None:
        raise InputError(f"cannot read the torch version {version!r}; pip install torch=={RECOMMENDED_TORCH}")
    major, minor, patch = (int(part) if part else 0 for part in match.group(1, 2, 3))
    return (major, minor, patch), bool(_PRE_RELEASE.match(match.group("rest")))


def check_torch(version: str = torch.__version__) -> None:
    """Raise InputError unless ``version`` is at least ``MIN_TORCH``.

    A pre-release of the minimum itself ("2.10.0a0", a nightly or source build from before the release) is refused:
    its version number cannot tell whether it already has the fix.
    """
    numbers, pre_release = parse_torch_version(version)
    minimum = (*MIN_TORCH, 0)
    if numbers < minimum or (numbers == minimum and pre_release):
        needed = ".".join(map(str, MIN_TORCH))
        raise InputError(
            f"attnkit needs torch >= {needed} to load pickle files safely (torch.load's weights_only unpickler "
            f"could run code before 2.10.0: CVE-2025-32434, CVE-2026-24747); you have {version}; "
            f"pip install torch=={RECOMMENDED_TORCH}"
        )
