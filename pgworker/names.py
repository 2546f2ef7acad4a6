"""Validation of names and keys, redaction of secrets from text, and counts in words.

Queue and task names, dedupe and ordering keys are stored as values (always query
parameters), so any printable text is safe; the limits below keep them readable in
tables, metric labels and NOTIFY payloads. The schema name is an SQL identifier: it is
always quoted with ``psycopg.sql.Identifier`` and limited to PostgreSQL's identifier
length (NAMEDATALEN - 1 = 63 bytes, PostgreSQL docs, "Identifiers and Key Words"). It
becomes part of the statement text, which psycopg scans for ``%`` placeholders; ``%``
is therefore the one printable character it cannot contain.
"""

from __future__ import annotations

import json
import re
import shlex

from .errors import ConfigError, InvalidName

QUEUE_NAME_MAX_CHARS = 128
TASK_NAME_MAX_CHARS = 255
KEY_MAX_CHARS = 1024
SCHEMA_NAME_MAX_BYTES = 63
# The schema used when none is configured; here, not in config, because schema_flag below
# needs it and config imports this module (config.DEFAULT_SCHEMA re-exports it).
DEFAULT_SCHEMA = "pgworker"


def _check_text(kind: str, value: object, max_chars: int, fix: str) -> str:
    if not isinstance(value, str):
        raise InvalidName(f"{kind} must be a string, got {type(value).__name__}; {fix}")
    if not value:
        raise InvalidName(f"{kind} is empty; {fix}")
    if len(value) > max_chars:
        raise InvalidName(f"{kind} is {len(value)} characters long, the limit is {max_chars}; {fix}")
    if not value.isprintable():
        raise InvalidName(f"{kind} {value!r} contains control or non-printable characters; {fix}")
    if value != value.strip():
        raise InvalidName(f"{kind} {value!r} has leading or trailing whitespace; {fix}")
    return value


def check_queue_name(name: object) -> str:
    """Return ``name`` if it is a valid queue name, else raise :class:`InvalidName`.

    A queue name is 1 to 128 printable characters without leading or trailing spaces.
    """
    return _check_text("queue name", name, QUEUE_NAME_MAX_CHARS,
                       "use 1-128 printable characters, such as 'default' or 'emails'")


def check_new_queue_name(name: object) -> str:
    """:func:`check_queue_name` of a queue that jobs are put on (enqueue, a task's or a
    schedule's queue), which also refuses ``,`` and ``=``: the worker's settings list
    queues as ``a,b`` (``PGWORKER_QUEUES``) and ``a=2`` (``--queue-concurrency``), so no
    worker could select such a queue (a break-it trial: its jobs waited, and a drain run
    reported success). Reads and operator commands take any existing name."""
    queue = check_queue_name(name)
    if "," in queue or "=" in queue:
        raise InvalidName(f"queue name {queue!r} contains {',' if ',' in queue else '='!r}: workers name their queues "
                          "in lists such as PGWORKER_QUEUES='a,b' and --queue-concurrency 'a=2', so no worker "
                          "could select it; use another character, such as '.', ':' or '-'")
    return queue


def check_task_name(name: object) -> str:
    """Return ``name`` if it is a valid task name (1-255 printable characters)."""
    return _check_text("task name", name, TASK_NAME_MAX_CHARS,
                       "use 1-255 printable characters, such as 'send_email'")


def check_key(kind: str, key: object) -> str | None:
    """Validate a dedupe or ordering key (None, or 1-1024 printable characters)."""
    if key is None:
        return None
    return _check_text(kind, key, KEY_MAX_CHARS, f"use 1-{KEY_MAX_CHARS} printable characters")


