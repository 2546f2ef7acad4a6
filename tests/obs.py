"""Helpers of the observability tests: scraping and parsing /metrics over HTTP, the real
external tools (promtool, a Prometheus server, a Pushgateway) and a throwaway PostgreSQL
cluster that a test may stop and start.

A missing external tool fails the test under ``PGWORKER_STRICT=1`` (CI) and skips it
with the reason otherwise.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from typing import Any, Iterator, Sequence

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from pg import wait_until


def strict() -> bool:
    return os.environ.get("PGWORKER_STRICT", "") not in ("", "0", "false", "no")


def require_tool(name: str, hint: str) -> str:
    """Path of an executable on PATH; fails (strict) or skips the test when it is missing."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not available ({hint})"
        if strict():
            pytest.fail(f"{message}; PGWORKER_STRICT=1 requires it", pytrace=False)
        pytest.skip(message)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- /metrics --------------------------------------------------------------------------


def get(port: int, path: str, timeout: float = 10.0) -> requests.Response:
    return requests.get(f"http://127.0.0.1:{port}{path}", timeout=timeout)


def scrape(port: int) -> str:
    r = get(port, "/metrics")
    r.raise_for_status()
    return r.text


def try_scrape(port: int) -> str | None:
    try:
        return scrape(port)
    except requests.RequestException:
        return None


def samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of an exposition, through prometheus_client's parser."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            yield s.name, dict(s.labels), s.value


def total(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(v for n, ls, v in samples(text) if n == name and all(ls.get(k) == x for k, x in labels.items()))


def series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(ls, v) for n, ls, v in samples(text) if n == name]


def wait_for_metrics(port: int, predicate: Any, timeout: float = 60.0, message: str = "metrics") -> str:
    """Scrape until ``predicate(text)`` holds; returns that exposition."""
    last: list[str] = [""]

    def check() -> str | None:
        text = try_scrape(port)
        if text is None:
            return None
        last[0] = text
        return text if predicate(text) else None

    return wait_until(check, timeout, 0.2, message=lambda: f"{message}; last scrape:\n"
                      + "\n".join(line for line in last[0].splitlines() if line.startswith("pgworker_")))


def wait_ready(port: int, timeout: float = 60.0) -> None:
    def ready() -> bool:
        try:
            return get(port, "/readyz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    wait_until(ready, timeout, 0.1, message=f"/readyz on port {port}")


# -- external servers ------------------------------------------------------------------


class Server:
    """An external server process started (and stopped) by a test."""

    def __init__(self, cmd: list[str], port: int, ready_path: str, name: str, workdir: str | None = None) -> None:
        self.port = port
        self.dir = workdir or tempfile.mkdtemp(prefix=f"pgworker-test-{name}-")
        self.log_path = os.path.join(self.dir, "log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.dir)

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{name} exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                return requests.get(self.url(ready_path), timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_until(ready, 60, 0.1, message=f"{name} to be ready")

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def logs(self) -> str:
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def prometheus_server(scrape_port: int, rule_files: Sequence[str] = ()) -> Server:
    """A real Prometheus scraping 127.0.0.1:``scrape_port`` every second (loopback only,
    storage in a temporary directory), evaluating the rules of ``rule_files`` (absolute
    paths) every second."""
    binary = require_tool("prometheus", "Debian: apt-get install -y prometheus")
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="pgworker-test-prometheus-")
    config = os.path.join(tmp, "prometheus.yml")
    with open(config, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: pgworker\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{scrape_port}']\n")
        if rule_files:
            f.write("rule_files:\n" + "".join(f"  - '{path}'\n" for path in rule_files))
    return Server([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp}/data",
                   f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                  port, "/-/ready", "prometheus", workdir=tmp)


def pushgateway_server() -> Server:
    binary = require_tool("prometheus-pushgateway", "Debian: apt-get install -y prometheus-pushgateway")
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="pgworker-test-pushgateway-")
    # Debian's build persists to /var/lib/prometheus by default: keep this one's state private
    return Server([binary, f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
                   f"--persistence.file={tmp}/pushgateway.data"],
                  port, "/-/ready", "pushgateway", workdir=tmp)


# -- a PostgreSQL cluster the test owns -------------------------------------------------


class Cluster:
    """A throwaway PostgreSQL cluster (initdb/pg_ctl; as the postgres user when running
    as root, since initdb refuses root) on a free loopback port. Unlike the shared server,
    a test may stop and start it."""

    def __init__(self) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        initdb = shutil.which("initdb") or (bins[-1] if bins else None)
        if initdb is None:
            require_tool("initdb", "Debian: apt-get install -y postgresql")
        self.bindir = os.path.dirname(initdb)  # type: ignore[arg-type]
        self.prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.data = tempfile.mkdtemp(prefix="pgworker-test-cluster-")
        if self.prefix:
            shutil.chown(self.data, "postgres", "postgres")
        self.port = free_port()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        subprocess.run(self.prefix + [initdb, "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                       check=True, capture_output=True)

    def _pg_ctl(self, *args: str) -> None:
        subprocess.run(self.prefix + [os.path.join(self.bindir, "pg_ctl"), "-D", self.data, *args],
                       check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self._pg_ctl("-w", "-l", os.path.join(self.data, "log"), "-o",
                     f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1", "start")

    def stop(self) -> None:
        self._pg_ctl("-w", "-m", "fast", "stop")

    def destroy(self) -> None:
        try:
            self._pg_ctl("-m", "immediate", "stop")
        except Exception:
            pass
        shutil.rmtree(self.data, ignore_errors=True)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()


def tcp_client_ports(pid: int) -> set[int]:
    """Local TCP ports of the sockets process ``pid`` holds (Linux /proc): with
    pg_stat_activity.client_port they tell which sessions belong to that process."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
