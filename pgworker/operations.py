"""Operator actions, audited with who performed them (the App's :meth:`cancel`,
:meth:`replay`, :meth:`retry`, :meth:`prune`, :meth:`resolve_effect`, :meth:`pause_queue`,
:meth:`resume_queue`, :meth:`configure_queue` and :meth:`delete_queue`): the validation of
their arguments, a queue's policies included, and their store calls; whether a queue name
is in use; and the reads an operator makes (jobs, queues, their events, schedules). Each
takes the App's :class:`pgworker.core.Core`."""

from __future__ import annotations

import difflib
import json
import os
import shlex
import socket
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Sequence

import psycopg

from .config import MAX_SETTING_SECONDS
from .connections import require_sync
from .errors import ConfigError, QueuePaused
from .jobs import ReplayResult, check_replay_limit
from .names import check_id, check_ids, check_queue_name, check_task_name, checked_cancel_reason, schema_flag
from .schedules import Periodic, describe

if TYPE_CHECKING:
    from .core import Core

#: The default of a queue policy not given to :meth:`App.configure_queue`: left as it is
#: (None removes it).
UNSET: Any = object()
PRUNE_BATCH = 10_000
#: The largest concurrency limit, rate (jobs/s) and burst a queue may be given.
QUEUE_LIMIT_MAX = 1_000_000


def cancel(core: Core, job_id: int, *, actor: str | None, conn: psycopg.Connection | None,
           reason: str | None = None) -> str | None:
    require_sync(conn, "acancel")
    check_id(job_id)
    stored = checked_cancel_reason(reason)  # refused before any connection is taken
    with core.connection(conn) as c:
        return core.store.cancel(c, job_id, actor=actor or _actor(), reason=stored)


def replay(core: Core, job_ids: Sequence[int], *, queue: str | None, limit: int,
           actor: str | None, clean: bool = False) -> ReplayResult:
    job_ids = check_ids(job_ids)
    check_replay_limit(limit)
    if queue is not None:
        check_queue_name(queue)
    with core.connection() as c:
        if not clean:
            return core.store.replay(c, ids=list(job_ids), queue=queue, limit=limit, actor=actor or _actor())
        # one transaction: no worker can claim a replayed job before its steps are forgotten
        with c.transaction():
            result = core.store.replay(c, ids=list(job_ids), queue=queue, limit=limit, actor=actor or _actor())
            if result:
                core.store.steps_clean(c, list(result), actor=actor or _actor())
        return result


def resolve_effect(core: Core, job_id: int, name: str, *, result: Any = UNSET, retry: bool = False,
                   actor: str | None = None) -> str:
    """Resolve an effect left uncertain (see App.resolve_effect); returns the job's state."""
    check_id(job_id)
    if (result is UNSET) == (not retry):
        raise ConfigError(f"resolve_effect({job_id}, {name!r}): give result= (the effect happened: its JSON "
                          "result, None allowed) or retry=True (call it again with the same idempotency "
                          "key), exactly one of them (CLI: `pgworker effects resolve ID NAME --result JSON` or "
                          "`... --retry`)")
    if result is UNSET:
        result = None
    text = None
    if not retry:
        try:
            text = json.dumps(result, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"the effect's result must be JSON ({exc})") from None
    with core.connection() as c:
        row = core.store.effect_resolve(c, job_id, name, retry=retry, result_json=text, by=actor or _actor())
        if row is None:
            raise ConfigError(_unresolved(core, c, job_id, name))
    return row[0]


