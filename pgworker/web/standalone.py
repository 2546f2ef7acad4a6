"""``pgworker web``: the console served by uvicorn, on 127.0.0.1 unless told otherwise.

Who may come in: the bearer tokens and HTTP basic users of ``PGWORKER_WEB_TOKENS`` and
``PGWORKER_WEB_USERS`` (or their ``_FILE`` variables), each with a role; with none, only a
loopback address is served, and whoever reaches it is the local operator ("web",
admin). Listening beyond loopback without credentials is refused with the fix.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
from typing import Any, Mapping

from ..errors import ConfigError
from .app import create_app
from .auth import ADMIN, Credentials, anonymous
from .config import WebConfig

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
log = logging.getLogger("pgworker.web")


def loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or 'localhost' (not 0.0.0.0, not '')."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def build(app: Any, *, host: str, config: WebConfig, env: Mapping[str, str] | None = None) -> Any:
    """The standalone console's ASGI application, or :class:`ConfigError` when ``host``
    is beyond loopback and no credentials are configured."""
    env = os.environ if env is None else env
    credentials = Credentials.from_env(env, failures=config.login_failures, window=config.login_window_seconds)
    if credentials.configured:
        def authenticate(request: Any) -> Any:
            return credentials.check(request.headers.get("authorization"))

        return create_app(app, authenticate=authenticate, config=config, credentials=credentials)
    if not loopback(host):
        raise ConfigError(
            f"refusing to serve the console on {host!r} without authentication: anyone who reaches it could "
            "replay and cancel jobs. Set PGWORKER_WEB_USERS (name:role:password, for a browser) and/or "
            "PGWORKER_WEB_TOKENS (name:role:token, for scripts), roles viewer, operator or admin; or listen on "
            "127.0.0.1 (the default)")
    return create_app(app, authenticate=anonymous(ADMIN), config=config)


def serve(app: Any, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, config: WebConfig | None = None,
          root_path: str = "", log_level: int | str = "info") -> int:
    """Run the console until SIGINT/SIGTERM; returns the exit code."""
    import uvicorn

    config = config or WebConfig.from_env()
    web = build(app, host=host, config=config)
    sock = listen_socket(host, port)
    shown = f"[{host}]" if ":" in host else host
    print(f"pgworker console on http://{shown}:{port}{root_path or ''}/ (schema {app.settings.schema!r}"
          f"{', read-only' if config.read_only else ''})", flush=True)
    server = uvicorn.Server(uvicorn.Config(web, host=host, port=port, root_path=root_path, log_level=log_level,
                                           proxy_headers=False, server_header=False, lifespan="on"))
    server.run(sockets=[sock])
    return 0


def listen_socket(host: str, port: int) -> socket.socket:
    """The console's bound socket, made here rather than by uvicorn so that a port in use
    is refused with the fix before the console says it serves (uvicorn printed the URL,
    then "[Errno 98] ... address already in use" and exited 3). Raises ConfigError."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"cannot serve the console on {host!r}: {exc}; give an address of this host with "
                          "--host (default 127.0.0.1)") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is already in use (another `pgworker web`, or a "
                              "`pgworker demo --keep` console?): choose another with --port") from None
        raise ConfigError(f"cannot serve the console on {host}:{port}: {exc.strerror}; set --host and --port") from None
    sock.set_inheritable(True)
    return sock
