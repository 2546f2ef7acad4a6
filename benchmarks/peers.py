"""Procrastinate and PGQueuer beside pgworker (``--peers``).

Each peer lives in its own virtualenv under ``benchmarks/.peers/<name>`` (git-ignored),
made on first use with ``python -m venv`` and ``pip install`` of the pinned version, so
neither can change pgworker's dependencies. The driver (``peer_drivers.py``) runs with
that virtualenv's Python and uses only the peer's public API: bulk enqueue, then worker
processes in the peer's own drain mode, started together behind a barrier. Same job
count as pgworker's peer runs, no-op jobs, four processes, the server's
synchronous_commit. The settings tried for each are listed in ``configurations``; the
table shows each, and the targets compare with the best.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from .common import _counter

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS_DIR = os.path.join(HERE, ".peers")
PEERS = {
    # name: pip requirements (pinned: the versions measured)
    "pgqueuer": ["pgqueuer==1.6.0", "asyncpg>=0.29", "psycopg[binary]>=3.2"],
    "procrastinate": ["procrastinate==3.10.0", "psycopg[binary]>=3.2"],
}
PROCESSES = 4


def configurations(name: str) -> list[tuple[str, dict[str, Any]]]:
    """(label, driver options) for each setting measured.

    PGQueuer: ``QueueManager.run(batch_size=...)`` (its default is 10; 100 is its
    best here), asyncpg driver, drain mode, no tracing configured. Procrastinate:
    ``run_worker_async(concurrency=...)`` (default 1; 10 async jobs per process tried
    too), psycopg connector, ``wait=False`` (exit when the queue is empty), LISTEN on.
    """
    if name == "pgqueuer":
        return [(f"{PROCESSES} processes, batch_size {b}", {"processes": PROCESSES, "batch": b}) for b in (10, 100)]
    return [(f"{PROCESSES} processes, concurrency {c}", {"processes": PROCESSES, "concurrency": c}) for c in (1, 10)]


def python_for(name: str) -> str:
    """The peer's virtualenv Python, creating the virtualenv on first use."""
    venv = os.path.join(PEERS_DIR, name)
    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, ".installed")
    wanted = " ".join(PEERS[name])
    if not os.path.exists(marker) or open(marker).read() != wanted:
        subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True, env=_clean_env(), cwd=HERE)
        subprocess.run([python, "-m", "pip", "install", "-q", *PEERS[name]], check=True, env=_clean_env(), cwd=HERE)
        with open(marker, "w") as f:
            f.write(wanted)
    return python


def drain(name: str, dsn: str, *, jobs: int, settings: dict[str, Any]) -> dict[str, float]:
    schema = f"peer_{name}_{os.getpid()}_{next(_counter)}"
    cmd = [python_for(name), os.path.join(HERE, "peer_drivers.py"), name, "--dsn", dsn, "--schema", schema,
           "--jobs", str(jobs)]
    for k, v in settings.items():
        cmd += [f"--{k}", str(v)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=_clean_env(), cwd=HERE)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} driver failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _clean_env() -> dict[str, str]:
    """The environment without pgworker's settings or this process's import path."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PGWORKER_", "OTEL_", "PROMETHEUS_", "PYTHONPATH", "VIRTUAL_ENV"))}
