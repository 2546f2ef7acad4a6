"""Tasks for the console's tests: jobs that die until healed (the test creates the file
$WEB_TEST_DIR/heal-<the payload's group>, then replays them), a job that runs until
cancelled, quick ones, a schedule, and a task and queue whose names, error message and
payload carry HTML and script, and one whose progress message and result do (with a
secret in the result, which the console redacts)."""

from __future__ import annotations

import os
import time

import pgworker

app = pgworker.App()

HOSTILE_QUEUE = "<script>alert('queue')</script>"
HOSTILE_TASK = "<img src=x onerror=alert('task')>"
HOSTILE_MESSAGE = "</pre><script>alert('error')</script><b onmouseover=alert(1)>x</b>"
HOSTILE_PROGRESS = "<img src=x onerror=alert('progress')>"
HOSTILE_RESULT = "</pre><script>window.__pwned = 1; alert('result')</script>"


def _healed(payload) -> bool:
    group = payload.get("group", "") if isinstance(payload, dict) else ""
    return os.path.exists(os.path.join(os.environ.get("WEB_TEST_DIR", "/nonexistent"), f"heal-{group}"))


@app.task(name="quick", max_attempts=1)
def quick(payload, ctx):
    return None


@app.task(name="dies", max_attempts=1)
def dies(payload, ctx):
    if not _healed(payload):
        raise pgworker.Permanent("upstream refused the request: HTTP 503")


@app.task(name="runs_until_cancelled", max_attempts=1)
def runs_until_cancelled(payload, ctx):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ctx.check()  # raises once the cancellation reaches the lease
        time.sleep(0.05)


@app.task(name="paused_queue_job", queue="pausable", max_attempts=1)
def paused_queue_job(payload, ctx):
    return None


@app.task(name="yearly_report", max_attempts=1, schedule="0 6 1 1 *", schedule_tz="Europe/Paris")
def yearly_report(payload, ctx):
    return None


def _deliver(payload):
    # the source line, HTML and script included, is what the stored traceback quotes
    raise ConnectionError("</pre><script>window.__pwned = 2</script> upstream closed the connection")


@app.task(name="breaks", max_attempts=1)
def breaks(payload, ctx):
    _deliver(payload)


@app.task(name=HOSTILE_TASK, queue=HOSTILE_QUEUE, max_attempts=1)
def hostile(payload, ctx):
    raise pgworker.Permanent(HOSTILE_MESSAGE)


@app.task(name="reports_and_returns", max_attempts=1)
def reports_and_returns(payload, ctx):
    ctx.progress(0.75, HOSTILE_PROGRESS, force=True)
    return {"html": HOSTILE_RESULT, "api_key": "sk-result-never-shown", "rows": 1250}
