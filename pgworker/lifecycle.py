"""The lifecycle of a job for custom consumers and tests (the App's :meth:`claim`,
:meth:`complete`, :meth:`fail`, :meth:`renew`, :meth:`release` and :meth:`reap`): claim
under a lease, then settle or renew it through the fence; recover expired leases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg

from .errors import LeaseLost
from .jobs import ClaimedJob, FailRequest, Lease, ReapResult
from .names import check_queue_name, dsn_password
from .results import encode_result
from .retry import RetryPolicy, classify
from .tasks import retry_delays

if TYPE_CHECKING:
    from .app import App


def claim(app: App, queue: str, *, limit: int, lease_seconds: float | None, owner: str | None,
          conn: psycopg.Connection | None) -> list[ClaimedJob]:
    check_queue_name(queue)
    with app.connection(conn) as c:
        return app.store.claim(c, queue=queue, limit=limit, owner=owner or app.worker_id(),
                               lease_seconds=lease_seconds or app.settings.lease_seconds,
                               aging_seconds=app.settings.priority_aging_seconds)


def _lease(job: "ClaimedJob | Lease") -> Lease:
    return job.lease if isinstance(job, ClaimedJob) else job


def complete(app: App, job: "ClaimedJob | Lease", *, result: Any = None, conn: psycopg.Connection | None) -> None:
    lease = _lease(job)
    keys = [job.ordering_key] if isinstance(job, ClaimedJob) else None  # None: read from the row
    encoded = encode_result(result, app.settings.result_max_bytes)  # ResultRefused (a ValueError): nothing written
    with app.connection(conn) as c:
        report = app.store.complete(c, [lease], keys, [encoded])
    if not report.ok:
        raise LeaseLost(job_id=lease.job_id, lease_token=lease.token, operation="complete")


def fail(app: App, job: "ClaimedJob | Lease", error: BaseException, *, attempt: int | None,
         retry: RetryPolicy | None, conn: psycopg.Connection | None) -> str:
    lease = _lease(job)
    s = app.settings
    failure = classify(error, classifier=app.classify_error, max_chars=s.error_message_max_chars,
                       secrets=(dsn_password(s.dsn),))
    attempt = attempt or (job.attempt if isinstance(job, ClaimedJob) else 1)
    task = app.tasks.get(job.task) if isinstance(job, ClaimedJob) else None
    policy = retry or (task.retry if task is not None else RetryPolicy())
    delay = failure.retry_after if failure.retry_after is not None else policy.delay(attempt)
    with app.connection(conn) as c:
        report = app.store.fail(c, [FailRequest(lease, failure.code, failure.message, delay, failure.permanent)])
    if not report.ok:
        raise LeaseLost(job_id=lease.job_id, lease_token=lease.token, operation="fail")
    return report.details[lease.job_id]


def renew(app: App, job: "ClaimedJob | Lease", *, lease_seconds: float | None,
          conn: psycopg.Connection | None) -> bool:
    lease = _lease(job)
    with app.connection(conn) as c:
        report = app.store.renew(c, [lease], lease_seconds=lease_seconds or app.settings.lease_seconds)
    if not report.ok:
        raise LeaseLost(job_id=lease.job_id, lease_token=lease.token, operation="renew")
    return bool(report.details[lease.job_id][0])


def release(app: App, job: "ClaimedJob | Lease", *, conn: psycopg.Connection | None) -> None:
    lease = _lease(job)
    keys = [job.ordering_key] if isinstance(job, ClaimedJob) else None  # None: read from the row
    with app.connection(conn) as c:
        report = app.store.release(c, [lease], keys)
    if not report.ok:
        raise LeaseLost(job_id=lease.job_id, lease_token=lease.token, operation="release")


def reap(app: App, *, limit: int, retry: RetryPolicy | None) -> ReapResult:
    with app.connection() as c:
        return app.store.reap(c, limit=limit, delay_for=retry_delays(app.tasks, retry))
