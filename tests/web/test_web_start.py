"""`pgworker web` started where it cannot listen: refused with the fix, before it says
that it serves."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_a_port_in_use_is_refused_with_the_fix_before_the_console_says_it_serves(app, pg_dsn):
    """It printed "pgworker console on http://127.0.0.1:PORT/", then uvicorn's "[Errno 98]
    error while attempting to bind ... address already in use", and exited 3."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = dict(os.environ, PGWORKER_DSN=pg_dsn, PGWORKER_SCHEMA=app.settings.schema)
        for k in ("PGWORKER_WEB_USERS", "PGWORKER_WEB_TOKENS", "PGWORKER_APP"):
            env.pop(k, None)
        proc = subprocess.run([sys.executable, "-m", "pgworker.cli", "web", "--port", str(port)], env=env,
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr == (f"error: port {port} on 127.0.0.1 is already in use (another `pgworker web`, or a "
                           "`pgworker demo --keep` console?): choose another with --port\n"), proc.stderr
    assert "pgworker console on" not in proc.stdout
