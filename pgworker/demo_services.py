"""The local services ``pgworker demo`` runs its workload against: an HTTP endpoint that
receives the webhook deliveries and payments (failing some on purpose, counting
duplicates by Idempotency-Key), and a throwaway embedded PostgreSQL (the ``pgserver``
package) for when no DSN is configured. The demo's flow is in :mod:`pgworker.demo`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

from .errors import ConfigError


class WebhookEndpoint:
    """A local HTTP endpoint that records deliveries by Idempotency-Key.

    Events whose id is a multiple of 6 fail with 503 on their first attempt (transient);
    multiples of 23 are refused with 422 (permanent).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.delivered: dict[str, dict[str, Any]] = {}
        self.duplicates = 0
        self.charges: dict[str, dict[str, Any]] = {}  # the payment endpoint, by Idempotency-Key
        self.charge_requests = 0
        self.reconciliations = 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, code: int, body: Any = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - the payment endpoint: was the charge with this key made?
                key = self.path.rsplit("/", 1)[-1]
                with endpoint.lock:
                    endpoint.reconciliations += 1
                    charge = endpoint.charges.get(key)
                self._reply(200, charge) if charge else self._reply(404, {"error": "no such charge"})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                key = self.headers.get("Idempotency-Key", "")
                if self.path.startswith("/charges"):  # charged once per key; the first reply is "lost"
                    with endpoint.lock:
                        endpoint.charge_requests += 1
                        first = key not in endpoint.charges
                        charge = endpoint.charges.setdefault(
                            key, {"charge": f"ch_{len(endpoint.charges) + 1}", "cents": body.get("cents")})
                    return self._reply(503) if first else self._reply(200, charge)
                attempt = int(self.headers.get("X-Attempt", "1"))
                event = int(body.get("event_id", 0))
                with endpoint.lock:
                    endpoint.requests += 1
                    if event % 23 == 0:
                        code = 422
                    elif event % 6 == 0 and attempt == 1:
                        code = 503
                    elif key in endpoint.delivered:
                        endpoint.duplicates += 1
                        code = 200
                    else:
                        endpoint.delivered[key] = body
                        code = 200
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, fmt: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/events"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@dataclass(frozen=True)
class EmbeddedPostgres:
    """The demo's own PostgreSQL: its DSN and data directory."""

    dsn: str
    datadir: str

    @property
    def stop_command(self) -> str:
        """A shell command that stops a kept server and deletes its data directory. Through
        pgserver, which runs the server as its own system user when started by root (pg_ctl
        refuses root)."""
        code = f"import pgserver; pgserver.get_server({self.datadir!r}, cleanup_mode='delete').cleanup()"
        # -W ignore: pgserver's platformdirs warns about a runtime folder it does not need
        return f'{sys.executable} -W ignore -c "{code}"'


@contextlib.contextmanager
def embedded_postgres(*, keep: bool = False) -> Iterator[EmbeddedPostgres]:
    """A throwaway PostgreSQL from the ``pgserver`` package, stopped and deleted at exit,
    or with ``keep`` left running (its jobs can then be inspected; the caller says how to
    stop it)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError:
        raise ConfigError("no PGWORKER_DSN is set and the embedded PostgreSQL is not installed: "
                          "pip install 'pgworker[demo]', or set PGWORKER_DSN to your server") from None
    datadir = tempfile.mkdtemp(prefix="pgworker-demo-pg-")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # cleanup_mode None: pgserver leaves the server running when this process exits
        server = pgserver.get_server(datadir, cleanup_mode=None if keep else "delete")
    try:
        yield EmbeddedPostgres(server.get_uri(), datadir)
    finally:
        if not keep:
            with contextlib.suppress(Exception):
                server.cleanup()
            shutil.rmtree(datadir, ignore_errors=True)
