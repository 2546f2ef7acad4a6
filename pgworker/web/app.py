"""The console as an ASGI application: its routes, static files, response headers and
error pages (:func:`create_app`)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, AsyncIterator

import psycopg
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from ..errors import ConfigError, DatabaseBusy, DatabaseUnavailable, PgworkerError, QueuePaused
from ..names import dsn_password, redact
from ..privileges import PermissionDenied
from . import api
from .auth import Authenticate, Credentials, Permits, role_permits
from .config import WebConfig
from .console import Console
from .pages import bulk, dead, job, jobs, overview, schedules, workers
from .security import SecurityHeaders

log = logging.getLogger("pgworker.web")
STATIC = Path(__file__).parent / "static"


def create_app(app: Any, *, authenticate: Authenticate | None = None, permits: Permits = role_permits,
               config: WebConfig | None = None, credentials: Credentials | None = None) -> Starlette:
    """The console over ``app`` (a :class:`pgworker.App`: its DSN, schema and, when it
    is your application's, its tasks and schedules), as a Starlette application to run
    (``pgworker web``) or mount under a prefix::

        from starlette.routing import Mount
        from pgworker.web import Principal, create_app

        def who(request):                      # your session, your SSO...
            user = request.session.get("user") # (sync or async)
            return Principal(user["name"], "operator") if user else None

        routes = [Mount("/jobs-console", app=create_app(my_app, authenticate=who))]

    ``authenticate(request)`` returns a :class:`pgworker.web.Principal` or None (401); it
    is required (:func:`pgworker.web.anonymous` lets everyone in, knowingly).
    ``permits(principal, action)`` decides every action (default: by role, see
    :data:`pgworker.web.ACTIONS`); ``config`` is a :class:`WebConfig` (default: from the
    the console's environment variables). Raises :class:`ConfigError` without ``authenticate``.
    """
    if authenticate is None:
        raise ConfigError("create_app needs authenticate=: your application's check of who asks "
                          "(a callable returning pgworker.web.Principal or None), or "
                          "pgworker.web.anonymous('viewer') to let everyone in")
    console = Console(app, config or WebConfig.from_env(), authenticate, permits=permits, credentials=credentials)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        console.start_applier()  # resume operations a killed console left (mounted: on first request)
        yield
        console.close()

    routes = [*overview.ROUTES, *jobs.ROUTES, *job.ROUTES, *dead.ROUTES, *schedules.ROUTES, *workers.ROUTES,
              *bulk.ROUTES, *api.ROUTES, Mount("/static", app=StaticFiles(directory=STATIC), name="static")]
    handlers: dict[Any, Any] = {HTTPException: _http_error, PgworkerError: _pgworker_error,
                                psycopg.Error: _database_error, Exception: _unexpected}
    web = Starlette(routes=routes, middleware=[Middleware(SecurityHeaders)], exception_handlers=handlers,
                    lifespan=lifespan)
    web.state.console = console
    return web


def _wants_json(request: Request) -> bool:
    path = request.scope.get("path", "")
    return "/api/" in path or "application/json" in request.headers.get("accept", "")


def _page(request: Request, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    if _wants_json(request):
        return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)
    console = request.app.state.console
    body = console.env.get_template("error.html").render(
        ctx=None, cfg=console.config, status=status, message=message, schema=console.app.settings.schema,
        root=request.scope.get("root_path", "").rstrip("/"))
    return HTMLResponse(body, status_code=status, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _page(request, exc.status_code, str(exc.detail), dict(exc.headers or {}))


async def _pgworker_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, PermissionDenied) and exc.refused is not None:  # the page names the console's roles
        return await _database_error(request, exc.refused)
    if isinstance(exc, (DatabaseUnavailable, DatabaseBusy)):  # the server is away or a lock is held: try again
        return _page(request, 503, str(exc))
    status = 409 if isinstance(exc, QueuePaused) else 400 if isinstance(exc, (ConfigError, ValueError)) else 500
    return _page(request, status, str(exc))


async def _database_error(request: Request, exc: Exception) -> Response:
    """A statement PostgreSQL refused: its class and message, the DSN's password redacted."""
    settings = request.app.state.console.app.settings
    text = redact(" ".join(str(exc).split()), dsn_password(settings.dsn), settings.dsn)[:500]
    denied = getattr(exc, "sqlstate", None) == "42501"
    hint = (" (this console's database role may not do that: a read-only console runs as the viewer role of "
            "`pgworker sql grants`, actions need the schema owner's)") if denied else ""
    log.warning("database error on %s: %s", request.url.path, type(exc).__name__)
    return _page(request, 403 if denied else 503, f"PostgreSQL refused the statement ({type(exc).__name__}): "
                                                  f"{text}{hint}")


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("internal error on %s: %s", request.url.path, type(exc).__name__, exc_info=exc)
    return _page(request, 500, "internal error: the console's log has the details")
