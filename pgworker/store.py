"""The thin database boundary: one method per named statement in ``sql/queries/*.sql``.

Nothing else in pgworker touches a cursor. Methods take an open psycopg connection and
leave transaction control to the caller, except where a transition needs more than one
statement to stay correct (the ordering-key locks, the transition and the promotion of
the next job of a key; a limited queue's lock and its claim; a cancel and its audit
entry): those run in :func:`atomic`, a transaction of their own on an autocommit
connection, or simply inside the caller's transaction otherwise (never committing it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from datetime import datetime
from typing import Any, Callable, Iterable, Sequence

import psycopg
from psycopg import sql

from . import sql as sqlfiles
from .errors import SchemaNotMigrated, SchemaTooNew
from .jobs import MAX_DELAY_SECONDS, ClaimedJob, ClaimResult, FailRequest, FenceReport, Lease, ReapResult
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


class QueueStats(list):  # type: ignore[type-arg]
    """What :meth:`Store.queue_stats` returns: the per-queue rows (a list of dicts with
    the columns of the ``queue_stats`` statement, as before), plus

    - ``table``: the ``table_health`` row (a dict), or None when it could not be read;
    - ``table_error``: the exception class name of that failure, else None.

    A list, so that the callers that only want the per-queue rows see no difference; the
    metrics collector reads ``table`` too (pgworker.metrics.TableHealthGauges).
    """

    def __init__(self, rows: Iterable[dict[str, Any]], *, table: dict[str, Any] | None = None,
                 table_error: str | None = None) -> None:
        super().__init__(rows)
        self.table = table
        self.table_error = table_error


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
                   trace_context: str | None, dedupe_window_seconds: float | None = None,
                   dead_blocks_key: bool = True) -> int | None:
        """Insert one job (and its wake-up); returns its id, or None on a dedupe conflict."""
        params = {
            "queue": queue, "task": task, "payload": payload_json, "priority": priority,
            "run_at": run_at, "delay": delay_seconds, "max_attempts": max_attempts,
            "dedupe_key": dedupe_key, "dedupe_window": dedupe_window_seconds,
            "ordering_key": ordering_key, "dead_blocks_key": dead_blocks_key,
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

    def dedupe_holders(self, conn: psycopg.Connection, keys: Sequence[str]) -> dict[str, int]:
        """{dedupe key: id of the job holding it}, after releasing expired holds; a key
        missing from the result is free (insert again)."""
        cur = self._exec(conn, "dedupe_holders", {"keys": sorted(set(keys))})
        return {r[0]: r[1] for r in cur.fetchall()}

    def notify_queues(self, conn: psycopg.Connection, queues: Iterable[str]) -> None:
        """One NOTIFY per queue (delivered when the transaction commits)."""
        payloads = sorted(set(queues))
        if payloads:
            self._exec(conn, "queues_notify", {"channel": self.channel, "payloads": payloads}).fetchall()

    # -- ordering keys --------------------------------------------------------------
    #
    # Lock order: every transition that may change which job of an ordering key runs
    # next takes the keys' advisory locks (hash order) BEFORE it locks any job row, then
    # changes the rows, then promotes the next job of each key in a new statement. Claims
    # take no key lock (only the head of a key is claimable) and never wait (SKIP LOCKED).

    def lock_ordering_keys(self, conn: psycopg.Connection, keys: Sequence[str]) -> None:
        self._exec(conn, "ordering_keys_lock", {"namespace": self._ordering_namespace,
                                                "keys": list(keys)}).fetchall()

    def _promote(self, conn: psycopg.Connection, keys: Iterable[str]) -> list[int]:
        """Unblock the head of each key (the caller holds the keys' locks)."""
        keys = sorted(set(keys))
        if not keys:
            return []
        cur = self._exec(conn, "ordering_keys_promote", {"keys": keys, "channel": self.channel})
        return [r[0] for r in cur.fetchall()]

    def promote_ordering_keys(self, conn: psycopg.Connection, keys: Sequence[str]) -> list[int]:
        """Lock the keys, then unblock each key's head (a new statement, fresh snapshot)."""
        keys = sorted(set(keys))
        if not keys:
            return []
        with atomic(conn):
            self.lock_ordering_keys(conn, keys)
            return self._promote(conn, keys)

    def ordering_keys_of(self, conn: psycopg.Connection, ids: Sequence[int]) -> dict[int, str]:
        """{job id: ordering key} for those of ``ids`` that have one."""
        if not ids:
            return {}
        cur = self._exec(conn, "jobs_ordering_keys", {"ids": list(ids)})
        return {r[0]: r[1] for r in cur.fetchall()}

    def _keyed(self, conn: psycopg.Connection, name: str, params: dict[str, Any],
               keys: Iterable[str | None], promote_if: Any) -> list[tuple[Any, ...]]:
        """Run a transition statement under the ordering-key locks of ``keys`` and promote
        the keys of the rows for which ``promote_if(row)`` holds (its last column, or the
        one named by the caller, is the row's ordering key)."""
        keys = sorted({k for k in keys if k is not None})
        if not keys:
            return self._exec(conn, name, params).fetchall()
        with atomic(conn):
            self.lock_ordering_keys(conn, keys)
            rows = self._exec(conn, name, params).fetchall()
            self._promote(conn, [k for r in rows if (k := promote_if(r)) is not None])
            return rows

    def _keys_for(self, conn: psycopg.Connection, leases: Sequence[Lease],
                  ordering_keys: Iterable[str | None] | None) -> list[str | None]:
        if ordering_keys is not None:
            return list(ordering_keys)
        return list(self.ordering_keys_of(conn, [le.job_id for le in leases]).values())

    # -- the lifecycle --------------------------------------------------------------

    def claim(self, conn: psycopg.Connection, *, queue: str, limit: int, owner: str,
              lease_seconds: float, aging_seconds: float | None = None) -> list[ClaimedJob]:
        """Claim up to ``limit`` due jobs of ``queue`` under a lease of ``lease_seconds``,
        within the queue's policies (pause, limits, aging); see :meth:`claim_batch`."""
        return self.claim_batch(conn, queue=queue, limit=limit, owner=owner, lease_seconds=lease_seconds,
                                aging_seconds=aging_seconds).jobs

    def claim_batch(self, conn: psycopg.Connection, *, queue: str, limit: int, owner: str,
                    lease_seconds: float, aging_seconds: float | None = None,
                    limited: bool = False) -> ClaimResult:
        """Claim up to ``limit`` due jobs of ``queue``; returns the jobs and the queue's verdict.

        ``aging_seconds``: the priority-aging bound when the queue's row sets none (None:
        strict priority). ``limited``: the caller believes the queue has a concurrency or
        rate limit, so the claim goes straight to the locked form (queue_lock, then the
        claim as a new statement of the same transaction); otherwise the plain claim runs
        first and, if the queue turns out to be limited, the locked form follows.
        """
        params = {"queue": queue, "limit": limit, "owner": owner, "lease_seconds": lease_seconds,
                  "aging_seconds": aging_seconds, "locked": False}
        if not limited:
            result = self._claim_result(self._exec(conn, "job_claim", params).fetchall())
            if not (result.limited and not result.jobs and not result.paused):
                return result
        params["locked"] = True
        with atomic(conn):
            self._exec(conn, "queue_lock", {"queue": queue}).fetchall()
            return self._claim_result(self._exec(conn, "job_claim", params).fetchall())

    @staticmethod
    def _claim_result(rows: list[tuple[Any, ...]]) -> ClaimResult:
        first = rows[0]
        jobs = [ClaimedJob(*row[4:]) for row in rows if row[4] is not None]
        return ClaimResult(jobs=jobs, paused=first[0], limited=first[1], allowance=first[2],
                           retry_after_seconds=first[3])

    def renew(self, conn: psycopg.Connection, leases: Sequence[Lease], *,
              lease_seconds: float) -> FenceReport:
        """Extend leases by ``lease_seconds`` from now (fenced; an expired lease is not
        renewed). ``details[id]`` is (cancellation requested, new expiry in Unix seconds
        by the database clock)."""
        if not leases:
            return FenceReport("renew")
        cur = self._exec(conn, "job_renew", {"ids": [le.job_id for le in leases],
                                             "tokens": [le.token for le in leases],
                                             "lease_seconds": lease_seconds})
        rows = [(r[0], r[1], (r[2], r[3])) for r in cur.fetchall()]
        return FenceReport.build("renew", leases, rows, detail_column=2)

    def fetch_claimed(self, conn: psycopg.Connection, lease: Lease) -> ClaimedJob | None:
        """The claimed job under ``lease`` (still running under that token), or None."""
        row = self._exec(conn, "job_fetch", {"id": lease.job_id, "token": lease.token}).fetchone()
        return None if row is None else ClaimedJob(*row)

    def complete(self, conn: psycopg.Connection, leases: Sequence[Lease],
                 ordering_keys: Iterable[str | None] | None = None) -> FenceReport:
        """Mark jobs succeeded (fenced) and promote the next job of their ordering keys.

        ``ordering_keys``: the jobs' keys when the caller knows them (a claimer does);
        None reads them first (one statement), so that the key locks precede the row locks.
        """
        if not leases:
            return FenceReport("complete")
        keys = self._keys_for(conn, leases, ordering_keys)
        rows = self._keyed(conn, "job_complete", {"ids": [le.job_id for le in leases],
                                                  "tokens": [le.token for le in leases]},
                           keys, lambda r: r[2])
        return FenceReport.build("complete", leases, rows)

    def fail(self, conn: psycopg.Connection, requests: Sequence[FailRequest],
             ordering_keys: Iterable[str | None] | None = None) -> FenceReport:
        """Record failures (fenced); ``details[id]`` is the new state: 'pending' (retry
        after the request's delay, in seconds), 'dead', or 'cancelled' when a cancellation
        was requested while the attempt ran.

        A job that dies keeps its ordering key blocked until it is replayed or discarded
        (dead-head policy 'block'); with 'skip' (``dead_blocks_key`` false) the next job
        of its key is promoted at once. ``ordering_keys`` as for :meth:`complete`.
        """
        if not requests:
            return FenceReport("fail")
        leases = [r.lease for r in requests]
        keys = self._keys_for(conn, leases, ordering_keys)
        rows = self._keyed(conn, "job_fail", {
            "ids": [r.lease.job_id for r in requests], "tokens": [r.lease.token for r in requests],
            "delays": [_delay(r.delay_seconds) for r in requests],
            "permanent": [bool(r.permanent) for r in requests],
            "codes": [r.code for r in requests], "messages": [r.message for r in requests],
            "keep": self.error_history_entries},
            keys, lambda r: r[3] if r[2] == "cancelled" or (r[2] == "dead" and not r[4]) else None)
        return FenceReport.build("fail", leases, rows, detail_column=2)

    def release(self, conn: psycopg.Connection, leases: Sequence[Lease],
                ordering_keys: Iterable[str | None] | None = None) -> FenceReport:
        """Return running jobs to pending without spending an attempt (fenced); a job whose
        cancellation was requested ends cancelled instead (and promotes its key's next
        job). ``details[id]`` is the new state. ``ordering_keys`` as for :meth:`complete`."""
        if not leases:
            return FenceReport("release")
        keys = self._keys_for(conn, leases, ordering_keys)
        rows = self._keyed(conn, "job_release", {"ids": [le.job_id for le in leases],
                                                 "tokens": [le.token for le in leases]},
                           keys, lambda r: r[3] if r[2] == "cancelled" else None)
        return FenceReport.build("release", leases, rows, detail_column=2)

    def snooze(self, conn: psycopg.Connection, leases: Sequence[Lease],
               delays_seconds: Sequence[float], ordering_keys: Iterable[str | None] | None = None) -> FenceReport:
        """Run jobs again after a delay (seconds) without spending an attempt (fenced); a
        job whose cancellation was requested ends cancelled instead. ``details[id]`` is
        the new state. ``ordering_keys`` as for :meth:`complete`."""
        if not leases:
            return FenceReport("snooze")
        keys = self._keys_for(conn, leases, ordering_keys)
        rows = self._keyed(conn, "job_snooze", {"ids": [le.job_id for le in leases],
                                                "tokens": [le.token for le in leases],
                                                "delays": [_delay(d) for d in delays_seconds]},
                           keys, lambda r: r[3] if r[2] == "cancelled" else None)
        return FenceReport.build("snooze", leases, rows, detail_column=2)

    def finish_cancelled(self, conn: psycopg.Connection, leases: Sequence[Lease],
                         ordering_keys: Iterable[str | None] | None = None) -> FenceReport:
        """Record running jobs that stopped after a cancellation request (fenced), and
        promote the next job of their ordering keys (``ordering_keys`` as for :meth:`complete`)."""
        if not leases:
            return FenceReport("cancel")
        keys = self._keys_for(conn, leases, ordering_keys)
        rows = self._keyed(conn, "job_cancel_finish", {"ids": [le.job_id for le in leases],
                                                       "tokens": [le.token for le in leases]},
                           keys, lambda r: r[2])
        return FenceReport.build("cancel", leases, rows)

    def reap(self, conn: psycopg.Connection, *, limit: int,
             delay_for: Callable[[str, int], float] = lambda task, attempts: 0.0) -> ReapResult:
        """Recover up to ``limit`` expired leases (one short transaction).

        ``delay_for(task, attempts)`` gives the retry delay (seconds) of a job that goes
        back to pending: its task's retry policy. The candidates are read first so that
        their ordering keys can be locked before their rows; a key whose lock is held
        elsewhere (a caller's open transaction) is skipped, never waited for, and counted
        in ``skipped``. A job that ends cancelled, or dead under the 'skip' policy,
        promotes the next job of its key.
        """
        candidates = self._exec(conn, "jobs_reap_candidates", {"limit": limit}).fetchall()
        if not candidates:
            return ReapResult()
        keys = sorted({r[1] for r in candidates if r[1] is not None})
        with atomic(conn):
            skipped = 0
            if keys:
                granted = {r[0] for r in self._exec(conn, "ordering_keys_try_lock", {
                    "namespace": self._ordering_namespace, "keys": keys}).fetchall()}
                kept = [r for r in candidates if r[1] is None or r[1] in granted]
                skipped = len(candidates) - len(kept)
            else:
                kept = candidates
            rows = self._exec(conn, "jobs_reap", {
                "ids": [r[0] for r in kept], "delays": [_delay(delay_for(r[2], r[3])) for r in kept],
                "keep": self.error_history_entries}).fetchall() if kept else []
            self._promote(conn, [r[4] for r in rows if r[4] is not None
                                 and (r[3] == "cancelled" or (r[3] == "dead" and not r[6]))])
        by_queue: dict[tuple[str, str], int] = {}
        for r in rows:
            by_queue[(r[1], r[3])] = by_queue.get((r[1], r[3]), 0) + 1
        return ReapResult(
            requeued=tuple(r[0] for r in rows if r[3] == "pending"),
            dead=tuple(r[0] for r in rows if r[3] == "dead"),
            cancelled=tuple(r[0] for r in rows if r[3] == "cancelled"),
            by_queue=by_queue, candidates=len(candidates), skipped=skipped)

    def server_writable(self, conn: psycopg.Connection) -> bool:
        """False on a standby or a server set read-only (no write attempted)."""
        return bool(self._exec(conn, "server_writable").fetchone()[0])

    def lease_states(self, conn: psycopg.Connection, ids: Sequence[int]) -> list[tuple[Any, ...]]:
        """(id, state, lease_token, last_error_code) of jobs, to settle an unknown write."""
        return self._exec(conn, "job_lease_states", {"ids": list(ids)}).fetchall()

    # -- operator actions -----------------------------------------------------------

    def cancel(self, conn: psycopg.Connection, job_id: int, *, actor: str | None) -> str | None:
        """Cancel a job; returns the resulting state ('cancelled', or 'running' when a
        cancellation was requested from its worker), or None when nothing was cancellable.
        A job cancelled at once (pending, or a dead job discarded) promotes the next job of
        its ordering key; its key is locked first (read without a lock: it never changes)."""
        keys = list(self.ordering_keys_of(conn, [job_id]).values())
        with atomic(conn):
            if keys:
                self.lock_ordering_keys(conn, keys)
            row = self._exec(conn, "job_cancel", {"id": job_id}).fetchone()
            if row is None:
                return None
            self._exec(conn, "job_event_insert", {
                "ids": [job_id], "kind": "cancel_requested" if row[1] == "running" else "cancelled",
                "actor": actor, "detail": None})
            if row[1] == "cancelled" and row[2] is not None:
                self._promote(conn, [row[2]])
        return row[1]

    def replay(self, conn: psycopg.Connection, *, ids: Sequence[int] = (), queue: str | None = None,
               limit: int = 1000, actor: str | None) -> list[int]:
        """Replay dead jobs by id, or up to ``limit`` dead jobs of ``queue``.

        A job with an ordering key comes back behind whatever of its key is active and
        runs before the key's later jobs; one whose dedupe key is now held by another job
        stays dead (not returned). The keys are locked first, expired dedupe holds released.
        """
        targets = self._exec(conn, "jobs_replay_targets", {"ids": list(ids), "queue": queue,
                                                           "limit": limit}).fetchall()
        if not targets:
            return []
        keys = sorted({r[1] for r in targets if r[1] is not None})
        dedupe = [r[2] for r in targets if r[2] is not None]
        with atomic(conn):
            if keys:
                self.lock_ordering_keys(conn, keys)
            if dedupe:
                self.dedupe_holders(conn, dedupe)  # releases expired holds first
            cur = self._exec(conn, "jobs_replay", {"ids": [r[0] for r in targets], "actor": actor,
                                                   "channel": self.channel})
            replayed = [r[0] for r in cur.fetchall()]
            self._promote(conn, keys)
        return replayed

    def prune(self, conn: psycopg.Connection, *, succeeded_seconds: float | None,
              cancelled_seconds: float | None, dead_seconds: float | None, limit: int) -> dict[str, int]:
        """Delete one batch of finished jobs past their state's retention (seconds since
        they finished; None keeps that state), up to ``limit`` of each state; returns how
        many of each state went. Repeat while any state's count equals ``limit``."""
        rows = self._exec(conn, "jobs_prune", {"succeeded_seconds": succeeded_seconds,
                                               "cancelled_seconds": cancelled_seconds,
                                               "dead_seconds": dead_seconds, "limit": limit}).fetchall()
        counts = {"succeeded": 0, "cancelled": 0, "dead": 0}
        for (state,) in rows:
            counts[state] += 1
        return counts

    def prune_queue_events(self, conn: psycopg.Connection, *, older_than_seconds: float, limit: int) -> int:
        """Delete up to ``limit`` queue audit events older than ``older_than_seconds``."""
        return len(self._exec(conn, "queue_events_prune", {"older_than_seconds": older_than_seconds,
                                                           "limit": limit}).fetchall())

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

    def queue_stats(self, conn: psycopg.Connection, queues: Sequence[str]) -> QueueStats:
        """The statistics behind /metrics: one row per queue (``queue_stats``), then the
        jobs table's health (:meth:`table_health`) in the same transaction, so that both
        run under the caller's statement timeout and are cached together.

        Returns a :class:`QueueStats`. The table statement runs in a savepoint: when it
        fails (a timeout, a lock), the per-queue rows still come back, with ``table``
        None and ``table_error`` naming the exception class. Errors of the per-queue
        statement, and a broken connection, propagate (``psycopg.Error``).
        """
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        rows = cur.execute(self.queries["queue_stats"], {"queues": list(queues)}).fetchall()
        try:
            with conn.transaction():  # a savepoint: a failure here keeps the rows above
                table = self.table_health(conn)
        except psycopg.Error as exc:
            if conn.broken:
                raise
            return QueueStats(rows, table_error=type(exc).__name__)
        return QueueStats(rows, table=table)

    def table_health(self, conn: psycopg.Connection) -> dict[str, Any] | None:
        """The jobs table's tuples, vacuums, size and the oldest holder of its vacuum
        horizon: the ``table_health`` row (sql/queries/health.sql documents each column
        and which holders count), or None if the table is missing."""
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["table_health"], {"schema": self.schema}).fetchone()

    def queue_status(self, conn: psycopg.Connection) -> list[dict[str, Any]]:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queue_status"]).fetchall()

    def due_count(self, conn: psycopg.Connection, queues: Sequence[str]) -> int:
        return self._exec(conn, "jobs_due_count", {"queues": list(queues)}).fetchone()[0]

    def dead_blocked_keys(self, conn: psycopg.Connection, *, limit: int = 100) -> list[dict[str, Any]]:
        """Ordering keys held by a dead job, oldest first, with the jobs waiting behind each."""
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["ordering_keys_dead_blocked"], {"limit": limit}).fetchall()

    # -- queues ---------------------------------------------------------------------

    def configure_queue(self, conn: psycopg.Connection, queue: str, *, actor: str | None,
                        concurrency_limit: Any = None, rate: Any = None, burst: Any = None,
                        aging_seconds: Any = None, set_concurrency: bool = False,
                        set_rate: bool = False, set_aging: bool = False) -> dict[str, Any]:
        """Create or change a queue's settings (only those whose ``set_*`` flag is true)."""
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queue_configure"], {
            "queue": queue, "actor": actor, "concurrency_limit": concurrency_limit,
            "rate_per_second": rate, "rate_burst": burst, "aging_seconds": aging_seconds,
            "set_concurrency": set_concurrency, "set_rate": set_rate, "set_aging": set_aging}).fetchone()

    def pause_queue(self, conn: psycopg.Connection, queue: str, *, actor: str | None) -> dict[str, Any]:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queue_pause"], {"queue": queue, "actor": actor}).fetchone()

    def resume_queue(self, conn: psycopg.Connection, queue: str, *, actor: str | None) -> bool:
        """Resume; False when the queue was not paused (it has no row)."""
        rows = self._exec(conn, "queue_resume", {"queue": queue, "actor": actor,
                                                 "channel": self.channel}).fetchall()
        return bool(rows)

    def list_queues(self, conn: psycopg.Connection) -> list[dict[str, Any]]:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queues_list"]).fetchall()

    def queue_usage(self, conn: psycopg.Connection, queue: str) -> dict[str, bool]:
        """{'has_jobs': claimable, running or dead jobs, 'scheduled': a schedule enqueues
        into it, 'configured': it has a settings row}."""
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queue_usage"], {"queue": queue}).fetchone()

    def delete_queue(self, conn: psycopg.Connection, queue: str, *, actor: str | None) -> dict[str, Any] | None:
        """Delete the queue's settings row unless it is paused; returns the row as it was
        with ``deleted`` (False: it is paused), or None when the queue has no row."""
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queue_delete"], {"queue": queue, "actor": actor}).fetchone()

    def queue_events(self, conn: psycopg.Connection, queue: str, *, limit: int = 50) -> list[dict[str, Any]]:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["queue_events_list"], {"queue": queue, "limit": limit}).fetchall()

    # -- schedules ------------------------------------------------------------------

    def db_now(self, conn: psycopg.Connection) -> datetime:
        return self._exec(conn, "db_now").fetchone()[0]

    def register_schedule(self, conn: psycopg.Connection, **params: Any) -> None:
        """Upsert a declared schedule (name, task, queue, cron, timezone, missed,
        initial_slot, next_slot)."""
        self._exec(conn, "schedule_register", params)

    def schedules_state(self, conn: psycopg.Connection,
                        names: Sequence[str]) -> tuple[dict[str, Any], datetime, dict[str, str]]:
        """({name: last slot}, database now, {name: unusable last slot as text}) for the
        recorded schedules among ``names``. A last slot no datetime can hold ('infinity',
        a year past 9999) is in the third dict only."""
        rows = self._exec(conn, "schedules_state", {"names": list(names)}).fetchall()
        now = rows[0][3] if rows else self.db_now(conn)
        unusable = {r[0]: r[2] for r in rows if r[2] is not None}
        return {r[0]: r[1] for r in rows if r[0] not in unusable}, now, unusable

    def fire_schedule(self, conn: psycopg.Connection, *, name: str, slot: datetime, next_slot: datetime | None,
                      skipped: int, enqueue: bool, task: str, queue: str, payload_json: str,
                      priority: int, max_attempts: int) -> tuple[bool, int | None]:
        """Advance a schedule to ``slot`` (compare-and-set) and enqueue its job when
        ``enqueue``; returns (advanced, job id). (False, None): another dispatcher did it."""
        row = self._exec(conn, "schedule_fire", {
            "name": name, "slot": slot, "next_slot": next_slot, "skipped": skipped, "enqueue": enqueue,
            "task": task, "queue": queue, "payload": payload_json, "priority": priority,
            "max_attempts": max_attempts, "channel": self.channel}).fetchone()
        return bool(row[0]), row[1]

    def list_schedules(self, conn: psycopg.Connection) -> list[dict[str, Any]]:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cur.execute(self.queries["schedules_list"]).fetchall()


def _delay(seconds: Any) -> float:
    """A delay as the statements take it: seconds, NaN and negatives as 0, at most
    MAX_DELAY_SECONDS (the callers bound delays where they decide them; this keeps one
    bad value from failing a whole batched statement)."""
    value = float(seconds)
    return min(MAX_DELAY_SECONDS, value) if value > 0 else 0.0


def json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))
