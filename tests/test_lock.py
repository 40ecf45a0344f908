"""The locked test environment (requirements/test.txt) is the one CI and the README install, and it covers
pyproject.toml: a dependency added to the package or to the test/docs extras without `pip-compile` fails here, on
the machine of whoever added it, not on a fresh CI machine."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "test.txt"

if sys.version_info >= (3, 11):
    import tomllib
else:  # the lock is made for Python 3.11; on 3.10 the tests read pyproject.toml with tomli where it is installed
    tomllib = pytest.importorskip("tomli")


def _locked() -> dict[str, tuple[Version, int]]:
    """name -> (pinned version, number of hashes) of every package in the lock."""
    pins: dict[str, tuple[Version, int]] = {}
    for block in re.split(r"\n(?=\S)", LOCK.read_text()):
        match = re.match(r"([A-Za-z0-9_.\-]+)==(\S+)", block)
        if match:
            pins[canonicalize_name(match[1])] = (Version(match[2]), block.count("--hash=sha256:"))
    return pins


def _required() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(line) for line in [*project["dependencies"], *extras["test"], *extras["docs"]]]


def test_every_requirement_of_the_package_and_its_test_and_docs_extras_is_locked_inside_its_range():
    locked = _locked()
    for requirement in _required():
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{name} is required by pyproject.toml but not in {LOCK.name}: run pip-compile"
        version, hashes = locked[name]
        assert requirement.specifier.contains(version, prereleases=True), f"{name}=={version} outside {requirement}"
        assert hashes >= 1, f"{name} is locked without a hash"


def test_the_lock_pins_the_cpu_torch_of_the_readme_and_every_package_with_hashes():
    locked = _locked()
    assert locked["torch"][0] == Version("2.13.0+cpu")
    assert all(hashes >= 1 for _, hashes in locked.values())
    assert "setuptools" in locked  # the editable install builds with the locked setuptools (--no-build-isolation)


def test_ci_and_the_readme_install_from_the_lock():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -r requirements/test.txt" in ci and "--no-build-isolation" in ci
    assert not re.search(r"pip install [^\n]*\.\[test\]", ci)  # no second, unlocked resolution of the extras
    readme = (ROOT / "README.md").read_text()
    assert "```bash\nbash .ci/run\n```" in readme
