"""Where a handler raised, as text: for the worker log's ``job_failed`` line and, bounded,
for the job's error history (``traceback`` of its entry, docs/web.md). Only the handler's
frames (the executor's own are dropped), each line cut, escaped and redacted."""

from __future__ import annotations

import os
import traceback
from typing import Any

from ...names import bounded_text, redact

TRACEBACK_FRAMES = 20
_OWN_DIR = os.path.dirname(os.path.abspath(__file__))  # the claimer's modules: their frames open every traceback
TRACEBACK_LINE_CHARS = 300
REDACT_CHARS = 1000  # how much of a line is redacted before it is cut to TRACEBACK_LINE_CHARS
#: The most of a traceback kept in a job's error history entry (its innermost frames):
#: with PGWORKER_ERROR_HISTORY_ENTRIES (10) entries, at most ~40 KB a job.
STORED_TRACEBACK_CHARS = 4000


def stored_traceback(trace: str) -> str | None:
    """``trace`` (from :func:`handler_traceback`) as kept with the job: its innermost
    lines within STORED_TRACEBACK_CHARS, whole lines, the cut marked; None when empty."""
    if not trace:
        return None
    if len(trace) <= STORED_TRACEBACK_CHARS:
        return trace
    kept = trace[-STORED_TRACEBACK_CHARS:]
    return "… (outer frames cut)\n" + kept[kept.find("\n") + 1:]


def handler_traceback(error: BaseException, secrets: Any = ()) -> str:
    """Where a handler's exception was raised, for the worker log: the innermost
    ``TRACEBACK_FRAMES`` frames, two lines each (file, line, function; the source line),
    without the exception's message (the log line before it carries that, bounded and
    escaped). Each line is cut to ``TRACEBACK_LINE_CHARS`` before it is redacted (a
    source line can be megabytes; redaction of a long run is not linear), with control
    characters and line breaks escaped so that a file or function name cannot forge log
    lines. "" when the frames cannot be read: the attempt's outcome never depends on it.
    The job's error history keeps its innermost lines too (:func:`stored_traceback`);
    spans keep the message only."""
    try:
        tb = error.__traceback__
        while tb is not None and tb.tb_next is not None and _own(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next  # the executor's own frame that called the handler: not the user's code
        frames = traceback.extract_tb(tb, limit=-TRACEBACK_FRAMES)
        outer = sum(1 for _ in traceback.walk_tb(tb)) - len(frames)
        lines = [f"… ({outer} outer frame(s) not shown)"] if outer > 0 else []
        for f in frames:
            lines.append(f'File "{f.filename}", line {f.lineno}, in {f.name}')
            if f.line:
                lines.append("  " + f.line.strip())
        # redacted before the cut (a cut inside a DSN's password left its start unredacted:
        # a trial), within REDACT_CHARS first so that redaction stays cheap on a huge line
        return "\n".join(redact(_log_text(line[:REDACT_CHARS]), *secrets)[:TRACEBACK_LINE_CHARS] for line in lines)
    except Exception:  # noqa: BLE001 - a loader or linecache failing must not cost the outcome
        return ""


def _own(filename: str) -> bool:
    return os.path.dirname(os.path.abspath(filename)) == _OWN_DIR


def _log_text(text: str) -> str:
    """One printable line: line breaks escaped, other control characters replaced."""
    return bounded_text(escape_line_breaks(text), len(text) + 2)


def escape_line_breaks(text: str) -> str:
    """Text for a log line: line breaks escaped, so an error message cannot forge lines."""
    return text.replace("\r", "\\r").replace("\n", "\\n")
