"""Tasks for the acceptance tests. Each records what it did in a ledger table (in the
test's schema) keyed by the job's idempotency key, so tests can count side effects.

Environment: PGWORKER_DSN, PGWORKER_SCHEMA (set by the test), and LEDGER_DSN (a direct
connection for the ledger, so a proxy cut between worker and database does not hide it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import psycopg
from psycopg import sql

import pgworker

app = pgworker.App()
FAST = pgworker.RetryPolicy(base_seconds=0.05, factor=2, max_seconds=0.2, jitter=0.0)


def ledger(ctx, event, note=None):
    schema = sql.Identifier(os.environ["PGWORKER_SCHEMA"])
    with psycopg.connect(os.environ.get("LEDGER_DSN") or os.environ["PGWORKER_DSN"], autocommit=True) as c:
        c.execute(sql.SQL("INSERT INTO {}.ledger (idempotency_key, job_id, attempt, lease_token, event, pid, note) "
                          "VALUES (%s, %s, %s, %s, %s, %s, %s)").format(schema),
                  [ctx.idempotency_key, ctx.job_id, ctx.attempt, ctx.lease_token, event, os.getpid(), note])


def side_effect_once(ctx):
    """An external side effect made idempotent by the key (counts duplicates prevented)."""
    schema = sql.Identifier(os.environ["PGWORKER_SCHEMA"])
    with psycopg.connect(os.environ.get("LEDGER_DSN") or os.environ["PGWORKER_DSN"], autocommit=True) as c:
        c.execute(sql.SQL("INSERT INTO {}.effects (idempotency_key, job_id) VALUES (%s, %s) "
                          "ON CONFLICT (idempotency_key) DO UPDATE SET times = effects.times + 1")
                  .format(schema), [ctx.idempotency_key, ctx.job_id])


@app.task(name="noop")
def noop(payload):
    return None


@app.task(name="record", max_attempts=3, retry=FAST)
def record(payload, ctx):
    ledger(ctx, "run")


@app.task(name="sleep", max_attempts=3, retry=FAST)
def sleep(payload, ctx):
    """Sleep payload['seconds'] (heartbeating), recording start and end."""
    ledger(ctx, "start")
    end = time.monotonic() + payload["seconds"]
    while time.monotonic() < end:
        if payload.get("cooperative") and ctx.lease_lost:
            ledger(ctx, "noticed_lost")
            return None
        ctx.heartbeat()
        time.sleep(0.05)
    ledger(ctx, "end")


@app.task(name="checking", max_attempts=3, retry=FAST)
def checking(payload, ctx):
    """Work payload['seconds'] in 50 ms steps, calling ctx.check() between them; record
    start, then end, or noticed_lost when ctx.check() says the lease is lost (re-raised)."""
    ledger(ctx, "start")
    end = time.monotonic() + payload["seconds"]
    while time.monotonic() < end:
        try:
            ctx.check()
        except pgworker.LeaseLost:
            ledger(ctx, "noticed_lost")
            raise
        time.sleep(0.05)
    ledger(ctx, "end")


async def _await_unchecked(payload, ctx, converted=None):
    """Await payload['seconds'] in 50 ms sleeps, never looking at the context; record
    start, then end, or noticed_lost when the worker cancelled the task with the lease
    lost (task_cancelled otherwise), re-raising the cancellation or ``converted``."""
    ledger(ctx, "start")
    end = time.monotonic() + payload["seconds"]
    try:
        while time.monotonic() < end:
            await asyncio.sleep(0.05)
    except asyncio.CancelledError:
        ledger(ctx, "noticed_lost" if ctx.lease_lost else "task_cancelled")
        if converted is None:
            raise
        raise converted from None
    ledger(ctx, "end")


@app.task(name="async_unchecked", max_attempts=3, retry=FAST)
async def async_unchecked(payload, ctx):
    """Never checks its context: the worker cancels its task when the lease is lost."""
    await _await_unchecked(payload, ctx)


class Interrupted(Exception):
    """What async_converts turns its cancellation into (one of its permanent errors)."""


@app.task(name="async_converts", max_attempts=3, retry=FAST, permanent_errors=(Interrupted,))
async def async_converts(payload, ctx):
    """As async_unchecked, but a cancellation becomes its own permanent error: the worker
    must still record the lost lease (LEASE_LOST, retried), not a dead Interrupted."""
    await _await_unchecked(payload, ctx, converted=Interrupted("stopped mid-way"))


@app.task(name="crash_after_effect", max_attempts=3, retry=FAST)
def crash_after_effect(payload, ctx):
    side_effect_once(ctx)
    ledger(ctx, "effect")
    if ctx.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # dies after the effect, before the completion


@app.task(name="always_fails", max_attempts=3, retry=FAST)
def always_fails(payload, ctx):
    raise RuntimeError(f"failure number {ctx.attempt}")


@app.task(name="raises", max_attempts=2, retry=FAST)
def raises(payload, ctx):
    kind = {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt,
            "GeneratorExit": GeneratorExit, "MemoryError": MemoryError}[payload]
    raise kind("from the handler")


@app.task(name="async_echo", max_attempts=2, retry=FAST)
async def async_echo(payload, ctx):
    await asyncio.sleep(0.01)
    ledger(ctx, "async")


@app.task(name="returns", max_attempts=2, retry=FAST)
def returns(payload, ctx):
    """Returns a result (issue 21): its payload back, with the attempt that made it."""
    return {"echo": payload, "attempt": ctx.attempt}


@app.task(name="progresses", max_attempts=1, renew="progress")
def progresses(payload, ctx):
    """Reports its progress durably (issue 21) and returns it."""
    ctx.progress(0.5, "half way", force=True)
    return ctx.progress_value


@app.task(name="sturdy", max_attempts=30, retry=FAST)
def sturdy(payload, ctx):
    """A parent for the crash tests (issue 21): sleeps payload['seconds'], returns its id."""
    ledger(ctx, "start")
    time.sleep(payload.get("seconds", 0))
    return {"parent": ctx.job_id}


@app.task(name="sink", max_attempts=30, retry=FAST)
def sink(payload, ctx):
    """A child for the crash tests: records each run with its parents' results."""
    results = ctx.parent_results()
    ledger(ctx, "run", note=",".join(str(v["parent"]) for v in results.values()))
    return len(results)