def check_schema_name(name: object) -> str:
    """Return ``name`` if PostgreSQL accepts it as a schema name when quoted and every
    statement that names it can be sent as is.

    Raises :class:`InvalidName` for an empty name, one longer than 63 bytes in UTF-8
    (PostgreSQL would silently truncate it), one with NUL or control characters, one
    starting with ``pg_`` (reserved for system schemas, PostgreSQL docs 5.9.5), or one
    containing ``%``: the quoted name is part of the statement text, and psycopg reads
    ``%`` there as a parameter placeholder (``%s``, ``%(name)s``, ``%%``; psycopg docs,
    "Passing parameters to SQL queries"), so every statement with parameters would fail
    or, for ``%%``, name another schema. Other characters are safe: the name is quoted
    by ``psycopg.sql.Identifier`` and substituted once, never parsed again.
    """
    fix = "set PGWORKER_SCHEMA (or --schema) to a name like 'pgworker'"
    if not isinstance(name, str) or not name:
        raise InvalidName(f"schema name must be a non-empty string; {fix}")
    if len(name.encode("utf-8")) > SCHEMA_NAME_MAX_BYTES:
        raise InvalidName(f"schema name {name!r} is longer than {SCHEMA_NAME_MAX_BYTES} bytes; {fix}")
    if not name.isprintable():
        raise InvalidName(f"schema name {name!r} contains control characters; {fix}")
    if "%" in name:
        raise InvalidName(f"schema name {name!r} contains '%', which psycopg reads as a query parameter "
                          f"placeholder in every statement that names the schema; {fix} (without '%')")
    if name.lower().startswith("pg_"):
        raise InvalidName(f"schema name {name!r} starts with 'pg_', which PostgreSQL reserves; {fix}")
    return name


# --- secrets -------------------------------------------------------------------------

# user:password@ in a URL; the password may itself hold '@' (greedy up to the last '@'
# before the host, within one run of non-space, non-slash characters)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*):(?P<pw>[^\s/]+)@")
# password=..., PGPASSWORD=..., DATABASE_PASSWORD: ..., 'password': '...', passwd, pwd,
# and the other names secrets go by in configuration and HTTP errors (secret, api_key,
# access_key, private_key, access_token, auth_token, api_token...; not a bare "token",
# which would hide lease tokens): the key in any case, quoted or not, then = or :, then a
# quoted value (spaces allowed) or a bare one up to a space or a separator (',', ';', '}',
# '&' of a URL query)
_KW_PASSWORD = re.compile(
    r"""(?P<key>(?P<q>['"]?)[\w-]*(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?key|private[_-]?key"""
    r"""|(?:access|auth|refresh|session|id|bearer|api)[_-]?token)[\w-]*(?P=q)\s*[=:]\s*)"""
    r"""(?P<pw>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s,;}&]+)""", re.IGNORECASE)
# An HTTP Authorization value: "Authorization: Basic <base64>" (RFC 7617) or any scheme
# after that header name, and "Bearer <token>" anywhere (RFC 6750)
_AUTH_SCHEME = re.compile(r"""(?P<scheme>\bAuthorization['"]?\s*[:=]\s*['"]?\w+|\bBearer)"""
                          r"""\s+(?P<pw>[A-Za-z0-9._~+/=-]{8,})""", re.IGNORECASE)
REDACTED = "********"


def dsn_password(dsn: str | None) -> str | None:
    """The password inside a libpq DSN (URL or key=value form), or None."""
    if not dsn:
        return None
    try:
        from psycopg.conninfo import conninfo_to_dict

        pw = conninfo_to_dict(dsn).get("password")
        if pw:
            return str(pw)
    except Exception:  # malformed DSN: fall back to the patterns below
        m = _URL_PASSWORD.search(dsn) or _KW_PASSWORD.search(dsn)
        return (m.group("pw").strip("'") or None) if m else _userinfo_password(dsn)
    m = _URL_PASSWORD.search(dsn) or _KW_PASSWORD.search(dsn)
    if m:
        return m.group("pw").strip("'") or None
    return None


def _userinfo_password(dsn: str) -> str | None:
    """The password of a URI that libpq refused, so no pattern above knows its shape
    ('postgres:/u:pw@host/db' with one slash, 'u:pw@host'): what follows the user's ':'
    up to the last '@' before any '?'. It errs towards hiding: the DSN is shown to say
    what is wrong with it, and a password must not be the part shown."""
    head = dsn.split("?", 1)[0]
    userinfo, at, _ = head.rpartition("@")
    if not at:
        return None
    if "//" in userinfo:
        userinfo = userinfo.split("//", 1)[1]
    else:  # a scheme and a single slash, or none: 'postgres:/u:pw', 'postgresql:u:pw'
        userinfo = re.sub(r"^postgres(?:ql)?:/?", "", userinfo, flags=re.IGNORECASE)
    return userinfo.partition(":")[2] or None


def one_line(text: str) -> str:
    """``text`` on one line: its lines joined with "; " (libpq's "Connection refused" and
    "Is the server running ...?" are two sentences), runs of white space folded."""
    return "; ".join(" ".join(line.split()) for line in text.splitlines() if line.strip())


