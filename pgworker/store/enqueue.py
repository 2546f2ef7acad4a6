"""Enqueueing: single and bulk inserts, their wake-ups, deduplication (sql/queries/enqueue.sql).

Each operation is a plan (:mod:`pgworker.store.plan`), run by the sync methods here on a
``psycopg.Connection`` and by :mod:`pgworker.aio` on an ``AsyncConnection``."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Sequence

import psycopg
from psycopg import sql

from ..errors import InvalidJob
from . import batch
from .keyed import KeyedScope, KeyedTransitions, no_heads
from .plan import Atomic, Copy, Plan, run


class EnqueueStatements(KeyedTransitions):
    """Enqueue: inserts, bulk inserts, dedupe holders, wake-ups."""

    def insert_job(self, conn: psycopg.Connection, *, queue: str, task: str, payload_json: str,
                   priority: int, run_at: datetime | None, delay_seconds: float, max_attempts: int,
                   dedupe_key: str | None, ordering_key: str | None,
                   trace_context: str | None, dedupe_window_seconds: float | None = None,
                   dead_blocks_key: bool = True) -> int | None:
        """Insert one job (and its wake-up); returns its id, or None on a dedupe conflict."""
        return run(conn, self.insert_job_plan(
            queue=queue, task=task, payload_json=payload_json, priority=priority, run_at=run_at,
            delay_seconds=delay_seconds, max_attempts=max_attempts, dedupe_key=dedupe_key,
            ordering_key=ordering_key, trace_context=trace_context,
            dedupe_window_seconds=dedupe_window_seconds, dead_blocks_key=dead_blocks_key))

    def insert_job_plan(self, *, queue: str, task: str, payload_json: str, priority: int,
                        run_at: datetime | None, delay_seconds: float, max_attempts: int,
                        dedupe_key: str | None, ordering_key: str | None, trace_context: str | None,
                        dedupe_window_seconds: float | None = None,
                        dead_blocks_key: bool = True) -> Plan[int | None]:
        """:meth:`insert_job` as a plan."""
        if dedupe_key is None and ordering_key is None:
            rows = yield self._step("job_insert_plain", {
                "queue": queue, "task": task, "payload": payload_json, "priority": priority, "run_at": run_at,
                "delay": delay_seconds, "max_attempts": max_attempts, "trace_context": trace_context,
                "channel": self.channel})
            return rows[0][0]  # type: ignore[no-any-return]
        params = {
            "queue": queue, "task": task, "payload": payload_json, "priority": priority,
            "run_at": run_at, "delay": delay_seconds, "max_attempts": max_attempts,
            "dedupe_key": dedupe_key, "dedupe_window": dedupe_window_seconds,
            "ordering_key": ordering_key, "dead_blocks_key": dead_blocks_key,
            "trace_context": trace_context, "channel": self.channel, "notify_payload": queue,
        }
        # a keyed transition that promotes nothing: the insert decides its own job's
        # blocked flag with the head probe, and no other job of the key moves
        insert = self.keyed_plan([ordering_key], lambda scope: scope.rows("job_insert", params), no_heads)
        rows = (yield Atomic(insert)) if ordering_key is not None else (yield from insert)
        return rows[0][0] if rows else None

    def allocate_ids(self, conn: psycopg.Connection, count: int, queues: Iterable[str]) -> tuple[list[int], datetime]:
        """Reserve ``count`` job ids from the jobs sequence for jobs of ``queues``; also
        returns the database clock their run_at is counted from (``claim_stamp``, taken
        under the queues' bucket locks, which the transaction holds until it ends:
        migration 0013). Run it in the transaction that inserts the jobs."""
        return run(conn, self.allocate_ids_plan(count, queues))

    def allocate_ids_plan(self, count: int, queues: Iterable[str]) -> Plan[tuple[list[int], datetime]]:
        rows = yield self._step("job_ids_allocate", {"sequence": self._sequence, "count": count,
                                                     "queues": sorted(set(queues))})
        return list(map(int, rows[0][0].split(","))), rows[0][1]

    def claim_backdate(self, conn: psycopg.Connection, queues: Iterable[str]) -> None:
        """Bump the claim epoch of ``queues``: every claimer of them drops its floors at
        its next granted horizon (:mod:`pgworker.claim_floors`). For a claim that failed
        (its locks made other claims skip its jobs) and jobs made claimable behind the
        floors; in the caller's transaction (none: at once)."""
        run(conn, self.claim_backdate_plan(queues))

    def claim_backdate_plan(self, queues: Iterable[str]) -> Plan[None]:
        """Bump the claim epoch of ``queues`` (their jobs became claimable with a run_at
        before the transaction's ``claim_stamp``: one given in the past); nothing for none."""
        names = sorted(set(queues))
        if names:
            yield self._step("claim_backdate_queues", {"queues": names})

    def insert_jobs_batch(self, conn: psycopg.Connection, jobs: Sequence[Sequence[Any]],
                          trace_context: str | None = None) -> tuple[list[int], dict[str, int]]:
        """Insert jobs without dedupe or ordering keys in one statement (and one NOTIFY per
        queue with a job due now). ``jobs``: rows in :class:`pgworker.jobspec.PreparedJob`'s
        order (queue, task, payload as JSON text, priority, run_at or None, delay in
        seconds, max_attempts, ...); ``trace_context``: JSON text stored with every job.
        Returns (the new ids in input order, {queue: jobs inserted}). Raises
        :class:`InvalidJob` (nothing sent) when a payload holds a raw U+001E, which no JSON
        text does."""
        return run(conn, self.insert_jobs_batch_plan(jobs, trace_context))

    def insert_jobs_batch_plan(self, jobs: Sequence[Sequence[Any]], trace_context: str | None = None
                               ) -> Plan[tuple[list[int], dict[str, int]]]:
        """:meth:`insert_jobs_batch` as a plan."""
        params, counts = batch.statement_params(jobs)
        out = yield self._step("jobs_insert_batch", {**params, "trace_context": trace_context,
                                                     "sequence": self._sequence, "channel": self.channel})
        ids = list(map(int, out[0][0].split(",")))
        if len(ids) != len(jobs):  # pragma: no cover - batch_params refuses what could cause it
            raise InvalidJob(f"a batch of {len(jobs)} jobs inserted {len(ids)}; report this as a bug")
        return ids, counts

    def insert_jobs_many(self, conn: psycopg.Connection,
                         rows: dict[str, list[Any]]) -> tuple[dict[int, bool], dict[int, int]]:
        """Bulk insert with dedupe/ordering keys (ids reserved by :meth:`allocate_ids`),
        ending as the same jobs enqueued one at a time in order would.

        ``rows`` holds one list per column of ``jobs_insert_many``. Returns ({inserted id:
        due now}, {position in ``rows``: id of the job holding its dedupe key}); every
        position is in one of the two. Raises :class:`InvalidJob` if a dedupe key keeps
        changing hands (10 times in a row).

        A keyed transition (:mod:`pgworker.store.keyed`) of one transaction: lock the
        keys, insert, then promote the keys whose blocked flags the insert got wrong. jobs_insert_many blocks the later jobs of
        a key behind the batch's first one, before ON CONFLICT decides which rows go in;
        when a job of a key is refused by its dedupe key, the jobs behind it were blocked
        for a job that does not exist, and nothing else would ever promote them (issue 18
        item 2). The promotion runs last, once no refused job can still go in, in a new
        statement under the keys' locks (so it sees this transaction's inserts); it unblocks
        each such key's head when nothing of the key is active, which is what the enqueue
        of those jobs one by one would have left.
        """
        return run(conn, self.insert_jobs_many_plan(rows))

    def insert_jobs_many_plan(self, rows: dict[str, list[Any]]) -> Plan[tuple[dict[int, bool], dict[int, int]]]:
        inserted, holders, _ = yield Atomic(self.keyed_plan(
            rows["ordering_keys"], lambda scope: self._insert_jobs_many_plan(scope, rows), lambda out: out[2]))
        return inserted, holders

    def _insert_jobs_many_plan(self, scope: KeyedScope, rows: dict[str, list[Any]]
                               ) -> Plan[tuple[dict[int, bool], dict[int, int], set[str]]]:
        """The body of insert_jobs_many's keyed transition: (inserted, holders, the keys
        whose head may be wrong: those of the refused jobs)."""
        ids, dedupe_keys, ordering_keys = rows["ids"], rows["dedupe_keys"], rows["ordering_keys"]
        inserted = yield from self._insert_many_plan(scope, rows)
        todo = [pos for pos, i in enumerate(ids) if i not in inserted]
        stranded = {k for pos in todo if (k := ordering_keys[pos]) is not None}
        holders: dict[int, int] = {}
        for _ in range(10):
            if not todo:
                break
            found = yield from self.dedupe_holders_plan([dedupe_keys[pos] for pos in todo])
            for pos in todo:
                if (holder := found.get(dedupe_keys[pos])) is not None:
                    holders[pos] = holder
            # A key with no holder now was held by a job that finished since, or by an
            # expired hold (released by dedupe_holders): insert those jobs again with
            # the ids reserved for them, so that each keeps its place in its key
            # (behind the earlier jobs, before the later ones of the batch).
            again = [pos for pos in todo if pos not in holders]
            if again:
                inserted.update((yield from self._insert_many_plan(
                    scope, {c: [v[pos] for pos in again] for c, v in rows.items()})))
            todo = [pos for pos in again if ids[pos] not in inserted]
        if todo:  # pragma: no cover - needs a key changing hands 10 times in a row
            raise InvalidJob(f"dedupe key {dedupe_keys[todo[0]]!r} kept changing hands; try again")
        return inserted, holders, stranded  # the path then promotes the stranded keys

    def _insert_many_plan(self, scope: KeyedScope, rows: dict[str, list[Any]]) -> Plan[dict[int, bool]]:
        out = yield scope.step("jobs_insert_many", rows)
        return {r[0]: r[1] for r in out}

    def copy_jobs(self, conn: psycopg.Connection, ids: Sequence[int], jobs: Sequence[Sequence[Any]],
                  db_now: datetime, trace_context: str | None = None) -> tuple[dict[str, int], set[str]]:
        """COPY jobs without dedupe or ordering keys (``ids`` reserved by :meth:`allocate_ids`,
        ``db_now`` the database clock it read, for run_at; ``jobs`` rows as
        :meth:`insert_jobs_batch` takes them). Returns ({queue: jobs}, the queues with a
        job due now). No NOTIFY: the caller sends them (:meth:`notify_queues`).

        Text format, written by :func:`pgworker.store.batch.copy_text` as one string:
        payload and trace context go in as the JSON text they are (the server parses
        jsonb from text), and no row is formatted on its own.
        """
        return run(conn, self.copy_jobs_plan(ids, jobs, db_now, trace_context))

    def copy_jobs_plan(self, ids: Sequence[int], jobs: Sequence[Sequence[Any]], db_now: datetime,
                       trace_context: str | None = None) -> Plan[tuple[dict[str, int], set[str]]]:
        data, counts, due = batch.copy_text(ids, jobs, db_now, trace_context)
        stmt = sql.SQL("COPY {} ({}) FROM STDIN").format(
            self._jobs_table, sql.SQL(", ").join(map(sql.Identifier, batch.COPY_COLUMNS)))
        yield Copy(stmt, data)
        return counts, due

    def dedupe_holders(self, conn: psycopg.Connection, keys: Sequence[str]) -> dict[str, int]:
        """{dedupe key: id of the job holding it}, after releasing expired holds; a key
        missing from the result is free (insert again)."""
        return run(conn, self.dedupe_holders_plan(keys))

    def dedupe_holders_plan(self, keys: Sequence[str]) -> Plan[dict[str, int]]:
        rows = yield self._step("dedupe_holders", {"keys": sorted(set(keys))})
        return {r[0]: r[1] for r in rows}

    def notify_queues(self, conn: psycopg.Connection, queues: Iterable[str]) -> None:
        """One NOTIFY per queue (delivered when the transaction commits)."""
        run(conn, self.notify_queues_plan(queues))

    def notify_queues_plan(self, queues: Iterable[str]) -> Plan[None]:
        payloads = sorted(set(queues))
        if payloads:
            yield self._step("queues_notify", {"channel": self.channel, "payloads": payloads})

