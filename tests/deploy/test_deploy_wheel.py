"""The package as users get it: `python -m build` makes an sdist and, from it, a wheel;
both carry every file of pgworker/ (the SQL the package reads at run time, the py.typed
marker); the wheel, installed into a fresh virtualenv, runs `pgworker --version` and
`pgworker migrate` from a folder outside the checkout, so nothing comes from the source
tree. And the version is one: pgworker.__version__, the wheel's, CHANGELOG.md's latest.

The CLI reads no file outside its package at run time (the Grafana dashboard and the
alert rules are deployment files, shipped by the chart and docs/deploy.md): the package
data is the SQL and py.typed, and test_every_package_file_is_in_the_wheel keeps any file
added to pgworker/ later in the wheel too.
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import psycopg
import psycopg.sql
import pytest
import yaml

from deploytools import CHART, ROOT
from pgworker import __version__
from pgworker.migrate import latest_version

pytestmark = [pytest.mark.deploy, pytest.mark.integration, pytest.mark.timeout(900)]

CHANGELOG = ROOT / "CHANGELOG.md"


def source_files() -> list[str]:
    """The files a fresh clone of this tree would have: tracked, or new and not ignored."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.fail(f"git ls-files failed in {ROOT}: {listed.stderr.decode()}: the build test needs a git checkout")
    return sorted(p for p in listed.stdout.decode().split("\0") if p and (ROOT / p).is_file())


def package_files() -> list[str]:
    """Every file of pgworker/ in the tree (as a fresh clone of it would have them)."""
    return [p for p in source_files() if p.startswith("pgworker/")]


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel, built from a copy of the tree's files: setuptools reuses
    a pgworker.egg-info left in the folder it builds in (its SOURCES.txt can put in the
    sdist a file the configuration no longer names), and the build leaves one behind."""
    src = tmp_path_factory.mktemp("src")
    for name in source_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(src)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    found = {"sdist": list(out.glob("*.tar.gz")), "wheel": list(out.glob("*.whl"))}
    assert all(len(v) == 1 for v in found.values()), found
    return {kind: paths[0] for kind, paths in found.items()}


def wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def test_dist_files_are_named_after_the_version(dist):
    assert dist["wheel"].name == f"pgworker-{__version__}-py3-none-any.whl"
    assert dist["sdist"].name == f"pgworker-{__version__}.tar.gz"


def test_every_package_file_is_in_the_wheel(dist):
    names = wheel_names(dist["wheel"])
    expected = package_files()
    assert "pgworker/py.typed" in expected and "pgworker/sql/schema.sql" in expected
    assert sorted(set(expected) - set(names)) == []
    # nothing else: no tests, docs or build leftovers beside the package and its metadata
    info = f"pgworker-{__version__}.dist-info/"
    assert [n for n in names if not (n.startswith("pgworker/") or n.startswith(info))] == []


def test_wheel_metadata(dist):
    with zipfile.ZipFile(dist["wheel"]) as z:
        info = f"pgworker-{__version__}.dist-info"
        meta = email.parser.Parser().parsestr(z.read(f"{info}/METADATA").decode())
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    assert (meta["Name"], meta["Version"], meta["Requires-Python"]) == ("pgworker", __version__, ">=3.11")
    assert any(r.startswith("psycopg[binary]") for r in meta.get_all("Requires-Dist"))
    assert re.search(r"^\[console_scripts\]\npgworker = pgworker\.cli:main$", entry_points, flags=re.M)


def test_sdist_carries_the_package_and_the_changelog(dist):
    with tarfile.open(dist["sdist"]) as tar:
        prefix = f"pgworker-{__version__}/"
        names = {n.removeprefix(prefix) for n in tar.getnames()}
    missing = sorted({*package_files(), "pyproject.toml", "README.md", "CHANGELOG.md"} - names)
    assert missing == []


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """(the venv's bin folder, a working folder outside the checkout, an environment with
    nothing pointing back at the checkout): the wheel installed into a fresh virtualenv."""
    where = tmp_path_factory.mktemp("installed")
    assert ROOT not in where.parents
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PGWORKER_", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", str(dist["wheel"])],
                            cwd=where, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return venv / "bin", where, env


def test_installed_wheel_reports_its_version_from_its_own_files(installed):
    bin_dir, cwd, env = installed
    version = subprocess.run([str(bin_dir / "pgworker"), "--version"], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"pgworker {__version__}"
    probe = ("import json, pgworker; from importlib import resources; "
             "print(json.dumps({'file': pgworker.__file__, "
             "'typed': resources.files('pgworker').joinpath('py.typed').is_file()}))")
    where = subprocess.run([str(bin_dir / "python"), "-c", probe], cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr
    found = json.loads(where.stdout)
    module = Path(found["file"])
    assert bin_dir.parent in module.parents and ROOT not in module.parents, module
    assert found["typed"] is True


def test_installed_wheel_migrates_a_fresh_schema(installed, pg_dsn, schema):
    bin_dir, cwd, env = installed
    result = subprocess.run([str(bin_dir / "pgworker"), "migrate", "--dsn", pg_dsn, "--schema", schema, "--json"],
                            cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert (report["version_before"], report["version_after"]) == (0, latest_version())
    with psycopg.connect(pg_dsn) as conn:
        applied = conn.execute(psycopg.sql.SQL("SELECT count(*) FROM {}.migrations")
                               .format(psycopg.sql.Identifier(schema))).fetchone()[0]
    assert applied == latest_version()


def changelog_versions() -> list[str]:
    """The versions of CHANGELOG.md's `## [x.y.z]` headings, in order ([Unreleased] left out)."""
    headings = re.findall(r"^## \[([^\]]+)\]", CHANGELOG.read_text(), flags=re.M)
    return [h for h in headings if h.lower() != "unreleased"]


def test_changelog_latest_version_is_the_package_version():
    from packaging.version import Version

    versions = changelog_versions()
    assert versions, f"{CHANGELOG.name} has no '## [x.y.z]' heading"
    assert versions[0] == __version__, (
        f"{CHANGELOG.name}'s latest version is {versions[0]}, pgworker.__version__ is {__version__}: "
        f"add a '## [{__version__}]' section at the top")
    assert [Version(v) for v in versions] == sorted((Version(v) for v in versions), reverse=True)


def test_chart_app_version_is_the_package_version():
    """The chart deploys this version's image by default (its appVersion is the tag)."""
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"] == __version__