def redact(text: str, *secrets: str | None) -> str:
    """Return ``text`` with DSN passwords, keyword secrets (password=, api_key:, 'secret':
    ...), HTTP Bearer/Basic credentials and the given secrets replaced by asterisks."""
    if not text:
        return text
    for s in secrets:
        if s:
            text = text.replace(s, REDACTED)
    text = _URL_PASSWORD.sub(lambda m: f"{m.group('scheme')}:{REDACTED}@", text)
    text = _KW_PASSWORD.sub(lambda m: f"{m.group('key')}{REDACTED}", text)
    text = _AUTH_SCHEME.sub(lambda m: f"{m.group('scheme')} {REDACTED}", text)
    return text


# A URL's user:password whose '@' was cut off (the text was bounded before redaction, so
# _URL_PASSWORD, which needs the '@', cannot see it): everything after the user's ':'.
_URL_PASSWORD_CUT = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*):(?P<pw>[^\s@]*)$")


def redact_cut(text: str, *secrets: str | None) -> str:
    """:func:`redact` for text cut from a longer one (bounded before the regex work): a
    URL's password cut before its '@' is hidden too, whatever follows its ':' to the end
    (erring towards hiding: a cut 'https://host:8080/...' loses its port)."""
    text = redact(text, *secrets)
    return _URL_PASSWORD_CUT.sub(lambda m: f"{m.group('scheme')}:{REDACTED}", text)


def redact_dsn(dsn: str | None) -> str:
    """A DSN safe to print: the password replaced by asterisks."""
    if not dsn:
        return ""
    return redact(dsn, dsn_password(dsn))


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def bounded_text(text: str, max_chars: int) -> str:
    """Printable, NUL-free text of at most ``max_chars`` characters (suffix '…' when cut).

    PostgreSQL ``text`` cannot hold NUL bytes, and lone surrogates cannot be encoded as
    UTF-8; both are replaced with U+FFFD.
    """
    text = _CONTROL.sub("\ufffd", text)
    if len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return text


# Bidirectional embeddings, overrides and isolates: they reorder what follows them on screen.
_BIDI_CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069]")


def one_line_text(text: str, max_chars: int) -> str:
    """:func:`bounded_text` on one line: runs of white space (line breaks, tabs) as one
    space, bidirectional controls (U+202A-E, U+2066-9) as U+FFFD, so a short status line
    (a progress message) cannot add lines or reorder itself where it is shown."""
    return bounded_text(_BIDI_CONTROLS.sub("\ufffd", " ".join(text.split())), max_chars)


# What a terminal or a page acts on rather than shows: C0 (line breaks, tab, ESC...), DEL,
# C1 (a VT220 reads U+009B as CSI), the Unicode line and paragraph separators, lone
# surrogates, and the bidi controls that would reorder what follows them on the
# operator's screen (a task name whose U+202E shows "exe.txt" for "txt.exe").
_UNSHOWN_BEYOND_C0 = r"\x7f-\x9f\u2028\u2029\ud800-\udfff\u200e\u200f\u202a-\u202e\u2066-\u2069"
_UNSHOWN = re.compile(rf"[\x00-\x1f{_UNSHOWN_BEYOND_C0}]")
_UNSHOWN_KEEPING_LINES = re.compile(rf"[\x00-\x08\x0b-\x1f{_UNSHOWN_BEYOND_C0}]")  # \t and \n stay
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def visible(text: str, keep_lines: bool = False) -> str:
    """``text`` with each control character written as a visible escape (``\\n``,
    ``\\r``, ``\\t``, ``\\x1b``, ``\\u202e``), as the worker's log lines write an
    error's: stored text (a task name written by raw SQL, a progress message, an error's)
    cannot start a line of its own, move the cursor or reorder itself in what an operator
    reads. ``keep_lines``: line feeds and tabs stay (a traceback, indented JSON, shown in
    a ``<pre>``). Only what is shown changes, never what is stored."""
    return (_UNSHOWN_KEEPING_LINES if keep_lines else _UNSHOWN).sub(_escape, text)


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


#: The most of an operator's cancel reason that is kept (the audit event's detail).
CANCEL_REASON_MAX_CHARS = 500


def cancel_reason(text: str | None) -> str | None:
    """An operator's reason for a cancel as it is stored: None for none (or only blanks),
    else :func:`bounded_text` of it, at most :data:`CANCEL_REASON_MAX_CHARS` characters
    (cut with '…'). Pages show it escaped, as every audit detail."""
    if text is None or not text.strip():
        return None
    return bounded_text(text.strip(), CANCEL_REASON_MAX_CHARS)