@app.task(name="async_slow", max_attempts=1, timeout=0.5)
async def async_slow(payload, ctx):
    await asyncio.sleep(30)


@app.task(name="stoppable", max_attempts=3)
def stoppable(payload, ctx):
    """Runs until the worker stops, then hands itself back (Snooze(0): no attempt spent)."""
    ledger(ctx, "start")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if ctx.stopping:
            ledger(ctx, "noticed_stop")
            raise pgworker.Snooze(0)
        time.sleep(0.05)


@app.task(name="sync_slow", max_attempts=1, timeout=1)
def sync_slow(payload, ctx):
    ledger(ctx, "start")
    time.sleep(30)


@app.task(name="gil_hog", max_attempts=1)
def gil_hog(payload, ctx):
    """Holds the GIL inside one C call for payload seconds (no heartbeats, no renewals
    possible from this process)."""
    ledger(ctx, "start")
    end = time.monotonic() + payload
    while time.monotonic() < end:
        sum(range(30_000_000))  # one long C call: the GIL is never released inside it
    ledger(ctx, "end")


@app.task(name="typed", max_attempts=5, payload_type=dict)
def typed(payload, ctx):
    return None


def _make_point(payload):
    return (payload["x"], payload["y"])


@app.task(name="needs_point", max_attempts=5, payload_type=_make_point)
def needs_point(point, ctx):
    ledger(ctx, "point")


@app.task(name="snoozer", max_attempts=1)
def snoozer(payload, ctx):
    """Snoozes on its first run (no attempt spent), succeeds on the second."""
    ledger(ctx, "run")
    if ledger_count(ctx) == 1:
        raise pgworker.Snooze(0.2)


def ledger_count(ctx, event=None):
    """How many ledger rows this job has (of one event, or all): runs across attempts."""
    schema = sql.Identifier(os.environ["PGWORKER_SCHEMA"])
    with psycopg.connect(os.environ.get("LEDGER_DSN") or os.environ["PGWORKER_DSN"]) as c:
        return c.execute(sql.SQL("SELECT count(*) FROM {}.ledger WHERE job_id = %s AND (%s::text IS NULL "
                                 "OR event = %s)").format(schema), [ctx.job_id, event, event]).fetchone()[0]


# -- scheduling policies (tests/acceptance/test_scheduling.py) -------------------------