def _unresolved(core: Core, conn: psycopg.Connection, job_id: int, name: str) -> str:
    """Why resolve_effect changed nothing, naming what the job has: its state when running
    or unknown, else its effects left uncertain and the closest of its effects' names
    (a typo such as 'gatway' for 'gateway' said only "no effect")."""
    see = f"see `pgworker jobs show {job_id}{schema_flag(core.settings.schema)}`"
    job = core.store.get_job(conn, job_id)
    if job is None:
        return f"there is no job {job_id} in schema {core.settings.schema!r} (--schema, PGWORKER_SCHEMA)"
    if job["state"] == "running":
        return (f"job {job_id} is running: its attempt owns its effects; resolve {name!r} once the job is not "
                f"running ({see})")
    records = job.get("steps") or []
    effects = [s["name"] for s in records if s["kind"] == "effect"]
    uncertain = [s["name"] for s in records if s["kind"] == "effect" and s["status"] == "started"]
    kind = next((s["kind"] for s in records if s["name"] == name), None)
    if kind == "effect":
        why = f": {name!r} is recorded done already"
    elif kind == "step":
        why = f": {name!r} is a step (ctx.step), not an effect"
    else:
        close = difflib.get_close_matches(name, effects, n=1, cutoff=0.6)
        why = f"; did you mean {close[0]!r}?" if close else ""
    has = (f"its effects left uncertain: {', '.join(map(repr, uncertain))}" if uncertain
           else "it has no effect left uncertain" + (f" (its effects: {', '.join(map(repr, effects))})"
                                                     if effects else ""))
    return f"job {job_id} has no effect {name!r} left started (uncertain){why}; {has} ({see})"


def prune(core: Core, older_than: "float | timedelta", *, batch: int) -> int:
    seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else float(older_than)
    if not 0 <= seconds <= MAX_SETTING_SECONDS:  # NaN too
        raise ConfigError(f"older_than (CLI: --older-than) must be from 0 seconds to {MAX_SETTING_SECONDS:,.0f} "
                          f"(100 years), got {seconds:,.0f} s")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 1_000_000:
        # a batch of 0 deleted nothing, never fell short of the batch, and looped for good
        raise ConfigError(f"batch (CLI: --batch) must be from 1 to 1,000,000 rows per statement, got {batch!r}")
    total = 0
    with core.connection() as c:
        while True:
            counts = core.store.prune(c, succeeded_seconds=seconds, cancelled_seconds=seconds,
                                     dead_seconds=None, limit=batch)
            total += sum(counts.values())
            if max(counts.values()) < batch:
                return total


def pause_queue(core: Core, queue: str, *, actor: str | None) -> dict[str, Any]:
    check_queue_name(queue)
    with core.connection() as c:
        return core.store.pause_queue(c, queue, actor=actor or _actor())


def resume_queue(core: Core, queue: str, *, actor: str | None) -> bool:
    check_queue_name(queue)
    with core.connection() as c:
        return core.store.resume_queue(c, queue, actor=actor or _actor())


def configure_queue(core: Core, queue: str, *, concurrency_limit: "int | None", rate_limit: "float | None",
                    burst: "float | None", aging: "float | timedelta | None", actor: str | None) -> dict[str, Any]:
    check_queue_name(queue)
    params: dict[str, Any] = {}
    if concurrency_limit is not UNSET:
        if concurrency_limit is not None and (isinstance(concurrency_limit, bool) or
                                              not isinstance(concurrency_limit, int) or
                                              not 1 <= concurrency_limit <= QUEUE_LIMIT_MAX):
            raise ConfigError(f"concurrency_limit (CLI: --concurrency) must be an integer from 1 to {QUEUE_LIMIT_MAX:,}, "
                              f"or None ('none') to remove it; got {concurrency_limit!r}")
        params.update(concurrency_limit=concurrency_limit, set_concurrency=True)
    if rate_limit is not UNSET:
        if rate_limit is not None:
            # NaN fails every comparison below; infinity or a huge burst once made every claim of
            # the queue fail (the token count is cast to an integer in job_claim)
            if isinstance(rate_limit, bool) or not isinstance(rate_limit, (int, float)) or \
                    not 0 < rate_limit <= QUEUE_LIMIT_MAX:
                raise ConfigError(f"rate_limit (CLI: --rate) must be jobs per second above 0 and up to "
                                  f"{QUEUE_LIMIT_MAX:,}, or None ('none') to remove it; got {rate_limit!r}")
            burst = max(1.0, float(rate_limit)) if burst is None else burst
            if isinstance(burst, bool) or not isinstance(burst, (int, float)) or not 1 <= burst <= QUEUE_LIMIT_MAX:
                raise ConfigError(f"burst (CLI: --burst) must be from 1 to {QUEUE_LIMIT_MAX:,} jobs, got {burst!r}")
            params.update(rate=float(rate_limit), burst=float(burst))
        elif burst is not None:
            raise ConfigError("burst (CLI: --burst) with the rate limit removed: a burst is the bucket of a rate; "
                              "give rate_limit (CLI: --rate) in jobs per second with it")
        params["set_rate"] = True
    elif burst is not None:
        # a queue that already has a rate was refused with "burst without a rate limit"
        raise ConfigError("burst (CLI: --burst) is set with its rate: give rate_limit (CLI: --rate) too, even if "
                          "the queue already has one (e.g. --rate 20 --burst 40; its current rate: "
                          "`pgworker queue list`)")
    if aging is not UNSET:
        seconds = aging.total_seconds() if isinstance(aging, timedelta) else aging
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                    or not 0 < seconds <= MAX_SETTING_SECONDS):
            raise ConfigError(f"aging (CLI: --aging) must be seconds above 0 and up to {MAX_SETTING_SECONDS:,}, "
                              f"or None ('none') to remove it; got {aging!r}")
        params.update(aging_seconds=None if seconds is None else float(seconds), set_aging=True)
    with core.connection() as c:
        return core.store.configure_queue(c, queue, actor=actor or _actor(), **params)


