"""The console's defences that do not depend on who asks: response headers (a CSP with
no inline script, no framing, no sniffing, no referrer), CSRF tokens for every state
change, and the check that a state change comes from the console's own pages.

CSRF tokens are signed, not stored: ``<issued>.<HMAC(secret, principal name, issued)>``,
valid for :data:`CSRF_MAX_AGE_SECONDS`, so any replica sharing the secret accepts a
token another issued. A POST must carry one (form field ``csrf_token`` or header
``X-CSRF-Token``) unless the principal's credentials are not ambient (a bearer token).
A request a browser marks as coming from another origin (``Sec-Fetch-Site``), or whose
``Origin`` is another one, is refused whatever it carries.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any
from urllib.parse import urlsplit

CSRF_MAX_AGE_SECONDS = 12 * 3600
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on the
    # console's own form posts; links out (a trace) still carry no referrer
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=()"),
]


class SecurityHeaders:
    """ASGI middleware: the headers above on every response, ``Cache-Control: no-store``
    on everything but static files (pages show payloads), and ``Server-Timing: app;dur=``
    (milliseconds the console spent on the request: the benchmarks read it)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        static = "/static/" in scope.get("path", "")

        async def with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _OURS]
                headers += HEADERS
                headers.append((b"cache-control", b"public, max-age=3600" if static else b"no-store"))
                headers.append((b"server-timing", f"app;dur={(time.perf_counter() - started) * 1000:.1f}".encode()))
                message = dict(message, headers=headers)
            await send(message)

        await self.app(scope, receive, with_headers)


_OURS = {k for k, _ in HEADERS} | {b"cache-control", b"server-timing"}


def csrf_token(secret: bytes, name: str, now: float | None = None) -> str:
    """A token for ``name``'s forms."""
    issued = str(int(time.time() if now is None else now))
    return f"{issued}.{_sign(secret, name, issued)}"


def csrf_valid(secret: bytes, name: str, token: str | None, now: float | None = None) -> bool:
    """Whether ``token`` was issued for ``name`` with ``secret`` and has not expired."""
    if not token or "." not in token or len(token) > 200:
        return False
    issued, _, signature = token.partition(".")
    if not issued.isdigit():
        return False
    age = (time.time() if now is None else now) - int(issued)
    if not 0 <= age <= CSRF_MAX_AGE_SECONDS:
        return False
    return hmac.compare_digest(signature, _sign(secret, name, issued))


def _sign(secret: bytes, name: str, issued: str) -> str:
    return hmac.new(secret, f"pgworker-csrf\n{name}\n{issued}".encode(), hashlib.sha256).hexdigest()


def same_site(headers: Any, host: str | None) -> bool:
    """False when the browser says the request comes from elsewhere: ``Sec-Fetch-Site``
    other than same-origin (or none: typed by the user), else an ``Origin`` that is not
    the request's ``Host`` (or is opaque, "null"). A client that sends neither (a script)
    passes here; its credentials decide whether it needs a CSRF token."""
    site = headers.get("sec-fetch-site")
    if site:
        return site.lower() in ("same-origin", "none")
    origin = headers.get("origin")
    if origin is None:
        return True
    return origin != "null" and urlsplit(origin).netloc.lower() == (host or "").lower()
