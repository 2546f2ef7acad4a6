"""The console's settings (its own environment variables, listed in docs/web.md), apart
from the worker's: a console is another process, often with another role (read-only)
and other secrets.

Every field has a default; :meth:`WebConfig.from_env` reads the variables and refuses a
bad value with the variable's name and the fix. docs/web.md lists them.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from ..errors import ConfigError

#: Jobs per page of a list.
PAGE_SIZE = 50
#: Rows a list reads at most for a filter no index serves: "searched the newest N jobs".
SCAN_ROWS = 50_000
#: Counts stop here and read "10,000+".
COUNT_CAP = 10_000
#: Finished jobs per state the overview's chart reads at most (the newest).
THROUGHPUT_ROWS = 50_000
#: Dead jobs the dead-jobs page groups at most (the newest).
DEAD_SCAN_ROWS = 100_000
#: Payload shown on a job's page, in characters of its pretty-printed JSON.
PAYLOAD_MAX_CHARS = 20_000
#: Fields whose values the job page shows as redacted, at any depth (case-insensitive).
REDACT_KEYS = ("password", "passwd", "secret", "token", "api_key", "apikey", "authorization", "cookie",
               "credit_card", "card_number", "ssn")
#: Failed logins from one client allowed per window before it is refused for a while.
LOGIN_FAILURES = 5
LOGIN_WINDOW_SECONDS = 60.0
#: How often a console looks for bulk operations it did not record itself (another
#: replica's, or one a killed console left); its own start at once.
BULK_IDLE_SECONDS = 10.0

Redactor = Callable[[Any, dict[str, Any]], Any]

#: The console's variables, for the configuration reference: (variable, flag, default, meaning).
WEB_VARIABLES: tuple[tuple[str, str, str, str], ...] = (
    ("PGWORKER_WEB_USERS", "", "none", "HTTP basic users of `pgworker web`: `name:role:password` entries, one a line "
     "or comma-separated; roles viewer, operator, admin. `PGWORKER_WEB_USERS_FILE` names a file instead."),
    ("PGWORKER_WEB_TOKENS", "", "none", "Bearer tokens for scripts, `name:role:token` entries "
     "(`PGWORKER_WEB_TOKENS_FILE` for a file). Without users or tokens the console serves loopback only."),
    ("PGWORKER_WEB_USERS_FILE", "", "none", "A file (a mounted Secret) holding `PGWORKER_WEB_USERS`' entries."),
    ("PGWORKER_WEB_TOKENS_FILE", "", "none", "A file holding `PGWORKER_WEB_TOKENS`' entries."),
    ("PGWORKER_WEB_READ_ONLY", "--read-only", "false", "No action offered or accepted (pair it with the viewer "
     "role of `pgworker sql grants`)."),
    ("PGWORKER_WEB_TRACE_URL", "--trace-url", "none", "A URL template with `{trace_id}` linking a job to its trace."),
    ("PGWORKER_WEB_REDACT_KEYS", "", ", ".join(REDACT_KEYS), "Payload keys whose values the job page redacts "
     "(comma-separated; replaces the default list)."),
    ("PGWORKER_WEB_SECRET", "", "random per process", "Signs CSRF tokens: give every replica the same one "
     "(16+ characters; `PGWORKER_WEB_SECRET_FILE` for a file)."),
    ("PGWORKER_WEB_SECRET_FILE", "", "none", "A file holding `PGWORKER_WEB_SECRET`."),
    ("PGWORKER_WEB_SCAN_ROWS", "", f"{SCAN_ROWS}", "Jobs a list reads at most for a filter no index serves."),
    ("PGWORKER_WEB_PAGE_SIZE", "", f"{PAGE_SIZE}", "Jobs per page of a list."),
    ("PGWORKER_WEB_BULK_IDLE_SECONDS", "", "10", "How often a console looks for bulk operations it did not "
     "record (another replica's, or one a killed console left)."),
)


@dataclass(frozen=True)
class WebConfig:
    """What the console does beyond the App's settings.

    ``read_only``: no action is offered or accepted, whoever asks (and the applier of bulk
    operations does not run). ``trace_url``: a URL template with ``{trace_id}`` (Jaeger
    ``https://jaeger/trace/{trace_id}``, Tempo, Honeycomb...) for the job page's trace link.
    ``redact``: ``redact(value, job) -> value`` called before a payload, a result or a
    step's result is shown, page and JSON API alike (``value`` is any JSON value, after
    the values of ``redact_keys`` were replaced). ``secret``: signs the CSRF tokens;
    give every replica the same one (a random one per process otherwise).
    """

    read_only: bool = False
    trace_url: str | None = None
    redact_keys: tuple[str, ...] = REDACT_KEYS
    redact: Redactor | None = None
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    page_size: int = PAGE_SIZE
    scan_rows: int = SCAN_ROWS
    count_cap: int = COUNT_CAP
    throughput_rows: int = THROUGHPUT_ROWS
    dead_scan_rows: int = DEAD_SCAN_ROWS
    payload_max_chars: int = PAYLOAD_MAX_CHARS
    login_failures: int = LOGIN_FAILURES
    login_window_seconds: float = LOGIN_WINDOW_SECONDS
    apply_bulk: bool = True
    bulk_idle_seconds: float = BULK_IDLE_SECONDS
    title: str = "pgworker"

    def __post_init__(self) -> None:
        if self.trace_url is not None and "{trace_id}" not in self.trace_url:
            raise ConfigError(f"the trace URL template {self.trace_url!r} has no {{trace_id}}: write one such as "
                              "https://jaeger.example/trace/{trace_id} (PGWORKER_WEB_TRACE_URL)")
        for name in ("page_size", "scan_rows", "count_cap", "throughput_rows", "dead_scan_rows", "payload_max_chars",
                     "login_failures"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000_000:
                raise ConfigError(f"{name} must be an integer from 1 to 10,000,000, got {value!r}")
        if not 0.05 <= self.bulk_idle_seconds <= 3600:
            raise ConfigError(f"bulk_idle_seconds must be from 0.05 to 3600, got {self.bulk_idle_seconds!r} "
                              "(PGWORKER_WEB_BULK_IDLE_SECONDS)")
        if self.page_size > 1000:
            raise ConfigError(f"page_size must be at most 1,000 jobs, got {self.page_size}")

    def replace(self, **changes: Any) -> "WebConfig":
        return replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "WebConfig":
        """The settings from ``PGWORKER_WEB_READ_ONLY`` (true/false), ``PGWORKER_WEB_TRACE_URL``,
        ``PGWORKER_WEB_REDACT_KEYS`` (comma-separated, replaces the default list),
        ``PGWORKER_WEB_SECRET`` (or ``PGWORKER_WEB_SECRET_FILE``), ``PGWORKER_WEB_SCAN_ROWS``,
        ``PGWORKER_WEB_PAGE_SIZE``, ``PGWORKER_WEB_BULK_IDLE_SECONDS``; ``overrides`` win."""
        env = os.environ if environ is None else environ
        kw: dict[str, Any] = {}
        if env.get("PGWORKER_WEB_READ_ONLY"):
            kw["read_only"] = _bool("PGWORKER_WEB_READ_ONLY", env["PGWORKER_WEB_READ_ONLY"])
        if env.get("PGWORKER_WEB_TRACE_URL"):
            kw["trace_url"] = env["PGWORKER_WEB_TRACE_URL"]
        if env.get("PGWORKER_WEB_REDACT_KEYS") is not None:
            kw["redact_keys"] = tuple(k.strip() for k in env["PGWORKER_WEB_REDACT_KEYS"].split(",") if k.strip())
        secret = _secret(env)
        if secret is not None:
            kw["secret"] = secret
        for name, variable in (("scan_rows", "PGWORKER_WEB_SCAN_ROWS"), ("page_size", "PGWORKER_WEB_PAGE_SIZE")):
            if env.get(variable):
                try:
                    kw[name] = int(env[variable])
                except ValueError:
                    raise ConfigError(f"{variable}={env[variable]!r} is not an integer") from None
        if env.get("PGWORKER_WEB_BULK_IDLE_SECONDS"):
            try:
                kw["bulk_idle_seconds"] = float(env["PGWORKER_WEB_BULK_IDLE_SECONDS"])
            except ValueError:
                raise ConfigError(f"PGWORKER_WEB_BULK_IDLE_SECONDS={env['PGWORKER_WEB_BULK_IDLE_SECONDS']!r} "
                                  "is not a number of seconds") from None
        kw.update(overrides)
        return cls(**kw)


def _bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}={value!r} is not a boolean; use true or false")


def _secret(env: Mapping[str, str]) -> bytes | None:
    value = env.get("PGWORKER_WEB_SECRET")
    path = env.get("PGWORKER_WEB_SECRET_FILE")
    if path:
        try:
            with open(path, "rb") as f:
                value = f.read().decode("utf-8", "replace").strip()
        except OSError as exc:
            raise ConfigError(f"PGWORKER_WEB_SECRET_FILE={path!r} cannot be read ({exc.strerror})") from None
    if not value:
        return None
    if len(value) < 16:
        raise ConfigError("PGWORKER_WEB_SECRET is shorter than 16 characters: use a long random value "
                          "(python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return value.encode()