def cancel_reason_too_long(text: str | None) -> str | None:
    """Why an operator's reason is refused, or None when it fits: longer than
    :data:`CANCEL_REASON_MAX_CHARS` characters, blanks around it not counted. The one
    check of the command line (``--reason``), the JSON API, bulk operations and the App's
    calls (:func:`checked_cancel_reason`); the text is not echoed (it is long, and may be
    anything)."""
    if text is None or len(text.strip()) <= CANCEL_REASON_MAX_CHARS:
        return None
    return (f"the reason is {len(text.strip())} characters long, the limit is {CANCEL_REASON_MAX_CHARS}: "
            "shorten it (the job's audit trail keeps at most that)")


def checked_cancel_reason(text: object) -> str | None:
    """:func:`cancel_reason` of a reason an operator sent (an API body, a form field, a
    bulk operation), refused rather than cut: raises :class:`ConfigError` for one that
    is not a string or None, or is too long (:func:`cancel_reason_too_long`), saying
    nothing was changed."""
    if text is not None and not isinstance(text, str):
        raise ConfigError(f'reason must be a string such as {{"reason": "duplicate of job 12"}} (or null for '
                          f"none), not {json.dumps(text, default=repr)[:40]}; nothing was changed")
    why = cancel_reason_too_long(text)
    if why is not None:
        raise ConfigError(f"{why}; nothing was changed")
    return cancel_reason(text)


# A job (or graph) id as typed: ASCII digits only. int() also reads "1_3", " 5", "-0",
# Arabic-Indic and fullwidth digits, which would name a job nobody typed.
_ID_TEXT = re.compile(r"[0-9]+", re.ASCII)
ID_MAX = 2**63 - 1  # bigint


def parse_id(text: str, what: str = "job id") -> int:
    """A job or graph id written as text: ASCII digits ``[0-9]+``, 1 to 2**63-1.

    Raises ``ValueError`` naming the form wanted (no sign, space, underscore or other
    digits)."""
    if not _ID_TEXT.fullmatch(text):
        raise ValueError(f"{what} {text!r} is not valid: write ids as plain digits 0-9, e.g. 42 "
                         "(no sign, spaces, underscores or other scripts' digits)")
    value = int(text)
    if not 0 < value <= ID_MAX:
        raise ValueError(f"{what} {text} is out of range: ids are 1 to 2**63-1")
    return value


def check_id(value: object, what: str = "job id") -> int:
    """A job or graph id given to the API: an int (not a bool), 1 to 2**63-1, returned
    as is. Raises ``TypeError`` for another type, naming the fix (a str from a URL:
    ``int(...)``), and ``ValueError`` out of range. Without it a bool or a float reached
    the server as another type, and its error read as a schema problem (a trial)."""
    if isinstance(value, bool) or not isinstance(value, int):
        hint = f"; pass int({value!r}) for an id read as text" if isinstance(value, str) else ""
        raise TypeError(f"a {what} is an int (what enqueue returned), got {type(value).__name__} {value!r}{hint}")
    if not 0 < value <= ID_MAX:
        raise ValueError(f"{what} {value} is out of range: ids are 1 to 2**63-1")
    return value


def check_ids(values: object, what: str = "job id") -> list[int]:
    """:func:`check_id` of each of a sequence of ids (a str or a single int is refused:
    ``[42]``, not ``42``)."""
    if isinstance(values, (str, bytes, int)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{what}s are a list of ints, e.g. [{values!r}], got {type(values).__name__} {values!r}")
    return [check_id(v, what) for v in values]  # type: ignore[attr-defined]


def quantity(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun, in the singular for 1 only: '1 claimer', '0 claimers', '4 claimers'.

    ``plural`` for a noun that does not take an s ('1 entry', '2 entries'); in a compound
    such as 'finished job', the last word is the one made plural.
    """
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def schema_flag(schema: str) -> str:
    """`` --schema NAME`` for a command printed in a hint, or "" for the default schema
    (a hint followed as printed must reach the worker's schema, not the default one). The
    name is shell-quoted: a schema may be named with spaces or quotes, and the hint is
    pasted into a shell as printed."""
    return "" if schema == DEFAULT_SCHEMA else f" --schema {shlex.quote(schema)}"