@app.task(name="keyed", max_attempts=3, retry=FAST)
def keyed(payload, ctx):
    """A job of an ordering key: records start and end in the ledger (the test checks that
    no two jobs of a key overlap, and their order); fails its first attempt if asked."""
    ledger(ctx, "start", payload.get("key"))
    time.sleep(payload.get("seconds", 0.01))
    if payload.get("fail_first") and not ledger_count(ctx, "fail"):
        ledger(ctx, "fail", payload.get("key"))
        raise RuntimeError("the first run fails")
    ledger(ctx, "end", payload.get("key"))


@app.task(name="limited", queue="limited", max_attempts=3, retry=FAST)
def limited(payload, ctx):
    """Runs on the queue the limit tests configure; records start and end."""
    ledger(ctx, "start")
    time.sleep(payload.get("seconds", 0.0) if isinstance(payload, dict) else 0.0)
    ledger(ctx, "end")


@app.task(name="other_queue", queue="other", max_attempts=3, retry=FAST)
def other_queue(payload, ctx):
    ledger(ctx, "start")
    time.sleep(payload.get("seconds", 0.0) if isinstance(payload, dict) else 0.0)
    ledger(ctx, "end")


@app.task(name="prio", max_attempts=3, retry=FAST)
def prio(payload, ctx):
    """The aging test's jobs: a short piece of work."""
    time.sleep(payload.get("seconds", 0.01))


@app.task(name="cooperative_cancel", max_attempts=1)
def cooperative_cancel(payload, ctx):
    """Works in small steps until a cancellation is requested, then stops by raising."""
    ledger(ctx, "start")
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if ctx.cancel_requested:
            ledger(ctx, "cancel_seen")
            raise pgworker.JobCancelled("stopping as asked")
        time.sleep(0.05)
    ledger(ctx, "end")


@app.task(name="dies_first", max_attempts=1)
def dies_first(payload, ctx):
    """Dies (permanent failure) on its first run, succeeds on any later one (a replay)."""
    ledger(ctx, "run")
    if ledger_count(ctx, "run") == 1:
        raise pgworker.Permanent("dies on its first run")


@app.task(name="progress_cancel", max_attempts=1)
def progress_cancel(payload, ctx):
    """Reports progress every 0.2 s and calls ctx.check() between steps, for a minute: a
    cancel reaches it through its progress writes (one a second), not only the renewal."""
    ledger(ctx, "start")
    end = time.monotonic() + 60
    step = 0
    while time.monotonic() < end:
        step += 1
        ctx.progress(min(step / 1000, 1.0), f"step {step}")
        ctx.check()
        time.sleep(0.2)
    ledger(ctx, "end")


@app.task(name="progress_steps", max_attempts=1)
def progress_steps(payload, ctx):
    """Six progress calls in well under a second (the throttle writes the first only), then
    returns or fails: the last value must still be the one the job keeps."""
    for k in range(1, 7):
        ctx.progress(k / 6, f"step {k}/6")
        time.sleep(0.01)
    if payload and payload.get("fail"):
        raise pgworker.Permanent("failed after its last step")


@app.task(name="async_cancel", max_attempts=1)
async def async_cancel(payload, ctx):
    """Awaits for a minute; its task is cancelled when the job is."""
    ledger(ctx, "start")
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        ledger(ctx, "task_cancelled")
        raise
    ledger(ctx, "end")


@app.task(name="ignores_cancel", max_attempts=1)
def ignores_cancel(payload, ctx):
    """Does not stop when asked: works until the test says 'go' (a ledger row), then
    returns normally, noting whether the cancellation request had reached it."""
    ledger(ctx, "start")
    schema = sql.Identifier(os.environ["PGWORKER_SCHEMA"])
    with psycopg.connect(os.environ.get("LEDGER_DSN") or os.environ["PGWORKER_DSN"], autocommit=True) as c:
        end = time.monotonic() + 60
        while time.monotonic() < end and not c.execute(
                sql.SQL("SELECT 1 FROM {}.ledger WHERE job_id = %s AND event = 'go'").format(schema),
                [ctx.job_id]).fetchone():
            time.sleep(0.05)
    end = time.monotonic() + 5  # the flag follows the renewal the test saw by a hair
    while not ctx.cancel_requested and time.monotonic() < end:
        time.sleep(0.01)
    ledger(ctx, "end", "cancel requested" if ctx.cancel_requested else "no request")