def delete_queue(core: Core, queue: str, *, actor: str | None) -> dict[str, Any] | None:
    check_queue_name(queue)
    with core.connection() as c:
        row = core.store.delete_queue(c, queue, actor=actor or _actor())
    if row is not None and not row["deleted"]:
        raise QueuePaused(f"queue {queue!r} is paused (since {row['paused_at'].isoformat(timespec='seconds')}, by "
                          f"{row['paused_by']}): resume it first with `pgworker queue resume {shlex.quote(queue)}` "
                          "(App.resume_queue), then delete it; nothing was changed")
    if row is None:
        return None
    return {k: row[k] for k in ("concurrency_limit", "rate_per_second", "rate_burst", "aging_seconds")}


def queue_usage(core: Core, queue: str) -> dict[str, bool]:
    check_queue_name(queue)
    with core.connection() as c:
        usage = dict(core.store.queue_usage(c, queue))
    usage["in_app"] = queue in core.queues()
    return usage


def retry(core: Core, job_id: int, *, actor: str | None) -> dict[str, Any] | None:
    check_id(job_id)
    with core.connection() as c:
        return core.store.retry_now(c, job_id, actor=actor or _actor())


# -- reads ---------------------------------------------------------------------------


def get_job(core: Core, job_id: int) -> dict[str, Any] | None:
    check_id(job_id)
    with core.connection() as c:
        return core.store.get_job(c, job_id)


def list_jobs(core: Core, *, queue: str | None, state: str | None, limit: int,
              graph_id: int | None, task: str | None = None) -> list[dict[str, Any]]:
    if queue is not None:
        check_queue_name(queue)
    if task is not None:
        check_task_name(task)
    with core.connection() as c:
        return core.store.list_jobs(c, queue=queue, state=state, limit=limit, graph_id=graph_id, task=task)


def queue_settings(core: Core) -> list[dict[str, Any]]:
    with core.connection() as c:
        return core.store.list_queues(c)


def queue_events(core: Core, queue: str, *, limit: int) -> list[dict[str, Any]]:
    with core.connection() as c:
        return core.store.queue_events(c, queue, limit=limit)


def list_schedules(core: Core, declared: dict[str, Periodic]) -> list[dict[str, Any]]:
    """Recorded and ``declared`` schedules with their next run (database clock)."""
    with core.connection() as c:
        rows = core.store.list_schedules(c)
        now = core.store.db_now(c)
    # an App with tasks is the user's code: its schedules are all there are
    return describe(declared, rows, now, app_known=bool(core.tasks or declared))


def _actor() -> str:
    """Who performed an operator action: $PGWORKER_ACTOR, else user@host."""
    import getpass

    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return os.environ.get("PGWORKER_ACTOR") or f"{user}@{socket.gethostname()}"
