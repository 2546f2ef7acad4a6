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
    from .core import Core


def claim(core: Core, queue: str, *, limit: int, lease_seconds: float | None, owner: str | None,
          conn: psycopg.Connection | None) -> list[ClaimedJob]:
    check_queue_name(queue)
    with core.connection(conn) as c:
        return core.store.claim(c, queue=queue, limit=limit, owner=owner or core.worker_id(),
                               lease_seconds=lease_seconds or core.settings.lease_seconds,
                               aging_seconds=core.settings.priority_aging_seconds)


def _lease(job: "ClaimedJob | Lease") -> Lease:
    return job.lease if isinstance(job, ClaimedJob) else job


def complete(core: Core, job: "ClaimedJob | Lease", *, result: Any = None, conn: psycopg.Connection | None) -> None:
    lease = _lease(job)
    keys = [job.ordering_key] if isinstance(job, ClaimedJob) else None  # None: read from the row
    encoded = encode_result(result, core.settings.result_max_bytes)  # ResultRefused (a ValueError): nothing written
    with core.connection(conn) as c:
        report = core.store.complete(c, [lease], keys, [encoded])
    if not report.ok:
        raise LeaseLost(job_id=lease.job_id, lease_token=lease.token, operation="complete")


def fail(core: Core, job: "ClaimedJob | Lease", error: BaseException, *, attempt: int | None,
         retry: RetryPolicy | None, conn: psycopg.Connection | None) -> str:
    lease = _lease(job)
    s = core.settings
    failure = classify(error, classifier=core.classify_error, max_chars=s.error_message_max_chars,
                       secrets=(dsn_password(s.dsn),))
    attempt = attempt or (job.attempt if isinstance(job, ClaimedJob) else 1)
    task = core.tasks.get(job.task) if isinstance(job, ClaimedJob) else None
    policy = retry or (task.retry if task is not None else RetryPolicy())
    delay = failure.retry_after if failure.retry_after is not None else policy.delay(attempt)
    with core.connection(conn) as c:
        report = core.store.fail(c, [FailRequest(lease, failure.code, failure.message, delay, failure.permanent)])
    if not report.ok:
        raise LeaseLost(job_id=lease.job_id, lease_token=lease.token, operation="fail")
    return report.details[lease.job_id]


def renew(core: Core, job: "ClaimedJob | Lease", *, lease_seconds: float | None,
          conn: psycopg.Connection | None) -> bool:
    lease = _lease(job)
    with core.connection(conn) as c:
        report = core.store.renew(c, [lease], lease_seconds=lease_seconds or core.settings.lease_seconds)
    if not report.ok:
        raise LeaseLost(job_id=lease.job_id, lease_token=lease.token, operation="renew")
    return bool(report.details[lease.job_id][0])


def release(core: Core, job: "ClaimedJob | Lease", *, conn: psycopg.Connection | None) -> None:
    lease = _lease(job)
    keys = [job.ordering_key] if isinstance(job, ClaimedJob) else None  # None: read from the row
    with core.connection(conn) as c:
        report = core.store.release(c, [lease], keys)
    if not report.ok:
        raise LeaseLost(job_id=lease.job_id, lease_token=lease.token, operation="release")


def reap(core: Core, *, limit: int, retry: RetryPolicy | None) -> ReapResult:
    with core.connection() as c:
        return core.store.reap(c, limit=limit, delay_for=retry_delays(core.tasks, retry))
