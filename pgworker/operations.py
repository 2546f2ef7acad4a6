"""Operator actions, audited with who performed them (the App's :meth:`cancel`,
:meth:`replay`, :meth:`retry`, :meth:`prune`, :meth:`pause_queue`, :meth:`resume_queue`,
:meth:`configure_queue` and :meth:`delete_queue`): the validation of their arguments,
a queue's policies included, and their store calls; and whether a queue name is in use."""

from __future__ import annotations

import os
import shlex
import socket
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Sequence

import psycopg

from .config import MAX_SETTING_SECONDS
from .errors import ConfigError, QueuePaused
from .jobs import ReplayResult
from .names import check_queue_name

if TYPE_CHECKING:
    from .app import App

#: The default of a queue policy not given to :meth:`App.configure_queue`: left as it is
#: (None removes it).
UNSET: Any = object()
PRUNE_BATCH = 10_000
#: The largest concurrency limit, rate (jobs/s) and burst a queue may be given.
QUEUE_LIMIT_MAX = 1_000_000


def cancel(app: App, job_id: int, *, actor: str | None, conn: psycopg.Connection | None) -> str | None:
    with app.connection(conn) as c:
        return app.store.cancel(c, job_id, actor=actor or _actor())


def replay(app: App, job_ids: Sequence[int], *, queue: str | None, limit: int,
           actor: str | None) -> ReplayResult:
    if queue is not None:
        check_queue_name(queue)
    with app.connection() as c:
        return app.store.replay(c, ids=list(job_ids), queue=queue, limit=limit, actor=actor or _actor())


def prune(app: App, older_than: "float | timedelta", *, batch: int) -> int:
    seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else float(older_than)
    if not 0 <= seconds <= MAX_SETTING_SECONDS:
        raise ConfigError("older_than must be >= 0 seconds")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 1_000_000:
        # a batch of 0 deleted nothing, never fell short of the batch, and looped for good
        raise ConfigError(f"batch (CLI: --batch) must be from 1 to 1,000,000 rows per statement, got {batch!r}")
    total = 0
    with app.connection() as c:
        while True:
            counts = app.store.prune(c, succeeded_seconds=seconds, cancelled_seconds=seconds,
                                     dead_seconds=None, limit=batch)
            total += sum(counts.values())
            if max(counts.values()) < batch:
                return total


def pause_queue(app: App, queue: str, *, actor: str | None) -> dict[str, Any]:
    check_queue_name(queue)
    with app.connection() as c:
        return app.store.pause_queue(c, queue, actor=actor or _actor())


def resume_queue(app: App, queue: str, *, actor: str | None) -> bool:
    check_queue_name(queue)
    with app.connection() as c:
        return app.store.resume_queue(c, queue, actor=actor or _actor())


def configure_queue(app: App, queue: str, *, concurrency_limit: "int | None", rate_limit: "float | None",
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
    with app.connection() as c:
        return app.store.configure_queue(c, queue, actor=actor or _actor(), **params)


def delete_queue(app: App, queue: str, *, actor: str | None) -> dict[str, Any] | None:
    check_queue_name(queue)
    with app.connection() as c:
        row = app.store.delete_queue(c, queue, actor=actor or _actor())
    if row is not None and not row["deleted"]:
        raise QueuePaused(f"queue {queue!r} is paused (since {row['paused_at'].isoformat(timespec='seconds')}, by "
                          f"{row['paused_by']}): resume it first with `pgworker queue resume {shlex.quote(queue)}` "
                          "(App.resume_queue), then delete it; nothing was changed")
    if row is None:
        return None
    return {k: row[k] for k in ("concurrency_limit", "rate_per_second", "rate_burst", "aging_seconds")}


def queue_usage(app: App, queue: str) -> dict[str, bool]:
    check_queue_name(queue)
    with app.connection() as c:
        usage = dict(app.store.queue_usage(c, queue))
    usage["in_app"] = queue in app.queues()
    return usage


def retry(app: App, job_id: int, *, actor: str | None) -> dict[str, Any] | None:
    with app.connection() as c:
        return app.store.retry_now(c, job_id, actor=actor or _actor())


def _actor() -> str:
    """Who performed an operator action: $PGWORKER_ACTOR, else user@host."""
    import getpass

    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return os.environ.get("PGWORKER_ACTOR") or f"{user}@{socket.gethostname()}"
