"""Who is asking, and what they may do: one authenticator and one permission callable,
the same standalone and mounted.

- ``authenticate(request) -> Principal | None`` says who asks (None: nobody we know, the
  request gets 401). Mounted in a host application, it is the host's (its session, its
  SSO); standalone, :class:`Credentials` reads bearer tokens and HTTP basic users from
  the environment or a secret file, and :func:`anonymous` is the local operator's.
- ``permits(principal, action) -> bool`` decides every action. The default,
  :func:`role_permits`, reads :data:`ACTIONS`: a viewer sees everything, an operator also
  replays, retries, cancels, discards, pauses and resumes, an admin also sets queue
  limits. Read-only mode (:class:`pgworker.web.WebConfig`) refuses every action first,
  whatever ``permits`` says.
"""

from __future__ import annotations

import base64
import hmac
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..errors import ConfigError

VIEWER, OPERATOR, ADMIN = "viewer", "operator", "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)
#: Each action and the least role that may take it.
ACTIONS = {
    "view": VIEWER,
    "replay": OPERATOR, "retry": OPERATOR, "cancel": OPERATOR, "discard": OPERATOR,
    "pause": OPERATOR, "resume": OPERATOR, "bulk": OPERATOR, "bulk_cancel": OPERATOR,
    "set_limits": ADMIN,
}


@dataclass(frozen=True)
class Principal:
    """Who asks: ``name`` (recorded as the actor of what they do), ``role`` (viewer,
    operator or admin), and ``ambient``: whether the browser sends the credentials by
    itself (a cookie, HTTP basic), so that a state change needs a CSRF token; a bearer
    token is not ambient (a browser never attaches one to a forged request)."""

    name: str
    role: str = VIEWER
    ambient: bool = True

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"role {self.role!r} is not one of {', '.join(ROLES)}")
        if not isinstance(self.name, str) or not self.name or len(self.name) > 200:
            raise ConfigError("a principal's name must be 1-200 characters (it is recorded as the actor)")


Authenticate = Callable[[Any], "Principal | None"]
Permits = Callable[[Principal, str], bool]


def role_permits(principal: Principal, action: str) -> bool:
    """The default permission rule: the principal's role reaches the action's (ACTIONS)."""
    needed = ACTIONS.get(action)
    return needed is not None and ROLES.index(principal.role) >= ROLES.index(needed)


def anonymous(role: str = ADMIN, name: str = "web") -> Authenticate:
    """Everyone is ``name`` with ``role``: the standalone console on loopback without
    credentials (the local operator), or a mounted console behind a host that checked
    access already. The actor recorded is ``name``."""
    principal = Principal(name, role)
    return lambda request: principal


class Credentials:
    """Bearer tokens and HTTP basic users for the standalone console, with failed
    attempts rate-limited per client address.

    ``users`` and ``tokens``: text of entries ``name:role:secret``, one per line or
    separated by commas (``PGWORKER_WEB_USERS``, ``PGWORKER_WEB_TOKENS``, or the files
    their ``_FILE`` variables name: a Kubernetes Secret mounted as a file). Secrets are
    compared in constant time. A client with ``failures`` failed attempts within
    ``window`` seconds is refused (429) until the window passes.
    """

    def __init__(self, users: str = "", tokens: str = "", *, failures: int = 5, window: float = 60.0) -> None:
        self.users = _entries(users, "PGWORKER_WEB_USERS")
        self.tokens = _entries(tokens, "PGWORKER_WEB_TOKENS")
        self.failures = failures
        self.window = window
        self._failed: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, env: Mapping[str, str], **kw: Any) -> "Credentials":
        return cls(_value(env, "PGWORKER_WEB_USERS"), _value(env, "PGWORKER_WEB_TOKENS"), **kw)

    @property
    def configured(self) -> bool:
        return bool(self.users or self.tokens)

    def blocked_for(self, client: str) -> float:
        """Seconds until ``client`` may try again (0: it may)."""
        now = time.monotonic()
        with self._lock:
            recent = [t for t in self._failed.get(client, []) if now - t < self.window]
            self._failed[client] = recent
            if len(recent) < self.failures:
                return 0.0
            return self.window - (now - recent[0])

    def failed(self, client: str) -> None:
        with self._lock:
            self._failed.setdefault(client, []).append(time.monotonic())
            if len(self._failed) > 10_000:  # bounded memory under a spray of addresses
                self._failed.pop(next(iter(self._failed)))

    def check(self, authorization: str | None) -> Principal | None:
        """The principal the Authorization header proves, else None."""
        if not authorization:
            return None
        scheme, _, value = authorization.partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer":
            return _match(self.tokens, None, value, ambient=False)
        if scheme.lower() == "basic":
            try:
                name, _, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            return _match(self.users, name, password, ambient=True)
        return None


def _match(entries: list[tuple[str, str, str]], name: str | None, secret: str,
           *, ambient: bool) -> Principal | None:
    found = None
    for entry_name, role, entry_secret in entries:  # every entry compared: no early exit to time
        same_secret = hmac.compare_digest(entry_secret.encode(), secret.encode())
        same_name = name is None or hmac.compare_digest(entry_name.encode(), name.encode())
        if same_secret and same_name and found is None:
            found = Principal(entry_name, role, ambient=ambient)
    return found


def _value(env: Mapping[str, str], name: str) -> str:
    path = env.get(f"{name}_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except OSError as exc:
            raise ConfigError(f"{name}_FILE={path!r} cannot be read ({exc.strerror})") from None
    return env.get(name, "")


def _entries(text: str, variable: str) -> list[tuple[str, str, str]]:
    out = []
    for raw in text.replace(",", "\n").splitlines():
        entry = raw.strip()
        if not entry or entry.startswith("#"):
            continue
        name, sep1, rest = entry.partition(":")
        role, sep2, secret = rest.partition(":")
        if not (sep1 and sep2 and name and secret):
            raise ConfigError(f"{variable}: an entry is not name:role:secret (the entry starting "
                              f"{entry[:1]!r}...); example: alice:operator:a-long-random-secret")
        if role not in ROLES:
            raise ConfigError(f"{variable}: {name!r} has role {role!r}; use one of {', '.join(ROLES)}")
        if len(secret) < 12:
            raise ConfigError(f"{variable}: the secret of {name!r} is shorter than 12 characters; use a long "
                              "random one (python -c 'import secrets; print(secrets.token_urlsafe(24))')")
        out.append((name, role, secret))
    return out
