"""The supervisor's start: wait for PostgreSQL and a schema this pgworker can use."""

from __future__ import annotations

import difflib
import logging
import shlex
import time
from typing import Any

import psycopg

from ..config import Settings
from ..connections import with_schema_hint
from ..db import POOLED, connect, describe_failure, set_session_timeouts
from ..errors import DatabaseRefused, DatabaseUnavailable, MissingGrants, PoolerError, SchemaNotMigrated
from ..grants import current_role, missing_privileges
from .outcome import TIMEOUT_SQLSTATES
from .service import Backoff

log = logging.getLogger("pgworker.supervisor")

DRAIN_DATABASE_WAIT_SECONDS = 60.0  # a drain run without --max-duration gives up on the database after this
DATABASE_WAIT_LOG_SECONDS = 60.0    # while waiting for the database, say so again this often
# what the worker's grants give that only the pruner uses (PGWORKER_PRUNE=false needs none)
PRUNER_OBJECTS = frozenset({"delete_finished_jobs", "delete_queue_events", "queue_events"})
# What only some features use, by object: lacking it is a warning naming the feature, not
# a refusal (a deployment that granted less than grants.sql on purpose keeps working);
# lacking the rest (the claim's and the outcomes' columns and tables) stops the start.
FEATURE_OBJECTS = {
    **{name: "the pruner (or PGWORKER_PRUNE=false and `pgworker prune` as the owner)" for name in PRUNER_OBJECTS},
    "schedules": "the scheduler (periodic jobs)", "job_dependencies": "handlers that enqueue dependent jobs",
    "job_steps": "ctx.step and ctx.effect", "pods": "the pod registry (the console's Workers page)",
    "jobs_id_seq": "handlers that enqueue jobs"}


def wait_for_database(settings: Settings, store: Any, health: Any, received: list[int], *, drain: bool,
                      max_duration: float | None) -> bool:
    """Connect and check the schema version, retrying while the server is away (a
    database may come up later): logged at once, then again every
    DATABASE_WAIT_LOG_SECONDS; /readyz (``health``) says why. Returns True once it
    answers; False when a signal arrives (``received`` is no longer empty), or, in drain
    mode, past its deadline (``max_duration`` seconds, else DRAIN_DATABASE_WAIT_SECONDS).
    Raises :class:`SchemaVersionError` for a schema of another version,
    :class:`PoolerError` when LISTEN would go through a pooler, and
    :class:`DatabaseRefused`, in drain mode, when the server refuses the DSN for good (no
    such database or role, credentials refused): waiting out the deadline cannot help;
    :class:`MissingGrants`, in drain mode, when the role lacks a privilege of the worker's
    grants (``pgworker sql grants --worker``; an always-on worker waits for them, logging
    and /readyz naming what is missing)."""
    backoff = Backoff()
    limit = max_duration if max_duration is not None else DRAIN_DATABASE_WAIT_SECONDS
    deadline = time.monotonic() + (limit if drain else float("inf"))
    next_log, logged_kind = 0.0, ""
    while not received:
        try:
            kind, features = "grants", ""
            with connect(settings.dsn, application_name="pgworker:supervisor",
                         prepare=settings.prepared_statements) as conn:
                # bounded: a migration's lock on the schema's tables once held a drain run
                # here, silent and deaf to SIGTERM, for as long as the lock lasted
                set_session_timeouts(conn, statement_timeout=settings.statement_timeout_seconds,
                                     lock_timeout=settings.lock_timeout_seconds)
                try:
                    waiting, features = _schema_and_grants(conn, settings, store)
                except psycopg.OperationalError as exc:
                    if exc.sqlstate not in TIMEOUT_SQLSTATES:  # the connection went: as unreachable
                        raise DatabaseUnavailable(describe_failure(exc, settings.dsn)) from None
                    kind, waiting = "busy", (
                        f"checking the schema gave up waiting ({describe_failure(exc)}): another session holds "
                        "a lock on the schema's tables (a migration running? pg_locks, pg_stat_activity)")
                pooled = conn in POOLED
            if waiting:
                if drain and kind == "grants":  # as a refusal: the next run tries again, waiting cannot grant
                    raise MissingGrants(f"{waiting}; a drain run does not wait for grants")
                health.db_failed(kind, waiting)
                if time.monotonic() >= next_log or kind != logged_kind:
                    log.error("%s; checking again with backoff (said again every %.0f s while it lasts)",
                              waiting, DATABASE_WAIT_LOG_SECONDS, extra={"action": f"start_{kind}"})
                    next_log, logged_kind = time.monotonic() + DATABASE_WAIT_LOG_SECONDS, kind
                if time.monotonic() > deadline:
                    log.error("drain run gave up: the schema could not be checked for %.0f s", limit)
                    return False
                _sleep(backoff.next(), health, received)
                continue
            if pooled and health.listen_required and not settings.listen_dsn:
                raise PoolerError(
                    "PGWORKER_DSN goes through a connection pooler, and LISTEN needs a session of "
                    "its own (a transaction-mode pooler would drop its notifications): set "
                    "PGWORKER_LISTEN_DSN (--listen-dsn) to a direct connection to PostgreSQL, "
                    "or run with --no-listen to rely on the poll")
            if features:
                log.warning("%s", features, extra={"action": "grants_partial"})
            health.db_ok()
            health.schema_ok = True
            return True
        except DatabaseUnavailable as exc:
            if drain and isinstance(exc, DatabaseRefused):
                # A drain run (a CronJob's) stops at once: waiting out its deadline cannot
                # create the database or right the password, and the next run tries again.
                # A long-running worker waits, as for an unreachable server: its database
                # may be created after it starts (/readyz names the refusal meanwhile).
                raise DatabaseRefused(f"{exc}; a drain run does not retry a refusal: fix --dsn (PGWORKER_DSN) "
                                      "and run again") from None
            reason = describe_failure(exc, settings.dsn)
            health.db_failed("unreachable", reason)
            if time.monotonic() >= next_log or logged_kind != "unreachable":
                log.error("%s; retrying with backoff (said again every %.0f s while it lasts)",
                          reason, DATABASE_WAIT_LOG_SECONDS, extra={"action": "db_unavailable"})
                next_log, logged_kind = time.monotonic() + DATABASE_WAIT_LOG_SECONDS, "unreachable"
            if time.monotonic() > deadline:
                log.error("drain run gave up: PostgreSQL stayed unreachable for %.0f s", limit)
                return False
            _sleep(backoff.next(), health, received)
    return False


