"""Dependency floors that correctness depends on, read from the installed metadata.

The dispatcher's listener calls ``conn.notifies(timeout=...)`` in a loop. psycopg
releases before 3.2.4 drop the notifications that arrive between two such calls
(psycopg 3.2.4 release notes: "Don't lose notifies received whilst the notifies()
iterator is not running", psycopg ticket #962): a wake-up would be lost and the job
would wait for the fallback poll. The declared requirement must keep those releases out.
(``packaging`` comes with pytest.)
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

pytestmark = pytest.mark.unit

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
PSYCOPG_FLOOR = Version("3.2.4")
LOWER_BOUNDS = (">=", "~=", "==", "===")


def _psycopg_requirement(requirements: list[str]) -> Requirement:
    found = [r for r in map(Requirement, requirements) if r.name == "psycopg" and r.marker is None]
    assert len(found) == 1, f"expected one unconditional psycopg requirement, found {found}"
    return found[0]


def test_declared_psycopg_requirement_excludes_releases_that_lose_notifications():
    declared = _psycopg_requirement(metadata.requires("pgworker") or [])
    floors = [Version(s.version) for s in declared.specifier if s.operator in LOWER_BOUNDS]
    assert floors and max(floors) >= PSYCOPG_FLOOR, (
        f"pgworker declares {declared}: releases before {PSYCOPG_FLOOR} lose notifications between "
        f"two notifies(timeout=...) calls; require psycopg[binary]>={PSYCOPG_FLOOR},<4")
    assert not declared.specifier.contains("3.2.3") and declared.specifier.contains(str(PSYCOPG_FLOOR))
    assert "binary" in declared.extras
    # The installed metadata is what pip resolved against: it must be pyproject.toml's
    # (an editable install made before an edit of pyproject.toml still declares the old one).
    in_pyproject = _psycopg_requirement(tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"])
    assert declared == in_pyproject, (
        f"installed metadata declares {declared}, pyproject.toml {in_pyproject}: reinstall "
        "(pip install -e '.[test]')")


def test_installed_psycopg_is_at_or_above_the_floor():
    installed = Version(metadata.version("psycopg"))
    declared = _psycopg_requirement(metadata.requires("pgworker") or [])
    assert installed >= PSYCOPG_FLOOR, f"psycopg {installed} loses notifications; upgrade it"
    assert declared.specifier.contains(installed), f"psycopg {installed} does not satisfy {declared}"
