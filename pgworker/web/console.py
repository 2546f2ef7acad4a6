"""The console's state and each request's gate: who asks (the authenticator), whether
they may (the one permission callable, read-only mode first), and for a state change
the CSRF token and the same-site check; then rendering.

Every route starts with ``ctx = await console.enter(request, action)``: nothing a page
shows or does is reachable without it.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from . import security
from .auth import Authenticate, Credentials, Permits, Principal, role_permits
from .config import WebConfig
from .render import environment

log = logging.getLogger("pgworker.web")


class Refused(HTTPException):
    """A request the gate refused; ``headers`` carry WWW-Authenticate or Retry-After."""


class Console:
    """One console over one App: its settings, authenticator and permission rule, the
    template environment, the live-update broadcaster and the bulk applier (both started
    on first use: a console mounted in a host app gets no lifespan events)."""

    def __init__(self, app: Any, config: WebConfig, authenticate: Authenticate, *,
                 permits: Permits = role_permits, credentials: Credentials | None = None) -> None:
        self.app = app
        self.config = config
        self.authenticate = authenticate
        self.permits = permits
        self.credentials = credentials
        self.env = environment()
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, Any]] = {}
        self.live: Any = None
        self.applier: Any = None

    @property
    def store(self) -> Any:
        return self.app.store

    # -- the gate ---------------------------------------------------------------------

    async def enter(self, request: Request, action: str = "view") -> "Ctx":
        """Authenticate and authorise ``request`` for ``action``; raises :class:`Refused`
        (401, 403 or 429) otherwise. A POST also needs a same-site origin and, with ambient
        credentials, a valid CSRF token (form field or X-CSRF-Token header)."""
        client = request.client.host if request.client else "?"
        creds = self.credentials
        if creds is not None and (wait := creds.blocked_for(client)) > 0:
            raise Refused(429, f"too many failed logins from this address: try again in {wait:.0f} s",
                          headers={"Retry-After": str(int(wait) + 1)})
        principal = self.authenticate(request)
        if inspect.isawaitable(principal):
            principal = await principal
        if principal is None:
            if creds is not None and request.headers.get("authorization"):
                creds.failed(client)
            challenge = {"WWW-Authenticate": 'Basic realm="pgworker", charset="UTF-8"'} if (
                creds is None or creds.users) else {"WWW-Authenticate": "Bearer"}
            raise Refused(401, "authentication required", headers=challenge)
        ctx = Ctx(self, request, principal)
        if action != "view":
            ctx.require(action)
        if request.method == "POST":
            await self._check_post(request, principal)
        self.start_applier()
        return ctx

    async def _check_post(self, request: Request, principal: Principal) -> None:
        if not security.same_site(request.headers, request.headers.get("host")):
            raise Refused(403, "cross-site request refused")
        if not principal.ambient:
            return
        token = request.headers.get("x-csrf-token")
        if token is None and request.headers.get("content-type", "").startswith(
                ("application/x-www-form-urlencoded", "multipart/form-data")):
            token = (await request.form()).get("csrf_token")
        if not security.csrf_valid(self.config.secret, principal.name, token if isinstance(token, str) else None):
            if "/api/" in request.url.path:
                # a script, not a page: reloading is no fix for it
                raise Refused(403, "missing or expired CSRF token: GET /api/csrf and send its token in the "
                                   "X-CSRF-Token header (or use a bearer token, PGWORKER_WEB_TOKENS, which needs none)")
            raise Refused(403, "missing or expired CSRF token: reload the page and try again")

    # -- services started on first use ----------------------------------------------------

    def start_applier(self) -> None:
        if self.applier is not None or self.config.read_only or not self.config.apply_bulk:
            return
        with self._lock:
            if self.applier is None:
                from .applier import BulkApplier

                self.applier = BulkApplier.for_console(self).start()

    def live_updates(self) -> Any:
        with self._lock:
            if self.live is None:
                from .live import Broadcaster

                self.live = Broadcaster(self.app.settings, self.store.channel)
            return self.live

    def close(self) -> None:
        for service in (self.applier, self.live):
            if service is not None:
                service.close_service()

    # -- helpers ------------------------------------------------------------------------

    def cached(self, key: str, seconds: float, compute: Callable[[], Any]) -> Any:
        """``compute()``'s last value, recomputed in a thread of its own once older than
        ``seconds`` while the stale one is served (the overview's chart: a bounded read
        of up to 150,000 index entries that no request should wait for). Only the very
        first call waits for it."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            stale = hit is None or hit[0] <= now
            if hit is not None and stale:
                self._cache[key] = (now + seconds, hit[1])  # one refresh at a time
        if hit is None:
            value = compute()
            self._cache[key] = (time.monotonic() + seconds, value)
            return value
        if stale:
            def refresh() -> None:
                try:
                    self._cache[key] = (time.monotonic() + seconds, compute())
                except Exception as exc:  # noqa: BLE001 - the last value stays; the next request tries again
                    log.warning("could not refresh %s: %s", key, type(exc).__name__)
                    self._cache[key] = (0.0, hit[1])

            threading.Thread(target=refresh, name=f"pgworker-web-{key}", daemon=True).start()
        return hit[1]

    def render(self, ctx: "Ctx", template: str, data: dict[str, Any], status: int = 200) -> HTMLResponse:
        body = self.env.get_template(template).render(ctx=ctx, cfg=self.config, root=ctx.root,
                                                      schema=self.app.settings.schema, **data)
        return HTMLResponse(body, status_code=status)


@dataclass
class Ctx:
    """One request that passed the gate."""

    console: Console
    request: Request
    principal: Principal

    @property
    def app(self) -> Any:
        return self.console.app

    @property
    def store(self) -> Any:
        return self.console.app.store

    @property
    def actor(self) -> str:
        return self.principal.name

    def can(self, action: str) -> bool:
        return not self.console.config.read_only and bool(self.console.permits(self.principal, action))

    def require(self, action: str) -> None:
        """Raise :class:`Refused` (403) unless the principal may take ``action``."""
        if not self.can(action):
            why = "the console is read-only" if self.console.config.read_only else \
                f"{self.principal.name} ({self.principal.role}) may not {action.replace('_', ' ')}"
            raise Refused(403, why)

    @property
    def csrf(self) -> str:
        return security.csrf_token(self.console.config.secret, self.principal.name)

    @property
    def root(self) -> str:
        """The path the console is mounted at ('' standalone)."""
        return self.request.scope.get("root_path", "").rstrip("/")

    def url(self, path: str) -> str:
        return f"{self.root}{path}"

    def redirect(self, path: str) -> Response:
        return RedirectResponse(self.url(path), status_code=303)

    async def db(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """Run blocking database work off the event loop."""
        return await run_in_threadpool(fn, *args, **kw)
