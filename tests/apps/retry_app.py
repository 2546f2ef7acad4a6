"""Tasks whose retries and snoozes fall due with no notification
(tests/acceptance/test_retry_wakeups.py)."""

from __future__ import annotations

import pgworker

app = pgworker.App()


@app.task(name="flaky", max_attempts=3)
def flaky(payload, ctx):
    """Fails its first attempt, asking to be retried in 0.3 s; succeeds on the second."""
    if ctx.attempt == 1:
        raise pgworker.Retry(after=0.3, reason="first attempt fails")


@app.task(name="retry_later", max_attempts=3)
def retry_later(payload, ctx):
    """Fails its first attempt, asking to be retried in a minute."""
    if ctx.attempt == 1:
        raise pgworker.Retry(after=60, reason="not now")


@app.task(name="snooze_forever", max_attempts=1)
def snooze_forever(payload, ctx):
    """Always snoozes 0.3 s (a snooze spends no attempt)."""
    raise pgworker.Snooze(0.3)
