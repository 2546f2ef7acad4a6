"""Building and running the Dockerfile's image without a Docker engine.

buildah (Debian's package) builds the Dockerfile with ``--isolation chroot`` and runs the
result the same way: no OCI runtime, no daemon, as root. Docker Hub is not reachable from
CI, so the base image (the Dockerfile's ``BASE_IMAGE`` argument) is assembled here with
debootstrap from Debian's packages: bookworm with python3, python3-venv and
ca-certificates, configured like the official Debian images. ``PGWORKER_IMAGE_BASE``
names another base instead (for example ``docker.io/library/python:3.11.14-slim-bookworm`` where its
registry is reachable); then debootstrap is not needed.

The images live in a buildah storage of their own, ``PGWORKER_BUILDAH_ROOT`` (default
``/var/cache/pgworker-ci/containers``), outside any checkout: the debootstrapped base is
kept there, named by a hash of its recipe, so later runs on the same machine reuse it
(``buildah --root <that> rmi localhost/pgworker-ci-base`` forgets it); the images under
test are removed after their tests.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

from deploytools import missing

RELEASE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
#: What the Dockerfile needs of its base beyond Debian's minimal system (python:3.11-slim
#: has all three: Python with venv and pip's CA certificates).
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
#: The apt sources of the official debian:bookworm images, so the Dockerfile's
#: `apt-get update && apt-get install` sees the suites it sees there.
APT_SOURCES = f"""\
Types: deb
URIs: {MIRROR}
Suites: {RELEASE} {RELEASE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {SECURITY_MIRROR}
Suites: {RELEASE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
#: The configuration of the official python images that the Dockerfile relies on.
BASE_ENV = ("LANG=C.UTF-8", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
BASE_REPOSITORY = "localhost/pgworker-ci-base"
#: Images under test: one per test run, removed after it (a killed run's are removed by
#: a later run once they are this old).
TEST_REPOSITORY = "localhost/pgworker-image-test"
STALE_TEST_IMAGE_SECONDS = 3 * 3600
#: The host's CA bundle, bind-mounted over the image's during RUN steps only: where
#: outgoing HTTPS passes through a proxy with its own CA (as on CI's machines), pip in the
#: image trusts what the host trusts, and nothing of the host ends up in a layer.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_TIMEOUT = 900
#: Lines for the end of the test run's output (tests/deploy/conftest.py): how long the
#: image and its base took, to keep an eye on CI's time.
REPORT: list[str] = []
DEBOOTSTRAP_TIMEOUT = 900


def storage_root() -> Path:
    return Path(os.environ.get("PGWORKER_BUILDAH_ROOT", "/var/cache/pgworker-ci/containers"))


def require_tools(need_debootstrap: bool) -> str:
    """buildah's path, after checking what building needs (a skip, or a failure under
    PGWORKER_STRICT=1, names what is missing)."""
    if os.geteuid() != 0:
        missing("root", "buildah's chroot isolation and debootstrap run as root; run the image tests as root")
    found = shutil.which("buildah")
    if not found:
        missing("buildah", "Debian: apt-get install -y buildah")
    if need_debootstrap and not shutil.which("debootstrap"):
        missing("debootstrap", "Debian: apt-get install -y debootstrap, or set PGWORKER_IMAGE_BASE to a "
                "base image buildah can pull, e.g. docker.io/library/python:3.11.14-slim-bookworm")
    return found  # type: ignore[return-value]


class Buildah:
    """buildah on the test storage; every call raises with buildah's output when it fails."""

    def __init__(self, executable: str) -> None:
        root = storage_root()
        self.prefix = [executable, "--root", str(root), "--runroot", f"/run/pgworker-ci/{root.name}"]

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([*self.prefix, *args], capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"buildah {' '.join(args)} exited {result.returncode}:\n"
                                 f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
        return result

    def image_exists(self, name: str) -> bool:
        return self("inspect", "--type", "image", name, check=False).returncode == 0

    def image_config(self, name: str) -> dict:
        """The OCI image config (User, Env, Entrypoint, Cmd, ...)."""
        return json.loads(self("inspect", "--type", "image", name).stdout)["OCIv1"]["config"]

    def images(self) -> list[dict]:
        return json.loads(self("images", "--json").stdout or "[]") or []


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    """One builder at a time per machine (two test runs sharing the cache)."""
    path = storage_root().parent / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def base_recipe_key() -> str:
    recipe = {"release": RELEASE, "mirror": MIRROR, "packages": BASE_PACKAGES, "sources": APT_SOURCES,
              "env": BASE_ENV, "variant": "minbase"}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def debian_base(buildah: Buildah) -> tuple[str, float | None]:
    """The debootstrapped base, built unless the cache has it: (image name, seconds spent
    building it, None when it came from the cache)."""
    name = f"{BASE_REPOSITORY}:{RELEASE}-{base_recipe_key()}"
    with _lock("base"):
        if buildah.image_exists(name):
            return name, None
        # A run killed while it built the base left its container (nothing else in this
        # storage starts from scratch, and the lock says no base is being built now).
        # An empty storage prints "null", not "[]".
        for ctr in json.loads(buildah("containers", "--json").stdout or "[]") or []:
            if ctr.get("imagename") == "scratch":
                buildah("rm", ctr["id"], check=False)
        started = time.monotonic()
        ctr = buildah("from", "scratch").stdout.strip()
        try:
            rootfs = Path(buildah("mount", ctr).stdout.strip())
            result = subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                 "--components=main", RELEASE, str(rootfs), MIRROR],
                capture_output=True, text=True, timeout=DEBOOTSTRAP_TIMEOUT)
            if result.returncode != 0:
                raise AssertionError(f"debootstrap exited {result.returncode}:\n{result.stdout[-4000:]}\n"
                                     f"{result.stderr[-4000:]}")
            (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
            (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(APT_SOURCES)
            # What the official images leave out too: the package lists and downloaded debs.
            for folder in ("var/lib/apt/lists", "var/cache/apt/archives"):
                for entry in (rootfs / folder).glob("*"):
                    if entry.is_file():
                        entry.unlink()
            buildah("umount", ctr)
            config = ["config", "--cmd", "bash", "--label",
                      f"org.opencontainers.image.description=Debian {RELEASE} minbase with "
                      f"{', '.join(BASE_PACKAGES)}, by debootstrap (pgworker's CI)"]
            for env in BASE_ENV:
                config += ["--env", env]
            buildah(*config, ctr)
            buildah("commit", "--rm", ctr, name, timeout=600)
        except BaseException:
            buildah("rm", ctr, check=False)
            raise
        # Bases of older recipes: nothing uses them any more.
        for image in buildah.images():
            for old in image.get("names") or []:
                if old.startswith(f"{BASE_REPOSITORY}:") and old != name:
                    buildah("rmi", old, check=False)
        return name, time.monotonic() - started


def remove_stale_test_images(buildah: Buildah) -> None:
    """Images under test left behind by runs that were killed before their teardown."""
    for image in buildah.images():
        created = image.get("created")  # unix seconds
        if not isinstance(created, (int, float)) or time.time() - created < STALE_TEST_IMAGE_SECONDS:
            continue
        for name in image.get("names") or []:
            if name.startswith(f"{TEST_REPOSITORY}:"):
                buildah("rmi", "--force", name, check=False)


def build_image(buildah: Buildah, context: Path, base: str, tag: str) -> subprocess.CompletedProcess[str]:
    """``buildah bud`` of the Dockerfile in ``context`` on ``base``; its output for the log."""
    args = ["bud", "--isolation", "chroot", "--build-arg", f"BASE_IMAGE={base}", "--tag", tag]
    if HOST_CA_BUNDLE.is_file():
        args += ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
    return buildah(*args, str(context), timeout=BUILD_TIMEOUT)
