"""A throwaway PostgreSQL cluster that a test or a harness owns and may stop, restart or
make read-only: never the shared server on 5432.

``initdb``/``pg_ctl`` run as the ``postgres`` user via ``runuser`` when we are root
(initdb refuses root). The cluster listens on 127.0.0.1 on a free port, in a temporary
directory removed by :meth:`Cluster.destroy`. ``missing_tools()`` says what is absent, so
callers can skip (or, with ``PGWORKER_STRICT=1``, fail) with a reason.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time

import psycopg


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def pg_bindir() -> str | None:
    """The directory of initdb/pg_ctl: on PATH, else the newest /usr/lib/postgresql/*/bin."""
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(found)
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                  key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return os.path.dirname(bins[-1]) if bins else None


def missing_tools() -> str | None:
    """A reason when a throwaway cluster cannot be made here, else None."""
    if pg_bindir() is None:
        return "initdb/pg_ctl not found (Debian: apt-get install postgresql)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser (needed to run initdb as postgres)"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and no 'postgres' user to run initdb as"
    return None


class Cluster:
    """One throwaway cluster. ``start()`` after construction; ``destroy()`` at the end."""

    def __init__(self, *, auth: str = "trust", settings: dict[str, str] | None = None,
                 password: str | None = None) -> None:
        self.bindir = pg_bindir()
        if self.bindir is None:
            raise RuntimeError(missing_tools() or "no initdb")
        self.root = os.geteuid() == 0
        self.data = tempfile.mkdtemp(prefix="pgworker-cluster-")
        self.port = free_port()
        self.auth = auth
        self.password = password
        self.settings = {"listen_addresses": "127.0.0.1", "max_connections": "200",
                         "fsync": "off", "full_page_writes": "off", **(settings or {})}
        if self.root:
            shutil.chown(self.data, "postgres", "postgres")
        self._initdb()

    # -- plumbing ---------------------------------------------------------------------

    def _prefix(self) -> list[str]:
        return ["runuser", "-u", "postgres", "--"] if self.root else []

    def _run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(self._prefix() + list(args), check=check, capture_output=True, text=True,
                              timeout=timeout)

    def _initdb(self) -> None:
        cmd = [os.path.join(self.bindir, "initdb"), "-D", self.data, "-U", "postgres", "-E", "UTF8",
               "--auth-local=trust", f"--auth-host={self.auth}"]
        pwfile = None
        if self.password:
            pwfile = os.path.join(self.data, "..", f"pw-{os.path.basename(self.data)}")
            with open(pwfile, "w") as f:
                f.write(self.password)
            if self.root:
                shutil.chown(pwfile, "postgres", "postgres")
            cmd.append(f"--pwfile={pwfile}")
        try:
            self._run(*cmd)
        finally:
            if pwfile:
                os.unlink(pwfile)
        with open(os.path.join(self.data, "postgresql.auto.conf"), "a") as f:
            for k, v in self.settings.items():
                f.write(f"{k} = '{v}'\n")

    # -- the cluster's life -------------------------------------------------------------

    def dsn(self, user: str = "postgres", password: str | None = None, dbname: str = "postgres") -> str:
        auth = f"{user}:{password}" if password else user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"

    @property
    def admin_dsn(self) -> str:
        """Superuser over the Unix socket (trust), whatever the host auth method."""
        return f"host={self.data} port={self.port} user=postgres dbname=postgres"

    def start(self, timeout: float = 60) -> None:
        self._run(os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-w", "-t", str(int(timeout)),
                  "-l", os.path.join(self.data, "server.log"),
                  "-o", f"-p {self.port} -k {self.data}", "start", timeout=timeout + 10)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: 'fast' (roll back sessions, clean shutdown) or 'immediate' (like
        a crash: recovery runs at the next start)."""
        self._run(os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-w", "-m", mode, "stop", check=False)

    def running(self) -> bool:
        return self._run(os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "status", check=False).returncode == 0

    def restart(self, mode: str = "fast", down_seconds: float = 0.0) -> tuple[float, float]:
        """Stop, stay down ``down_seconds``, start. Returns (went down, back up) as time.time()."""
        self.stop(mode)
        down = time.time()
        time.sleep(down_seconds)
        self.start()
        return down, time.time()

    def set_read_only(self, on: bool) -> None:
        """``default_transaction_read_only`` for new transactions (what clients of a standby
        see: writes fail with SQLSTATE 25006), applied with a reload."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as c:
            c.execute(f"ALTER SYSTEM SET default_transaction_read_only = {'on' if on else 'off'}")
            c.execute("SELECT pg_reload_conf()")

    def execute(self, query: str, params: object = None) -> list[tuple]:
        with psycopg.connect(self.admin_dsn, autocommit=True) as c:
            cur = c.execute(query, params)
            return cur.fetchall() if cur.description else []

    def log(self) -> str:
        try:
            with open(os.path.join(self.data, "server.log")) as f:
                return f.read()
        except OSError:
            return ""

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.data, ignore_errors=True)

    def __enter__(self) -> "Cluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def strict() -> bool:
    """PGWORKER_STRICT=1 (CI): a missing tool fails the test instead of skipping it."""
    return os.environ.get("PGWORKER_STRICT", "") not in ("", "0", "false", "no")


def require(reason: str | None) -> None:
    """Skip (or fail under PGWORKER_STRICT=1) when ``reason`` says a tool is missing."""
    if reason is None:
        return
    import pytest

    if strict():
        pytest.fail(f"{reason} (PGWORKER_STRICT=1: a missing tool fails)")
    pytest.skip(reason)
