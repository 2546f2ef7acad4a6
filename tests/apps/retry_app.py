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
    """Always snoozes 3 s (a snooze spends no attempt): within the test's 5 s poll interval,
    so a drain run that held for it would run it again; longer than the run's own retries
    take, so that it is not due yet when the run ends (at 0.3 s it was, on a loaded machine,
    and counted as left)."""
    raise pgworker.Snooze(3.0)


@app.task(name="hangs_first", max_attempts=2, timeout=0.5,
          retry=pgworker.RetryPolicy(base_seconds=0.3, jitter=0))
def hangs_first(payload, ctx):
    """Hangs its first attempt past its timeout (a sync handler: the supervisor stops its
    claimer and writes the TIMEOUT retry, due 0.3 s later); returns on the second."""
    if ctx.attempt == 1:
        import time

        time.sleep(60)


@app.task(name="slow_first", max_attempts=2, retry=pgworker.RetryPolicy(base_seconds=1.5, jitter=0))
def slow_first(payload, ctx):
    """Sleeps 30 s on its first attempt (the test kills its claimer meanwhile: the retry,
    1.5 s later, falls due after its replacement's first claim); returns on the second."""
    if ctx.attempt == 1:
        import time

        time.sleep(30)
