"""Where a handler raised, as text: for the worker log's ``job_failed`` line and, bounded,
for the job's error history (``traceback`` of its entry, docs/web.md). Only the handler's
frames (the executor's own are dropped), each line cut, escaped and redacted."""

from __future__ import annotations

import os
import traceback
from typing import Any

from ...names import bounded_text, redact, redact_cut

TRACEBACK_FRAMES = 20
_OWN_DIR = os.path.dirname(os.path.abspath(__file__))  # the claimer's modules: their frames open every traceback
TRACEBACK_LINE_CHARS = 300
REDACT_CHARS = 1000  # how much of a line is redacted before it is cut to TRACEBACK_LINE_CHARS
#: The most of a traceback kept in a job's error history entry (its innermost frames):
#: with PGWORKER_ERROR_HISTORY_ENTRIES (10) entries, at most ~40 KB a job.
STORED_TRACEBACK_CHARS = 4000
#: How many exceptions of a chain (``raise ... from exc``, or raised while handling one)
#: are shown before the raised one, and the innermost frames shown of each.
CAUSE_LINKS = 3
CAUSE_FRAMES = 5
#: How many members of an exception group (an ``asyncio.TaskGroup``'s failures) are shown.
GROUP_MEMBERS = 3
_DIRECT_CAUSE = "The above exception was the direct cause of the following exception:"
_DURING_HANDLING = "During handling of the above exception, another exception occurred:"


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
    escaped). Before them, as Python prints them, the exceptions it was raised from or
    while handling (up to ``CAUSE_LINKS``, first cause first): each one's innermost
    ``CAUSE_FRAMES`` frames, its type and message, and the sentence linking it; after them,
    for an exception group, its first ``GROUP_MEMBERS`` members the same way. Each line
    is redacted within its first ``REDACT_CHARS`` (a source line can be megabytes;
    redaction of a long run is not linear), then cut to ``TRACEBACK_LINE_CHARS``, with
    control characters and line breaks escaped so that a file or function name cannot
    forge log lines. "" when the frames cannot be read: the attempt's outcome never depends on it.
    The job's error history keeps its innermost lines too (:func:`stored_traceback`);
    spans keep the message only."""
    try:
        lines: list[str] = []
        for cause, link in _causes(error):  # the first cause first, as Python prints them
            lines += _frame_lines(cause.__traceback__, CAUSE_FRAMES)
            lines += [_summary(cause), "", link, ""]
        tb = error.__traceback__
        while tb is not None and tb.tb_next is not None and _own(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next  # the executor's own frame that called the handler: not the user's code
        lines += _frame_lines(tb, TRACEBACK_FRAMES)
        if isinstance(error, BaseExceptionGroup):  # an asyncio.TaskGroup's: what its tasks raised
            lines += _group_lines(error)
        # redacted before the cut (a cut inside a DSN's password left its start unredacted:
        # a trial), within REDACT_CHARS first so that redaction stays cheap on a huge line,
        # and before line breaks are escaped ('password:\n  value' kept its value: a trial)
        return "\n".join(_log_text(_redacted(line, secrets))[:TRACEBACK_LINE_CHARS] for line in lines)
    except Exception:  # noqa: BLE001 - a loader or linecache failing must not cost the outcome
        return ""


def _redacted(line: str, secrets: Any) -> str:
    if len(line) > REDACT_CHARS:
        return redact_cut(line[:REDACT_CHARS], *secrets)
    return redact(line, *secrets)


def _causes(error: BaseException) -> list[tuple[BaseException, str]]:
    """The exceptions ``error`` was raised from or while handling, nearest last, at most
    CAUSE_LINKS, each with Python's sentence for the link (``raise ... from None`` shows
    none, as in Python's own traceback)."""
    chain: list[tuple[BaseException, str]] = []
    seen = {id(error)}
    current = error
    while len(chain) < CAUSE_LINKS:
        if current.__cause__ is not None:
            nxt, link = current.__cause__, _DIRECT_CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            nxt, link = current.__context__, _DURING_HANDLING
        else:
            break
        if id(nxt) in seen:  # a cycle of causes
            break
        seen.add(id(nxt))
        chain.append((nxt, link))
        current = nxt
    return chain[::-1]


def _group_lines(group: BaseExceptionGroup[Any]) -> list[str]:
    """An exception group's first GROUP_MEMBERS members, after the group's own frames as
    Python prints them: each one's innermost CAUSE_FRAMES frames, type and message."""
    members = group.exceptions
    lines: list[str] = []
    for n, member in enumerate(members[:GROUP_MEMBERS], 1):
        lines.append(f"+---- sub-exception {n} of {len(members)} ----")
        lines += _frame_lines(member.__traceback__, CAUSE_FRAMES)
        lines.append(_summary(member))
    if len(members) > GROUP_MEMBERS:
        lines.append(f"… ({len(members) - GROUP_MEMBERS} more sub-exception(s) not shown)")
    return lines


def _frame_lines(tb: Any, limit: int) -> list[str]:
    """Two lines a frame (file, line, function; the source line), innermost ``limit``."""
    frames = traceback.extract_tb(tb, limit=-limit)
    outer = sum(1 for _ in traceback.walk_tb(tb)) - len(frames)
    lines = [f"… ({outer} outer frame(s) not shown)"] if outer > 0 else []
    for f in frames:
        lines.append(f'File "{f.filename}", line {f.lineno}, in {f.name}')
        if f.line:
            lines.append("  " + f.line.strip())
    return lines


def _summary(error: BaseException) -> str:
    """A cause's type and message (the raised exception's own message is the log line's and
    the error history's ``message``; a cause's is only here)."""
    try:
        message = str(error)
    except BaseException:  # noqa: BLE001 - a failing __str__ (even SystemExit) must not cost the traceback or the claimer
        message = "<message could not be read>"
    name = type(error).__qualname__
    return f"{name}: {message}" if message else name


def _own(filename: str) -> bool:
    return os.path.dirname(os.path.abspath(filename)) == _OWN_DIR


def _log_text(text: str) -> str:
    """One printable line: line breaks escaped, other control characters replaced."""
    escaped = escape_line_breaks(text)
    return bounded_text(escaped, len(escaped) + 1)  # never cut here: the caller bounds the line


def escape_line_breaks(text: str) -> str:
    """Text for a log line: line breaks escaped, so an error message cannot forge lines."""
    return text.replace("\r", "\\r").replace("\n", "\\n")
