"""A real `pgworker web` process for the console's tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
WEB_APP = os.path.join(os.path.dirname(HERE), "apps", "web_app.py") + ":app"
#: The admin token of the shared ``console`` fixture (conftest.py), and its header.
ADMIN_TOKENS = "ops:admin:admin-token-0123456789"
ADMIN_AUTH = {"Authorization": "Bearer admin-token-0123456789"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ConsoleServer:
    """`pgworker web` on a free port of 127.0.0.1 (or ``host``), its log in a file."""

    def __init__(self, dsn: str, schema: str, *args: str, env: dict[str, str] | None = None,
                 host: str = "127.0.0.1", log_dir: str | None = None, app: str | None = WEB_APP) -> None:
        self.port = free_port()
        self.host = host
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = dict(os.environ, PGWORKER_DSN=dsn, PGWORKER_SCHEMA=schema, PYTHONUNBUFFERED="1", **(env or {}))
        for name in ("PGWORKER_WEB_USERS", "PGWORKER_WEB_TOKENS", "PGWORKER_WEB_READ_ONLY"):
            if name not in (env or {}):
                self.env.pop(name, None)
        self.cmd = [sys.executable, "-m", "pgworker.cli", "web", "--host", host, "--port", str(self.port), *args]
        if app:
            self.cmd += ["--app", app]
        fd, self.log_path = tempfile.mkstemp(prefix="pgworker-web-", suffix=".log", dir=log_dir)
        self.log = os.fdopen(fd, "w+")
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, text=True)

    def wait_ready(self, timeout: float = 30.0) -> "ConsoleServer":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"pgworker web exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                requests.get(self.url + "/static/console.css", timeout=1)
                return self
            except requests.ConnectionError:
                time.sleep(0.1)
        raise AssertionError(f"pgworker web did not answer within {timeout}s:\n{self.logs()}")

    def get(self, path: str, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 30)
        kw.setdefault("allow_redirects", False)
        return requests.get(self.url + path, **kw)

    def post(self, path: str, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 30)
        kw.setdefault("allow_redirects", False)
        return requests.post(self.url + path, **kw)

    def logs(self) -> str:
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def kill9(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill9()

    def __enter__(self) -> "ConsoleServer":
        return self.wait_ready()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        self.log.close()