def warn_unknown_queues(app: Any) -> None:
    """Log a warning for each queue of --queues (PGWORKER_QUEUES) that none of the app's
    tasks or schedules uses: a typo there ('i0' for 'io') left a worker idle in silence (a drain run
    reported success with the jobs still due). Not an error: jobs enqueued with
    ``queue=`` of any name are legitimate."""
    configured = app.settings.queues
    task_queues = sorted({"default", *(t.queue for t in app.tasks.values()),
                          *(s.queue for s in getattr(app, "schedules", {}).values())})
    for queue in configured or ():
        if queue in task_queues:
            continue
        close = difflib.get_close_matches(queue, task_queues, n=1, cutoff=0.5)
        log.warning("queue %r (--queues, PGWORKER_QUEUES) is no queue of the app's tasks or schedules (%s): this worker "
                    "takes from it only jobs enqueued there with queue=...%s", queue, ", ".join(task_queues),
                    f"; did you mean {close[0]!r}?" if close else "", extra={"action": "queue_unknown"})


def _schema_and_grants(conn: psycopg.Connection, settings: Settings, store: Any) -> tuple[str, str]:
    """Check the schema's version (raises as :func:`wait_for_database` says), then the
    worker's grants: ('', '') when both are right; else (what the role lacks to claim and
    record outcomes, with the fix: '' when nothing) and (the warning for what only some
    features need: '' when nothing)."""
    try:
        store.check_schema_version(conn)
    except SchemaNotMigrated as exc:
        raise with_schema_hint(settings, exc) from None
    except psycopg.errors.InsufficientPrivilege:  # no USAGE on the schema, or no SELECT on migrations
        return _grants_message(current_role(conn), settings, [
            "USAGE ON SCHEMA or SELECT ON migrations, at least (what else it lacks cannot be read without them)"]), ""
    return _lacking_grants(conn, settings)


def _lacking_grants(conn: psycopg.Connection, settings: Settings) -> tuple[str, str]:
    """See :func:`_schema_and_grants` (without the check, a role that could not claim had
    every claim refused and retried in silence until a drain run's deadline)."""
    skip = set() if settings.prune else set(PRUNER_OBJECTS)
    if not settings.schedules:
        skip.add("schedules")
    lacking = missing_privileges(conn, settings.schema, "worker", skip=frozenset(skip))
    if not lacking:
        return "", ""
    role = current_role(conn)
    needed = [item for item in lacking if _feature(item) is None]
    optional = [item for item in lacking if _feature(item) is not None]
    features = sorted({str(_feature(item)) for item in optional})
    warning = (f"role {role!r} lacks what some features need on schema {settings.schema!r}: {'; '.join(optional)}; "
               f"they fail when used ({', '.join(features)}). Fix: {_fix(role, settings)}") if optional else ""
    return (_grants_message(role, settings, needed) if needed else ""), warning


def _feature(item: str) -> str | None:
    """The feature that alone needs a lacking privilege ('INSERT (id, ...) ON jobs'), or
    None for one a claim or an outcome needs."""
    where = item.rsplit(" ON ", 1)[-1]
    if where == "jobs" and item.startswith("INSERT"):
        return "handlers that enqueue jobs"
    return FEATURE_OBJECTS.get(where)


def _fix(role: str, settings: Settings) -> str:
    return (f"the schema's owner applies the worker's grants with `pgworker sql grants --worker {shlex.quote(role)} "
            f"--schema {shlex.quote(settings.schema)} --apply`")


def _grants_message(role: str, settings: Settings, lacking: list[str]) -> str:
    return (f"role {role!r} lacks privileges a worker needs to claim jobs and record their outcomes on schema "
            f"{settings.schema!r}: {'; '.join(lacking)}. Fix: {_fix(role, settings)}, or run the worker as the owner")


def _sleep(seconds: float, health: Any, received: list[int]) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not received:
        health.tick()  # waiting for the database is not being stuck
        time.sleep(min(0.1, max(0.0, end - time.monotonic())))
