"""The Dockerfile built and run: buildah from Debian's packages (``--isolation chroot``; no
Docker engine, no OCI runtime) on a base made with debootstrap (tests/deploy/imagetools.py
says how, and how it is cached), then the image run as the chart runs it: its own
ENTRYPOINT with the chart's arguments, as its own non-root user, against the host's
PostgreSQL on a fresh schema.

Outside CI a missing buildah or debootstrap, or a user other than root, skips these
tests with the reason; under PGWORKER_STRICT=1 (CI) it fails them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import psycopg
import psycopg.sql
import pytest

import imagetools
from deploytools import ROOT
from pg import make_settings
from pgworker import App, __version__
from pgworker.migrate import latest_version

pytestmark = [pytest.mark.deploy, pytest.mark.integration,
              # the first test builds the image (and, on a machine new to it, the base)
              pytest.mark.timeout(imagetools.BUILD_TIMEOUT + imagetools.DEBOOTSTRAP_TIMEOUT)]

#: chroot isolation has no PID namespace: tini is not PID 1, and without this it warns
#: that it cannot reap orphans (in a pod it is PID 1 and needs nothing).
CHROOT_ENV = {"TINI_SUBREAPER": "1"}
UID = 10001
JOBS = 5


@pytest.fixture(scope="module")
def image():
    """(buildah, image name, its OCI config): the Dockerfile built once for the module."""
    configured = os.environ.get("PGWORKER_IMAGE_BASE", "")
    buildah = imagetools.Buildah(imagetools.require_tools(need_debootstrap=not configured))
    imagetools.remove_stale_test_images(buildah)
    if configured:
        base, base_seconds = configured, None
    else:
        base, base_seconds = imagetools.debian_base(buildah)
    tag = f"{imagetools.TEST_REPOSITORY}:{__version__}-{os.getpid()}"
    started = time.monotonic()
    imagetools.build_image(buildah, ROOT, base, tag)
    built = time.monotonic() - started
    how = ("PGWORKER_IMAGE_BASE" if configured else "debootstrapped base from the cache" if base_seconds is None
           else f"debootstrapped in {base_seconds:.0f} s")
    imagetools.REPORT.append(f"image {tag}: built in {built:.0f} s on {base} ({how})")
    yield buildah, tag, buildah.image_config(tag)
    buildah("rmi", "--force", tag, check=False)


@pytest.fixture
def container(image):
    """A fresh working container of the image, removed after the test; yields a runner of
    commands in it: run(argv, env=..., volumes=...) -> CompletedProcess."""
    buildah, tag, _ = image
    ctr = buildah("from", tag).stdout.strip()

    def run(argv: list[str], env: dict[str, str] | None = None, volumes: dict[Path, str] | None = None,
            timeout: float = 300):
        args = ["run", "--isolation", "chroot"]
        for key, value in {**CHROOT_ENV, **(env or {})}.items():
            args += ["--env", f"{key}={value}"]
        for host, inside in (volumes or {}).items():
            args += ["--volume", f"{host}:{inside}:ro"]
        return buildah(*args, ctr, "--", *argv, timeout=timeout, check=False)

    yield run
    buildah("rm", ctr, check=False)


def entrypoint(image) -> list[str]:
    """What Kubernetes runs for a container without `command` (the chart sets only args)."""
    return list(image[2]["Entrypoint"])


def db_env(pg_dsn: str, schema: str) -> dict[str, str]:
    # the host's network (chroot isolation shares it): 127.0.0.1 is the host's PostgreSQL
    return {"PGWORKER_DSN": pg_dsn, "PGWORKER_SCHEMA": schema, "PGWORKER_METRICS_PORT": "0"}


def test_version_as_the_non_root_user(image, container):
    assert image[2]["User"] == f"{UID}:{UID}"
    result = container(entrypoint(image) + ["--version"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == f"pgworker {__version__}"
    who = container(["python", "-c", "import os, sys, pgworker; "
                     "print(os.getuid(), os.getgid(), sys.executable, pgworker.__file__)"])
    assert who.returncode == 0, who.stderr
    uid, gid, executable, module = who.stdout.split()
    assert (int(uid), int(gid)) == (UID, UID)
    assert executable == "/opt/venv/bin/python"
    assert module.startswith("/opt/venv/lib/python3.11/site-packages/pgworker/")


def test_migrate_a_fresh_schema(image, container, pg_dsn, schema):
    result = container(entrypoint(image) + ["migrate", "--json"], env=db_env(pg_dsn, schema))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert (report["schema"], report["version_before"], report["version_after"]) == (schema, 0, latest_version())
    with psycopg.connect(pg_dsn) as conn:
        versions = conn.execute(psycopg.sql.SQL("SELECT max(version) FROM {}.migrations")
                                .format(psycopg.sql.Identifier(schema))).fetchone()[0]
    assert versions == latest_version()
    again = container(entrypoint(image) + ["migrate", "--json"], env=db_env(pg_dsn, schema))
    assert again.returncode == 0 and json.loads(again.stdout)["applied"] == [], again.stdout + again.stderr


def test_drain_run(image, container, pg_dsn, schema, tmp_path):
    env = db_env(pg_dsn, schema)
    migrated = container(entrypoint(image) + ["migrate"], env=env)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    ident = psycopg.sql.Identifier(schema)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE TABLE {}.image_ledger (job_id bigint PRIMARY KEY, square int, "
                                     "uid int, executable text)").format(ident))
    producer = App(settings=make_settings(pg_dsn, schema))  # a pure producer: tasks by name
    try:
        ids = [producer.enqueue("image.square", {"n": n}, queue="image") for n in range(1, JOBS + 1)]
    finally:
        producer.close()
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    shutil.copy(Path(__file__).with_name("image_app.py"), app_dir / "image_app.py")
    # The chart's drain arguments (templates/_helpers.tpl, pgworker.drainArgs)
    result = container(entrypoint(image) + ["run", "--drain", "--max-duration", "120s", "--concurrency", "2"],
                       env={**env, "PGWORKER_APP": "/app/image_app.py:app"}, volumes={app_dir: "/app"})
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["event"] == "drain_summary"
    assert (summary["succeeded"], summary["dead"], summary["left"]) == (JOBS, 0, 0), summary
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(psycopg.sql.SQL("SELECT job_id, square, uid, executable FROM {}.image_ledger "
                                            "ORDER BY job_id").format(ident)).fetchall()
        states = conn.execute(psycopg.sql.SQL("SELECT state::text, count(*) FROM {}.jobs GROUP BY 1")
                              .format(ident)).fetchall()
    # the claimers are spawned processes of the venv's interpreter (python or python3)
    assert [(r[0], r[1], r[2], r[3].rstrip("3")) for r in rows] == [
        (i, n * n, UID, "/opt/venv/bin/python") for i, n in zip(ids, range(1, JOBS + 1))]
    assert states == [("succeeded", JOBS)]


def test_no_compiler_in_the_image(image):
    """The build is wheels only (pip --only-binary): no toolchain in the final image."""
    buildah, tag, _ = image
    ctr = buildah("from", tag).stdout.strip()
    try:
        rootfs = Path(buildah("mount", ctr).stdout.strip())
        found = [f"{d}/{tool}" for d in ("usr/bin", "usr/local/bin", "opt/venv/bin")
                 for tool in ("gcc", "cc", "c++", "g++", "make", "ld")
                 if (rootfs / d / tool).exists() or (rootfs / d / tool).is_symlink()]
        assert found == []
        assert (rootfs / "usr/bin/tini").exists()
    finally:
        buildah("umount", ctr, check=False)
        buildah("rm", ctr, check=False)
