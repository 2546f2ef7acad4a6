"""The value types of the command line's flags: durations (a retention's unit written
out), ids, positive integers, and the 'none' a limit can be set back to. Each raises
argparse.ArgumentTypeError with the form it wants, so argparse prints the fix."""

from __future__ import annotations

import argparse
import re

from ..names import cancel_reason_too_long, parse_id

#: The exit status of a usage error (argparse's own): the command line itself is wrong.
EXIT_USAGE = 2

# ASCII digits only (re.ASCII): \d also matches Arabic-Indic, Devanagari or fullwidth
# digits, and '١٠s' was read as 10 seconds, which nobody typed (as names.parse_id refuses them)
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d|w)?\s*$", re.ASCII)
_OTHER_DIGITS = re.compile(r"[^\x00-\x7f]")
_ASCII_DIGITS = "write its digits as plain 0-9 (no other scripts' digits)"
_UNITS = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """'90', '90s', '15m', '12h', '7d', '2w', '250ms' -> seconds."""
    m = _DURATION.match(text)
    if not m and any(c.isdigit() for c in _OTHER_DIGITS.findall(text)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: {_ASCII_DIGITS}, e.g. 30s, 15m, 12h, 7d")
    if not m and _DURATION.match(text.strip().removeprefix("-")):
        raise argparse.ArgumentTypeError(f"{text!r} is negative: a duration is 0 or more, e.g. 30s, 15m, 12h, 7d")
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; use forms like 30s, 15m, 12h, 7d")
    return float(m.group(1)) * _UNITS[m.group(2)]


def retention_duration(text: str) -> float:
    """A duration that deletes data: like :func:`parse_duration`, but its unit must be
    written ('7' would be 7 seconds, and `prune --older-than 7` deleted what a user meant
    to keep for 7 days)."""
    number = text.strip()
    if not number or number[-1] in "0123456789":
        example = number if re.fullmatch(r"[0-9]+(\.[0-9]+)?", number) else "7"
        raise argparse.ArgumentTypeError(f"{text!r} has no unit: write it, e.g. {example}d for days "
                                         f"or {example}s for seconds")
    return parse_duration(text)


_NONE = ("none", "off", "null", "-")


# `pgworker status` splits pending jobs by what they wait for; a job's state is pending.
_STATUS_ONLY = {"due": "due now", "scheduled": "scheduled later", "blocked": "waiting for an earlier job of its "
                "ordering key (`pgworker dead keys` lists the keys a dead job holds)"}


def _job_state(text: str) -> str:
    if text in _STATUS_ONLY:
        raise argparse.ArgumentTypeError(
            f"{text!r} is how `pgworker status` counts pending jobs {_STATUS_ONLY[text]}: a job's state is "
            "pending; use --state pending")
    return text


def _ascii(text: str, what: str) -> str:
    """``text`` if it holds no non-ASCII digit: int() and float() read '١٠' as 10."""
    if any(c.isdigit() for c in _OTHER_DIGITS.findall(text)):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}: {_ASCII_DIGITS}")
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(_ascii(text, "an integer"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _replay_limit(text: str) -> int:
    """`dead replay --limit N`: 1 to pgworker.jobs.REPLAY_LIMIT_MAX (a number past bigint
    was refused by the server, as a statement error)."""
    from ..jobs import REPLAY_LIMIT_MAX

    value = _positive_int(text)
    if value > REPLAY_LIMIT_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {REPLAY_LIMIT_MAX:,} (one transaction), got {value:,}; "
                                         "run the replay again for the rest")
    return value


def _int_or_none(text: str) -> int | None:
    if text.strip().lower() in _NONE:
        return None
    try:
        return int(_ascii(text, "an integer"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (or 'none')") from None


def _float_or_none(text: str) -> float | None:
    if text.strip().lower() in _NONE:
        return None
    try:
        return float(_ascii(text, "a number"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (or 'none')") from None


def _duration_or_none(text: str) -> float | None:
    return None if text.strip().lower() in _NONE else parse_duration(text)


def _job_id(text: str) -> int:
    """A job (or graph) id: ASCII digits, 1 to 2**63-1 (:func:`pgworker.names.parse_id`)."""
    try:
        return parse_id(text, "id")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cancel_reason(text: str) -> str:
    """An operator's cancel reason, refused when longer than
    :data:`pgworker.names.CANCEL_REASON_MAX_CHARS` (:func:`pgworker.names.cancel_reason_too_long`,
    the API's check too): App.cancel cuts a longer one with '…', which a command line
    would do without a word."""
    why = cancel_reason_too_long(text)
    if why is not None:
        raise argparse.ArgumentTypeError(why)
    return text
