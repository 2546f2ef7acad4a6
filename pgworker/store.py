"""The thin database boundary: one method per named statement in ``sql/queries.sql``.

Nothing else in pgworker touches a cursor. Methods take an open psycopg connection and
leave transaction control to the caller, except where a transition needs more than one
statement to stay correct (ordering-key promotion, a cancel and its audit entry): those
run in :func:`atomic`, a transaction of their own on an autocommit connection, or simply
inside the caller's transaction otherwise (never committing it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Sequence

import psycopg
from psycopg import sql

from . import sql as sqlfiles
from .errors import SchemaNotMigrated, SchemaTooNew
from .jobs import ClaimedJob, FailRequest, FenceReport, Lease, ReapResult
from .names import check_schema_name

EMPTY_BIGINTS: list[int] = []


def atomic(conn: psycopg.Connection) -> contextlib.AbstractContextManager[Any]:
    """Group statements atomically without touching the caller's transaction.

    On an autocommit connection (pgworker's own) this is a transaction. On a connection
    the caller manages, the statements join the caller's transaction (psycopg opens one
    implicitly), which commits or rolls back as the caller decides; ``conn.transaction()``
    would instead commit at once when no transaction was open yet.
    """
    return conn.transaction() if conn.autocommit else contextlib.nullcontext()


def notify_channel(schema: str) -> str:
    """The NOTIFY channel for a schema: ``pgworker.<schema>``, hashed past 63 bytes."""
    name = f"pgworker.{schema}"
    if len(name.encode()) > 63:
        name = "pgworker." + hashlib.sha1(schema.encode()).hexdigest()[:20]
    return name


@dataclass(frozen=True)
class BackoffParams:
    """Backoff used by the reaper for expired leases (seconds)."""

    base_seconds: float = 5.0
    max_seconds: float = 600.0
    jitter: float = 0.5


class Store:
    """Named statements of one schema, rendered once (schema quoted as an identifier)."""

    def __init__(self, schema: str, *, error_history_entries: int = 10) -> None:
        self.schema = check_schema_name(schema)
        self.channel = notify_channel(schema)
        self.error_history_entries = error_history_entries
        self.queries: dict[str, str] = {
            name: sqlfiles.render(text, schema) for name, text in sqlfiles.query_templates().items()
        }
        self._sequence = sql.Identifier(schema, "jobs_id_seq").as_string(None)
        self._ordering_namespace = f"pgworker:{schema}:ordering"
        self._jobs_table = sql.Identifier(schema, "jobs")

    # -- helpers --------------------------------------------------------------------

    def _exec(self, conn: psycopg.Connection, name: str, params: dict[str, Any] | None = None,
              prepare: bool | None = None) -> psycopg.Cursor:
        return conn.execute(self.queries[name], params, prepare=prepare)

    # -- schema ---------------------------------------------------------------------

    def schema_version(self, conn: psycopg.Connection) -> int | None:
        """The applied schema version, or None when pgworker's schema is absent."""
        try:
            with conn.transaction():  # a savepoint or a transaction: a missing table must not abort the caller's
                row = self._exec(conn, "schema_version_get").fetchone()
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            return None
        return row[0] if row else None

    def check_schema_version(self, conn: psycopg.Connection) -> int:
        """Raise unless the schema is at exactly the version this code knows.

        Raises :class:`SchemaNotMigrated` (run ``pgworker migrate``) or
        :class:`SchemaTooNew` (upgrade pgworker). Returns the version.
        """
        known = len(sqlfiles.migrations())
        version = self.schema_version(conn)
        if version is None or version < known:
            at = "absent" if version is None else f"at version {version}"
            raise SchemaNotMigrated(
                f"the pgworker schema {self.schema!r} is {at}; this pgworker needs version {known}: "
                f"run `pgworker migrate` (or App.migrate()) with the same DSN and schema")
        if version > known:
            raise SchemaTooNew(
                f"the pgworker schema {self.schema!r} is at version {version}, newer than this "
                f"pgworker knows ({known}): upgrade pgworker before running it against this database")
        return version

    # -- enqueue --------------------------------------------------------------------

    def insert_job(self, conn: psycopg.Connection, *, queue: str, task: str, payload_json: str,
                   priority: int, run_at: datetime | None, delay_seconds: float, max_attempts: int,
                   dedupe_key: str | None, ordering_key: str | None,
                   trace_context: str | None) -> int | None:
        """Insert one job (and its wake-up); returns its id, or None on a dedupe conflict."""
        params = {
            "queue": queue, "task": task, "payload": payload_json, "priority": priority,
            "run_at": run_at, "delay": delay_seconds, "max_attempts": max_attempts,
            "dedupe_key": dedupe_key, "ordering_key": ordering_key,
            "trace_context": trace_context, "channel": self.channel, "notify_payload": queue,
        }
        if ordering_key is not None:
            with atomic(conn):
                self.lock_ordering_keys(conn, [ordering_key])
                row = self._exec(conn, "job_insert", params).fetchone()
        else:
            row = self._exec(conn, "job_insert", params).fetchone()
        return row[0] if row else None

    def allocate_ids(self, conn: psycopg.Connection, count: int) -> tuple[list[int], datetime]:
        """Reserve ``count`` job ids from the jobs sequence; also returns the database's now()."""
        rows = self._exec(conn, "job_ids_allocate", {"sequence": self._sequence, "count": count}).fetchall()
        return [r[0] for r in rows], rows[0][1]

    def insert_jobs_many(self, conn: psycopg.Connection, rows: dict[str, list[Any]]) -> dict[int, bool]:
        """Bulk insert with dedupe/ordering keys; returns {inserted id: due now}."""
        keys = sorted({k for k in rows["ordering_keys"] if k is not None})
        if keys:
            self.lock_ordering_keys(conn, keys)
        cur = self._exec(conn, "jobs_insert_many", rows)
        return {r[0]: r[1] for r in cur.fetchall()}

    def copy_jobs(self, conn: psycopg.Connection, rows: Iterable[tuple[Any, ...]]) -> None:
        """COPY jobs without dedupe or ordering keys (ids reserved by :meth:`allocate_ids`).

        Text format: payload and trace context arrive as JSON text and go in as they are
        (the server parses jsonb from text in either format), so no row needs a Python
        jsonb wrapper and psycopg formats each row in C.
        """
        stmt = sql.SQL("COPY {} (id, queue, task, payload, priority, run_at, max_attempts, trace_context) "
                       "FROM STDIN").format(self._jobs_table)
        with conn.cursor() as cur:
            with cur.copy(stmt) as copy:
                for r in rows:
                    copy.write_row(r)

    def jobs_by_dedupe_key(self, conn: psycopg.Connection, keys: Sequence[str]) -> dict[str, int]:
        cur = self._exec(conn, "jobs_by_dedupe_key", {"keys": list(keys)})
        return {r[0]: r[1] for r in cur.fetchall()}

    def notify_queues(self, conn: psycopg.Connection, queues: Iterable[str]) -> None:
        """One NOTIFY per queue (delivered when the transaction commits)."""
        payloads = sorted(set(queues))
        if payloads:
            self._exec(conn, "queues_notify", {"channel": self.channel, "payloads": payloads}).fetchall()

    # -- ordering keys --------------------------------------------------------------

    def lock_ordering_keys(self, conn: psycopg.Connection, keys: Sequence[str]) -> None:
        self._exec(conn, "ordering_keys_lock", {"namespace": self._ordering_namespace,
                                                "keys": list(keys)}).fetchall()

    def promote_ordering_keys(self, conn: psycopg.Connection, keys: Sequence[str]) -> list[int]:
        """Lock the keys, then unblock each key's head (a new statement, fresh snapshot)."""
        keys = sorted(set(keys))
        if not keys:
            return []
        with atomic(conn):
            self.lock_ordering_keys(conn, keys)
            cur = self._exec(conn, "ordering_keys_promote", {"keys": keys, "channel": self.channel})
            return [r[0] for r in cur.fetchall()]

    def _settle(self, conn: psycopg.Connection, name: str, params: dict[str, Any],
                leases: Sequence[Lease], promote_keys: Iterable[str | None]) -> list[tuple[Any, ...]]:
        keys = {k for k in promote_keys if k is not None}
        if not keys:
            return self._exec(conn, name, params).fetchall()
        with atomic(conn):
            rows = self._exec(conn, name, params).fetchall()
            done_keys = [r[-1] for r in rows if r[-1] is not None]
            if done_keys:
                self.promote_ordering_keys(conn, done_keys)
            return rows

    # -- the lifecycle --------------------------------------------------------------

    def claim(self, conn: psycopg.Connection, *, queue: str, limit: int, owner: str,
              lease_seconds: float) -> list[ClaimedJob]:
        """Claim up to ``limit`` due jobs of ``queue`` under a lease of ``lease_seconds``."""
        cur = self._exec(conn, "job_claim", {"queue": queue, "limit": limit, "owner": owner,
                                             "lease_seconds": lease_seconds})
        return [ClaimedJob(*row) for row in cur.fetchall()]

    def renew(self, conn: psycopg.Connection, leases: Sequence[Lease], *,
              lease_seconds: float) -> FenceReport:
        """Extend leases; ``details[id]`` is True when a cancellation was requested."""
        if not leases:
            return FenceReport("renew")
        cur = self._exec(conn, "job_renew", {"ids": [le.job_id for le in leases],
                                             "tokens": [le.token for le in leases],
                                             "lease_seconds": lease_seconds})
        return FenceReport.build("renew", leases, cur.fetchall(), detail_column=2)

    def complete(self, conn: psycopg.Connection, leases: Sequence[Lease],
                 ordering_keys: Iterable[str | None] = ()) -> FenceReport:
        """Mark jobs succeeded (fenced). Pass the jobs' ordering keys to promote the next jobs."""
        if not leases:
            return FenceReport("complete")
        rows = self._settle(conn, "job_complete", {"ids": [le.job_id for le in leases],
                                                   "tokens": [le.token for le in leases]},
                            leases, ordering_keys)
        return FenceReport.build("complete", leases, rows)

    def fail(self, conn: psycopg.Connection, requests: Sequence[FailRequest]) -> FenceReport:
        """Record failures (fenced); ``details[id]`` is the new state, 'pending' or 'dead'."""
        if not requests:
            return FenceReport("fail")
        leases = [r.lease for r in requests]
        cur = self._exec(conn, "job_fail", {
            "ids": [r.lease.job_id for r in requests], "tokens": [r.lease.token for r in requests],
            "delays": [max(0.0, float(r.delay_seconds)) for r in requests],
            "permanent": [bool(r.permanent) for r in requests],
            "codes": [r.code for r in requests], "messages": [r.message for r in requests],
            "keep": self.error_history_entries})
        # A job that dies keeps its ordering key blocked until it is replayed or
        # discarded (cancelled), so nothing is promoted here.
        return FenceReport.build("fail", leases, cur.fetchall(), detail_column=2)

    def release(self, conn: psycopg.Connection, leases: Sequence[Lease]) -> FenceReport:
        """Return running jobs to pending without spending an attempt (fenced)."""
        if not leases:
            return FenceReport("release")
        cur = self._exec(conn, "job_release", {"ids": [le.job_id for le in leases],
                                               "tokens": [le.token for le in leases]})
        return FenceReport.build("release", leases, cur.fetchall())

    def snooze(self, conn: psycopg.Connection, leases: Sequence[Lease],
               delays_seconds: Sequence[float]) -> FenceReport:
        """Run jobs again after a delay without spending an attempt (fenced)."""
        if not leases:
            return FenceReport("snooze")
        cur = self._exec(conn, "job_snooze", {"ids": [le.job_id for le in leases],
                                              "tokens": [le.token for le in leases],
                                              "delays": [max(0.0, float(d)) for d in delays_seconds]})
        return FenceReport.build("snooze", leases, cur.fetchall())

    def finish_cancelled(self, conn: psycopg.Connection, leases: Sequence[Lease],
                         ordering_keys: Iterable[str | None] = ()) -> FenceReport:
        """Record running jobs that stopped after a cancellation request (fenced)."""
        if not leases:
            return FenceReport("cancel")
        rows = self._settle(conn, "job_cancel_finish", {"ids": [le.job_id for le in leases],
                                                        "tokens": [le.token for le in leases]},
                            leases, ordering_keys)
        return FenceReport.build("cancel", leases, rows)

    def reap(self, conn: psycopg.Connection, *, limit: int, backoff: BackoffParams) -> ReapResult:
        """Recover up to ``limit`` expired leases (one short transaction)."""
        with atomic(conn):
            rows = self._exec(conn, "jobs_reap", {
                "limit": limit, "backoff_base_seconds": backoff.base_seconds,
                "backoff_max_seconds": backoff.max_seconds, "backoff_jitter": backoff.jitter,
                "keep": self.error_history_entries}).fetchall()
            keys = [r[4] for r in rows if r[3] == "cancelled" and r[4] is not None]
            if keys:
                self.promote_ordering_keys(conn, keys)
        by_queue: dict[tuple[str, str], int] = {}
        for r in rows:
            by_queue[(r[1], r[3])] = by_queue.get((r[1], r[3]), 0) + 1
        return ReapResult(
            requeued=tuple(r[0] for r in rows if r[3] == "pending"),
            dead=tuple(r[0] for r in rows if r[3] == "dead"),
            cancelled=tuple(r[0] for r in rows if r[3] == "cancelled"),
            by_queue=by_queue)

    def lease_states(self, conn: psycopg.Connection, ids: Sequence[int]) -> list[tuple[Any, ...]]:
        """(id, state, lease_token, last_error_code) of jobs, to settle an unknown write."""
        return self._exec(conn, "job_lease_states", {"ids": list(ids)}).fetchall()

    # -- operator actions -----------------------------------------------------------

    def cancel(self, conn: psycopg.Connection, job_id: int, *, actor: str | None) -> str | None:
        """Cancel a job; returns the resulting state ('cancelled', or 'running' when a
        cancellation was requested from its worker), or None when nothing was cancellable."""
        with atomic(conn):
            row = self._exec(conn, "job_cancel", {"id": job_id}).fetchone()
            if row is None:
                return None
            self._exec(conn, "job_event_insert", {
                "ids": [job_id], "kind": "cancel_requested" if row[1] == "running" else "cancelled",
                "actor": actor, "detail": None})
            if row[1] == "cancelled" and row[2] is not None:
                self.promote_ordering_keys(conn, [row[2]])
        return row[1]

    def replay(self, conn: psycopg.Connection, *, ids: Sequence[int] = (), queue: str | None = None,
               limit: int = 1000, actor: str | None) -> list[int]:
        """Replay dead jobs by id, or up to ``limit`` dead jobs of ``queue``."""
        cur = self._exec(conn, "jobs_replay", {"ids": list(ids), "queue": queue, "limit": limit,
                                               "actor": actor, "channel": self.channel})
        return [r[0] for r in cur.fetchall()]

    def prune(self, conn: psycopg.Connection, *, older_than_seconds: float, limit: int) -> int:
        cur = self._exec(conn, "jobs_prune", {"older_than_seconds": older_than_seconds, "limit": limit})
        return len(cur.fetchall())

    # -- reads ----------------------------------------------------------------------

    def get_job(self, conn: psycopg.Connection, job_id: int) -> dict[str, Any] | None:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        row = cur.execute(self.queries["job_get"], {"id": job_id}).fetchone()
        if row is not None:
            events = conn.cursor(row_factory=psycopg.rows.dict_row).execute(
                self.queries["job_events_list"], {"id": job_id}).fetchall()
            row["events"] = events
        return row

    def list_jobs(self, conn: psycopg.Connection, *, queue: str | None, state: str | None,
                  limit: int) -> list[dict[str, Any]]:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["jobs_list"], {"queue": queue, "state": state,
                                                       "limit": limit}).fetchall()

    def queue_stats(self, conn: psycopg.Connection, queues: Sequence[str]) -> list[dict[str, Any]]:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queue_stats"], {"queues": list(queues)}).fetchall()

    def queue_status(self, conn: psycopg.Connection) -> list[dict[str, Any]]:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queue_status"]).fetchall()

    def due_count(self, conn: psycopg.Connection, queues: Sequence[str]) -> int:
        return self._exec(conn, "jobs_due_count", {"queues": list(queues)}).fetchone()[0]


def json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))
