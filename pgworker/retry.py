"""Retry policy (exponential backoff with jitter and a cap) and failure classification.

The backoff follows "Exponential Backoff And Jitter" (Marc Brooker, AWS Architecture
Blog, 2015): the n-th retry waits ``min(max_seconds, base_seconds * factor**(n-1))``,
of which a random fraction up to ``jitter`` is taken off so that jobs failing together
do not retry together. ``jitter=0.5`` is "equal jitter", ``jitter=1.0`` "full jitter".
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Iterable

from .errors import ConfigError, InvalidPayload, JobCancelled, LeaseLost, Permanent, PgworkerError, Retry
from .jobs import MAX_DELAY_SECONDS
from .names import bounded_text, redact, redact_cut

RETRY_BASE_SECONDS = 1.0
RETRY_FACTOR = 2.0
RETRY_MAX_SECONDS = 3600.0
RETRY_JITTER = 0.5


@dataclass(frozen=True)
class RetryPolicy:
    """How long to wait before each retry (seconds).

    ``base_seconds``: the wait after the first failed attempt, 0 up to ``max_seconds``.
    ``factor``: each further wait is this many times longer, >= 1. ``max_seconds``: the
    cap of every wait, 0 up to ``MAX_DELAY_SECONDS`` (100 years, the longest delay a job
    can be given anywhere). ``jitter``: the fraction taken off at random, 0 to 1. Each a
    finite int or float (not a bool). Raises :class:`ConfigError` (a ``ValueError``)
    naming the field and the fix.
    """

    base_seconds: float = RETRY_BASE_SECONDS
    factor: float = RETRY_FACTOR
    max_seconds: float = RETRY_MAX_SECONDS
    jitter: float = RETRY_JITTER

    def __post_init__(self) -> None:
        for name in ("base_seconds", "factor", "max_seconds", "jitter"):
            value = getattr(self, name)
            # a bool is an int to Python: RetryPolicy(jitter=True) is a slip, not a fraction
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                hint = " (a number, not a duration string)" if isinstance(value, str) else ""
                raise ConfigError(f"RetryPolicy: {name} must be a finite number{hint}, got {value!r}")
        if not 0 <= self.max_seconds <= MAX_DELAY_SECONDS:
            raise ConfigError(f"RetryPolicy: max_seconds (the cap of every wait) must be from 0 to "
                              f"{MAX_DELAY_SECONDS:,.0f} seconds (100 years, the longest delay a job can be "
                              f"given), got {self.max_seconds!r}; e.g. max_seconds=3600 for an hour")
        if not 0 <= self.base_seconds <= self.max_seconds:
            raise ConfigError(f"RetryPolicy: base_seconds ({self.base_seconds!r}) must be from 0 to max_seconds "
                              f"({self.max_seconds!r}), the cap of every wait; lower base_seconds or raise "
                              "max_seconds to at least base_seconds")
        if self.factor < 1:
            raise ConfigError(f"RetryPolicy: factor must be >= 1 (each retry waits at least as long as the one "
                              f"before; 1 for a constant wait), got {self.factor!r}")
        if not 0 <= self.jitter <= 1:
            raise ConfigError(f"RetryPolicy: jitter is the fraction of each wait taken off at random, from 0 "
                              f"(none) to 1 (full jitter), got {self.jitter!r}")

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based), between
        ``(1 - jitter) * d`` and ``d`` where ``d = min(max_seconds, base_seconds *
        factor ** (attempt - 1))``. Any attempt number is safe: the exponent is compared
        with the one at which the cap is reached before anything is raised to a power
        (``max_attempts`` may be a million)."""
        capped = self.capped_delay(attempt)
        return capped * (1.0 - self.jitter * rng())

    def capped_delay(self, attempt: int) -> float:
        """The delay before jitter (seconds): ``min(max_seconds, base * factor ** (attempt - 1))``."""
        exponent = max(attempt - 1, 0)
        if self.base_seconds == 0 or self.max_seconds == 0:
            return 0.0
        if exponent == 0 or self.factor == 1:
            return min(self.max_seconds, self.base_seconds)
        at_cap = math.log(self.max_seconds / self.base_seconds) / math.log(self.factor)
        if exponent >= at_cap:
            return self.max_seconds
        return min(self.max_seconds, self.base_seconds * self.factor ** exponent)


@dataclass(frozen=True)
class FailureClass:
    """A classified failure: its code (stored, and the metric's error_class), a bounded
    message, whether it is permanent, and an explicit retry delay if one was asked for."""

    code: str
    message: str
    permanent: bool
    retry_after: float | None = None


Classifier = Callable[[BaseException], "FailureClass | bool | None"]


def error_code(exc: BaseException) -> str:
    """The stored code of an exception: a short ``pgworker_code`` attribute (any
    exception may carry one), the ``code`` of pgworker's own exceptions, else the class
    name (qualified outside builtins). ``SystemExit.code`` is an exit status, not a code."""
    code = getattr(exc, "pgworker_code", None)
    if code is None and isinstance(exc, PgworkerError):
        code = getattr(exc, "code", None)
    if isinstance(code, str) and 0 < len(code) <= 64 and code.isprintable():
        return code
    cls = type(exc)
    if cls.__module__ in ("builtins", "__main__"):
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"[:128]


def safe_message(exc: BaseException, max_chars: int, secrets: Iterable[str | None] = ()) -> str:
    """A bounded, printable, secret-free one-line message for an exception.

    Never includes a traceback or local variables; DSN passwords are redacted.
    """
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - an __str__ that raises, even SystemExit, must not end the claimer
        text = f"<unprintable {type(exc).__name__}>"
    if not text:
        text = type(exc).__name__
    # bound before the regex work so a huge message costs little (a URL's password cut
    # before its '@' is hidden all the same: redact_cut)
    if len(text) > max_chars * 4:
        return bounded_text(redact_cut(text[: max_chars * 4], *secrets), max_chars)
    return bounded_text(redact(text, *secrets), max_chars)


def classify(exc: BaseException, *, permanent_types: tuple[type[BaseException], ...] = (),
             classifier: Classifier | None = None, max_chars: int = 1000,
             secrets: Iterable[str | None] = ()) -> FailureClass:
    """Decide how a handler's exception is recorded.

    Order: pgworker's own control exceptions (``Permanent`` and ``InvalidPayload`` are
    permanent, ``Retry`` carries a delay); then ``classifier(exc)``, which may return a
    :class:`FailureClass`, True (permanent), False (transient) or None (no opinion); then
    ``permanent_types``. Anything else is transient, including ``BaseException``
    subclasses such as ``SystemExit`` and ``KeyboardInterrupt`` raised by handler code.
    """
    message = safe_message(exc, max_chars, secrets)
    code = error_code(exc)
    if isinstance(exc, (Permanent, InvalidPayload)):
        return FailureClass(code, message, True)
    if isinstance(exc, Retry):
        return FailureClass(code, message, False, exc.after)
    if isinstance(exc, (LeaseLost, JobCancelled)):
        return FailureClass(code, message, False)
    if classifier is not None:
        verdict = classifier(exc)
        if isinstance(verdict, FailureClass):
            return verdict
        if verdict is True or verdict is False:
            return FailureClass(code, message, verdict)
    if permanent_types and isinstance(exc, permanent_types):
        return FailureClass(code, message, True)
    return FailureClass(code, message, False)
