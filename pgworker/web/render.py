"""Rendering: the Jinja2 environment (autoescape on: every value a page shows is
escaped, payloads, task names, error messages and tracebacks included; before that, its
control characters are written as visible escapes), its filters, and
the bounded, redacted JSON a job page shows."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Iterable
from urllib.parse import urlencode

import jinja2
import markupsafe

from ..names import CANCEL_REASON_MAX_CHARS, visible

REDACTED = "[redacted]"


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("pgworker.web", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             finalize=shown)
    env.filters.update(age=age, dt=dt, num=num, capped=capped, pretty=pretty, exact=exact)
    # |tojson of a value Python could not decode (UndecodablePayload) shows its text, not a 500
    env.policies["json.dumps_kwargs"] = {"sort_keys": True, "default": jsonable}
    env.globals.update(qs=qs, reason_max=CANCEL_REASON_MAX_CHARS)
    return env


def shown(value: Any) -> Any:
    """Every ``{{ value }}`` a page prints, before it is escaped: text with its control
    characters as visible escapes (a task or queue name a raw SQL writer stored with
    ESC, U+202E or a NUL-free C0 in it reads as ``\\x1b``/``\\u202e``, as the CLI
    prints it), line feeds and tabs kept (a traceback, indented JSON). Markup (a filter's
    own HTML, ``|tojson``, which escapes them already) and other values pass as they are."""
    if isinstance(value, str) and not isinstance(value, markupsafe.Markup):
        return visible(value, keep_lines=True)
    return value


def exact(value: Any) -> markupsafe.Markup:
    """A form field's value as it is, HTML-escaped but not made visible by :func:`shown`:
    a filter's value a form posts back (a bulk action's confirmation) must match what it
    matched, not its escapes."""
    return markupsafe.escape(value)


def age(seconds: Any) -> str:
    """'4s', '3m 20s', '2h 5m', '3d 4h'; '-' for None."""
    if seconds is None:
        return "-"
    s = float(seconds)
    if math.isnan(s):
        return "-"
    sign = "-" if s < 0 else ""
    s = abs(s)
    if s < 1:
        return f"{sign}{s * 1000:.0f}ms" if s else "0s"
    s = int(s)
    if s < 60:
        return f"{sign}{s}s"
    if s < 3600:
        return f"{sign}{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{sign}{s // 3600}h {s % 3600 // 60}m"
    return f"{sign}{s // 86400}d {s % 86400 // 3600}h"


def dt(value: Any) -> str:
    """A timestamp in UTC, to the second: '2026-12-01 09:30:05Z'; '-' for None. An ISO
    8601 string (a time stored in JSON: an attempt's error) is read first; any other
    value is shown as it is."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
            if value.tzinfo is None:
                return value.strftime("%Y-%m-%d %H:%M:%S")  # no zone given: not claimed to be UTC
            return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
        except (ValueError, OverflowError):  # not a time, or one UTC cannot hold (year 1 at +01:00)
            return str(value)
    if not isinstance(value, datetime):
        return "-" if value is None else str(value)
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}"


def capped(value: Any, cap: int) -> str:
    """A count that stopped at ``cap``: '10,000+'."""
    if value is None:
        return "-"
    return f"{cap:,}+" if int(value) >= cap else f"{int(value):,}"


def qs(**params: Any) -> str:
    """A query string of the non-empty parameters ('?a=1&b=x'), or ''."""
    kept = {k: v for k, v in params.items() if v not in (None, "", False)}
    return "?" + urlencode(kept) if kept else ""


SHOWN_DEPTH = 100  # nesting shown of a value too deep to encode on the web's stack


def shallow(value: Any, depth: int = 0) -> Any:
    """``value`` with what is nested deeper than SHOWN_DEPTH replaced by a note: for a
    value that decoded on a worker's stack but is too deep to encode on the console's
    (json.dumps raised RecursionError; a payload nested ~970 levels was a 500)."""
    if isinstance(value, (dict, list)) and depth >= SHOWN_DEPTH:
        return f"<nested deeper than {SHOWN_DEPTH} levels: not shown>"
    if isinstance(value, dict):
        return {k: shallow(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [shallow(v, depth + 1) for v in value]
    return value


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps`` with :func:`jsonable` for what JSON lacks, and :func:`shallow` when
    the value is too deep to encode whole."""
    try:
        return json.dumps(value, default=jsonable, ensure_ascii=False, **options)
    except RecursionError:
        return json.dumps(shallow(value), default=jsonable, ensure_ascii=False, **options)


def pretty(value: Any, max_chars: int = 20_000) -> str:
    """JSON, indented, cut at ``max_chars`` with a note of how much was left out."""
    text = dumps(value, indent=2, sort_keys=True)
    if len(text) > max_chars:
        return text[:max_chars] + f"\n… ({len(text) - max_chars:,} more characters not shown)"
    return text


def redact(value: Any, keys: Iterable[str]) -> Any:
    """``value`` with the values of sensitive keys replaced, at any depth: a key matches
    when, lower-cased with '-' as '_', it equals one of ``keys`` or ends with '_' + one
    ('password', 'db_password', 'X-Api-Key')."""
    wanted = tuple(k.lower().replace("-", "_") for k in keys)
    if not wanted:
        return value

    def sensitive(key: str) -> bool:
        k = key.lower().replace("-", "_")
        return any(k == w or k.endswith("_" + w) for w in wanted)

    def walk(v: Any, depth: int) -> Any:
        if depth > 64:
            return v
        if isinstance(v, dict):
            return {k: (REDACTED if isinstance(k, str) and sensitive(k) else walk(x, depth + 1)) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x, depth + 1) for x in v]
        return v

    return walk(value, 0)


def jsonable(value: Any) -> Any:
    """For json.dumps: datetimes as ISO 8601, decimals as numbers, the rest as text."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
