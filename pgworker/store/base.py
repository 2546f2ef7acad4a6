"""The store's base: the rendered statements of one schema, how they run, the schema
version check, the ordering-key locks every keyed transition takes, and transactions
that never touch the caller's."""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, Iterable, Sequence

import psycopg
from psycopg import sql

from .. import sql as sqlfiles
from ..errors import SchemaNotMigrated, SchemaTooNew
from ..jobs import MAX_DELAY_SECONDS, Lease
from ..names import check_schema_name
from .plan import Exec, Plan, run


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


def results_channel(schema: str) -> str:
    """The NOTIFY channel that says jobs of a schema finished with a result to read
    (``App.wait_result``): ``pgworker_results.<schema>``, hashed past 63 bytes. Apart
    from :func:`notify_channel`, whose payloads the workers read as queue names."""
    name = f"pgworker_results.{schema}"
    if len(name.encode()) > 63:
        name = "pgworker_results." + hashlib.sha1(schema.encode()).hexdigest()[:20]
    return name


class StoreBase:
    """Named statements of one schema, rendered once (schema quoted as an identifier)."""

    def __init__(self, schema: str, *, error_history_entries: int = 10) -> None:
        self.schema = check_schema_name(schema)
        self.channel = notify_channel(schema)
        self.results_channel = results_channel(schema)
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

    # -- ordering keys --------------------------------------------------------------
    #
    # Lock order: every transition that may change which job of an ordering key runs
    # next takes the keys' advisory locks (hash order) BEFORE it locks any job row, then
    # changes the rows, then promotes the next job of each key in a new statement. Claims
    # take no key lock (only the head of a key is claimable) and never wait (SKIP LOCKED).

    def _step(self, name: str, params: dict[str, Any] | None = None, prepare: bool | None = None) -> Exec:
        """The named statement as a plan's step (see :mod:`pgworker.store.plan`)."""
        return Exec(self.queries[name], params, prepare)

    def lock_ordering_keys(self, conn: psycopg.Connection, keys: Sequence[str]) -> None:
        run(conn, self.lock_ordering_keys_plan(keys))

    def lock_ordering_keys_plan(self, keys: Sequence[str]) -> Plan[None]:
        yield self._step("ordering_keys_lock", {"namespace": self._ordering_namespace, "keys": list(keys)})

    def _promote(self, conn: psycopg.Connection, keys: Iterable[str]) -> list[int]:
        """Unblock the head of each key (the caller holds the keys' locks)."""
        return run(conn, self._promote_plan(keys))

    def _promote_plan(self, keys: Iterable[str]) -> Plan[list[int]]:
        keys = sorted(set(keys))
        if not keys:
            return []
        rows = yield self._step("ordering_keys_promote", {"keys": keys, "channel": self.channel})
        return [r[0] for r in rows]

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
        return run(conn, self.ordering_keys_of_plan(ids))

    def ordering_keys_of_plan(self, ids: Sequence[int]) -> Plan[dict[int, str]]:
        if not ids:
            return {}
        rows = yield self._step("jobs_ordering_keys", {"ids": list(ids)})
        return {r[0]: r[1] for r in rows}

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


def _delay(seconds: Any) -> float:
    """A delay as the statements take it: seconds, NaN and negatives as 0, at most
    MAX_DELAY_SECONDS (the callers bound delays where they decide them; this keeps one
    bad value from failing a whole batched statement)."""
    value = float(seconds)
    return min(MAX_DELAY_SECONDS, value) if value > 0 else 0.0


