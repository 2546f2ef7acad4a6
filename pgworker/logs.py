"""Structured logs with stable keys: action, queue, job_id, attempt, lease_token.

``PGWORKER_LOG_FORMAT=json`` prints one JSON object per line (for log pipelines);
the default is readable text. Payloads are never logged.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from .errors import ConfigError

STABLE_KEYS = ("action", "queue", "job_id", "attempt", "lease_token", "task", "worker")
# A failed attempt's record also carries ``traceback``: the handler's frames (see
# pgworker.worker.claimer.executor.handler_traceback), printed after the line.


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
               + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage(),
               "pid": record.process}
        for key in STABLE_KEYS:
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info and record.exc_info[0] is not None:
            out["error"] = record.exc_info[0].__name__
        if getattr(record, "traceback", None):
            out["traceback"] = record.traceback
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """One line per record; a failed attempt's handler traceback (the record's
    ``traceback``, frames only) follows on indented lines, as Python prints it."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        tb = getattr(record, "traceback", None)
        if tb:
            text += "\n  Traceback (most recent call last):\n" + "\n".join(
                "    " + line for line in tb.splitlines())
        return text


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TRACE_LEVEL = 5  # uvicorn's TRACE_LOG_LEVEL
LOG_FORMATS = ("text", "json")


def log_level_number(level: int | str) -> int:
    """``level`` as the logging module's number: an int as it is, or any level name the
    logging module knows, in any case (DEBUG ... CRITICAL, and WARN, FATAL, NOTSET), or
    uvicorn's TRACE (5: every ASGI message of `pgworker web`).
    Raises :class:`~pgworker.errors.ConfigError` naming the usual ones."""
    if isinstance(level, int):
        return level
    if str(level).upper() == "TRACE":  # uvicorn's level below DEBUG (its TRACE_LOG_LEVEL), for `pgworker web`
        return TRACE_LEVEL
    number = logging.getLevelName(str(level).upper())
    if not isinstance(number, int):
        raise ConfigError(f"log level {str(level)[:40]!r} (--log-level or PGWORKER_LOG_LEVEL) is not one of "
                          f"{', '.join(LOG_LEVELS)}")
    return number


def setup_logging(level: int | str | None = None, fmt: str | None = None) -> None:
    """Configure the root logger once for a pgworker process (stderr). ``level``: a
    logging level or one of :data:`LOG_LEVELS` (any case); ``fmt``: one of
    :data:`LOG_FORMATS`; each defaults to its environment variable, then INFO / text.
    Raises :class:`~pgworker.errors.ConfigError` naming the values it takes (an unknown
    level was a traceback from the logging module, an unknown format fell back to text)."""
    level = log_level_number(level or os.environ.get("PGWORKER_LOG_LEVEL", "INFO"))
    fmt = str(fmt or os.environ.get("PGWORKER_LOG_FORMAT", "text")).lower()
    if fmt not in LOG_FORMATS:
        raise ConfigError(f"log format {str(fmt)[:40]!r} (--log-format or PGWORKER_LOG_FORMAT) is not one of "
                          f"{', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