@app.task(name="retry_after", max_attempts=3)
def retry_after(payload, ctx):
    """Asks for its retry after payload seconds on the first attempt."""
    ledger(ctx, "run")
    if ctx.attempt == 1:
        raise pgworker.Retry(after=payload, reason="the upstream asked us to come back later")


@app.task(name="snooze_returned", max_attempts=1)
def snooze_returned(payload, ctx):
    """Returns a Snooze (instead of raising it) on its first run."""
    ledger(ctx, "run")
    if ledger_count(ctx) == 1:
        return pgworker.Snooze(0.3)
    return None


_LEAK: list[bytes] = []


@app.task(name="leak", max_attempts=3, retry=FAST)
def leak(payload, ctx):
    """Leaks payload['mb'] megabytes per job (a handler with a memory leak)."""
    _LEAK.append(os.urandom(payload["mb"] * 1024 * 1024))
    ledger(ctx, "leak")


# -- outcomes a worker must bound, and cancellations (tests/acceptance/test_outcome_writes.py) --


class CodeWithNulError(Exception):
    """Classified by the app's classifier into values PostgreSQL refuses as they are."""


def _classify(exc):
    if isinstance(exc, CodeWithNulError):
        return pgworker.retry.FailureClass("BAD\x00CODE", "a message with a NUL \x00 byte", False,
                                           retry_after=float("inf"))
    return None


app.classify_error = _classify


@app.task(name="bad_retry", max_attempts=3)
def bad_retry(payload, ctx):
    """Asks for a retry after payload seconds ('inf', 'nan' or a number) on its first
    attempt; succeeds on the next."""
    ledger(ctx, "run")
    if ctx.attempt == 1:
        raise pgworker.Retry(after=float(payload))


@app.task(name="bad_snooze", max_attempts=3)
def bad_snooze(payload, ctx):
    ledger(ctx, "run")
    raise pgworker.Snooze(float(payload))


@app.task(name="nul_code", max_attempts=3)
def nul_code(payload, ctx):
    ledger(ctx, "run")
    raise CodeWithNulError("classified into a code with a NUL byte")


@app.task(name="short_timeout", timeout=1.0, renew="progress", max_attempts=1)
def short_timeout(payload, ctx):
    """A quick job whose timeout and progress-tied renewal are shorter than the wait of a
    job queued behind a slow one."""
    ledger(ctx, "run")


@app.task(name="after_cancel", max_attempts=3, retry=FAST)
def after_cancel(payload, ctx):
    """Works until a cancellation is requested, then ends as payload says: 'fail' raises,
    'snooze' snoozes, 'return' succeeds."""
    ledger(ctx, "start")
    end = time.monotonic() + 60
    while time.monotonic() < end and not ctx.cancel_requested:
        time.sleep(0.05)
    ledger(ctx, "cancel_seen")
    if payload == "fail":
        raise RuntimeError("failing after the cancellation request")
    if payload == "snooze":
        raise pgworker.Snooze(0.1)


@app.task(name="async_exit", max_attempts=1)
async def async_exit(payload, ctx):
    """Awaits once, then raises SystemExit (or KeyboardInterrupt) from the handler."""
    await asyncio.sleep(0.01)
    raise {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}[payload](0)


@app.task(name="child_signals", max_attempts=1)
def child_signals(payload, ctx):
    """Starts `cat /proc/self/status` as `subprocess` does and as `os.posix_spawn` with
    `setsigdef` does, and records each child's ignored-signal mask (SigIgn, hex)."""
    import shutil
    import subprocess

    def sig_ign(status: str) -> str:
        return next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:"))

    ledger(ctx, "popen", note=sig_ign(subprocess.run(["cat", "/proc/self/status"], capture_output=True,
                                                     text=True, check=True).stdout))
    read, write = os.pipe()
    pid = os.posix_spawn(shutil.which("cat"), ["cat", "/proc/self/status"], os.environ,
                         file_actions=[(os.POSIX_SPAWN_DUP2, write, 1)],
                         setsigdef=(signal.SIGINT, signal.SIGHUP))
    os.close(write)
    with os.fdopen(read) as out:
        status = out.read()
    os.waitpid(pid, 0)
    ledger(ctx, "posix_spawn", note=sig_ign(status))
