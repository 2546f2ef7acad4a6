"""The pod's health: what /healthz and /readyz say, and the HTTP server that also serves /metrics.

/healthz never touches the database: it fails only when the supervisor's loop stopped
ticking (a stuck supervisor). /readyz reads flags the services and claimers set: the
database reachable and writable, the schema at this pgworker's version, the LISTEN
connection up (when LISTEN is on), and every claimer able to claim and to write its
outcomes.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from ..errors import ConfigError

log = logging.getLogger("pgworker.health")

SUPERVISION_STALL_SECONDS = 30.0
UNAVAILABLE = "database unavailable"
READ_ONLY = "database is read-only (a standby?): waiting for a writable primary"
GRANTS = "missing grants"
BUSY = "database busy"
PREPARED = "prepared statements fail behind a pooler: set PGWORKER_PREPARED_STATEMENTS=false"


class HealthState:
    """Flags behind /healthz and /readyz; services report through :meth:`db_ok` and
    :meth:`db_failed`. ``claimer_problem()`` (set by the supervisor) names a claimer that
    cannot write its outcomes, or returns None."""

    def __init__(self) -> None:
        self.last_tick = time.monotonic()
        self.stopped = False
        self.connected = False
        self.listening = False
        self.schema_ok = False
        self.reason = "starting"
        self.listen_required = True
        self.writable = True
        self.claimer_problem: Callable[[], str | None] = lambda: None

    def tick(self) -> None:
        self.last_tick = time.monotonic()

    def db_ok(self) -> None:
        """A statement went through: connected and writable again."""
        self.connected = True
        self.writable = True
        if self.reason != "shutting down":
            self.reason = "ok"

    def db_failed(self, kind: str, detail: str = "") -> None:
        """What /readyz says while the database is away or read-only (``kind`` from
        :func:`pgworker.db.failure_kind`), the role lacks the worker's grants (``kind``
        'grants'), or a lock holds the start's schema check (``kind`` 'busy'); ``detail`` a
        password-free reason."""
        if self.reason == "shutting down":
            return
        if kind == "read-only":
            self.writable = False
            self.reason = READ_ONLY
        elif kind == "unreachable":
            self.connected = False
            self.reason = f"{UNAVAILABLE}: {detail}" if detail else UNAVAILABLE
        elif kind == "prepared-statements":
            self.reason = PREPARED
        elif kind in ("grants", "busy"):  # connected, but claims would be refused, or a lock holds the start
            self.connected = True
            self.reason = f"{GRANTS if kind == 'grants' else BUSY}: {detail}"

    @property
    def alive(self) -> bool:
        return not self.stopped and time.monotonic() - self.last_tick < SUPERVISION_STALL_SECONDS

    @property
    def ready(self) -> bool:
        return self.why_not_ready() is None

    def why_not_ready(self) -> str | None:
        """None when ready, else what /readyz reports. Reads flags only: no database access."""
        if self.reason == "shutting down":
            return self.reason
        if not self.alive:
            return "supervisor loop stalled"
        if not self.connected:
            if self.reason == "starting":
                return "starting: connecting to PostgreSQL"
            return self.reason if self.reason.startswith(UNAVAILABLE) else UNAVAILABLE
        if not self.writable:
            return self.reason if "read-only" in self.reason else "database is read-only"
        if self.reason.startswith(("prepared statements", GRANTS, BUSY)):
            return self.reason
        if not self.schema_ok:
            return "schema version not checked"
        if self.listen_required and not self.listening:
            return "LISTEN connection down (reconnecting)"
        return self.claimer_problem()


def serve_http(host: str, port: int, registry: Any, health: HealthState) -> ThreadingHTTPServer:
    """Serve /metrics (``registry``, a prometheus_client CollectorRegistry), /healthz and
    /readyz on ``host:port`` in a daemon thread.

    Raises :class:`ConfigError` naming the flag to change when the address is taken
    (another ``pgworker run`` on this host) or cannot be bound.
    """
    # imported here: prometheus_client must not be imported before `pgworker run` has set
    # PROMETHEUS_MULTIPROC_DIR (it reads the variable at import)
    from prometheus_client import generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                try:
                    body = generate_latest(registry)
                    self._send(200, body, CONTENT_TYPE_LATEST)
                except Exception as exc:
                    log.exception("rendering /metrics failed")
                    self._send(500, f"metrics failed: {type(exc).__name__}\n".encode(), "text/plain")
            elif path == "/healthz":
                ok = health.alive
                self._send(200 if ok else 503, b"ok\n" if ok else b"supervisor loop stalled\n", "text/plain")
            elif path == "/readyz":
                why = health.why_not_ready()
                msg = "ready\n" if why is None else f"not ready: {why}\n"
                self._send(200 if why is None else 503, msg.encode(), "text/plain")
            else:
                self._send(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {port} on {host} is already in use (another `pgworker run` on this host?): give this "
                "worker its own port with --metrics-port (PGWORKER_METRICS_PORT), or --metrics-port 0 for no "
                "HTTP server") from None
        raise ConfigError(f"cannot serve /metrics on {host}:{port}: {exc.strerror}; set --metrics-host "
                          "(PGWORKER_METRICS_HOST) and --metrics-port (PGWORKER_METRICS_PORT)") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="pgworker-http", daemon=True).start()
    return server
