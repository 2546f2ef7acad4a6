"""The store's base: the rendered statements of one schema, how they run, the schema
version check, and transactions that never touch the caller's. (The ordering-key locks
and promotions of keyed transitions are :mod:`pgworker.store.keyed`'s.)"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

import psycopg
from psycopg import sql

from .. import sql as sqlfiles
from ..errors import SchemaNotMigrated, SchemaTooNew
from ..jobs import MAX_DELAY_SECONDS
from ..names import check_schema_name
from .plan import Exec


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
        version = self.schema_version(conn)
        problem = self.version_problem(version)
        if problem is not None:
            raise problem
        return version  # type: ignore[return-value]  # None is a problem

    def version_problem(self, version: int | None) -> SchemaNotMigrated | SchemaTooNew | None:
        """What is wrong with the applied schema version ``version`` (None: absent) for
        this code, as the error to raise; None when it is exactly the known version."""
        known = len(sqlfiles.migrations())
        if version is None or version < known:
            at = "absent" if version is None else f"at version {version}"
            behind = SchemaNotMigrated(
                f"the pgworker schema {self.schema!r} is {at}; this pgworker needs version {known}: "
                f"run `pgworker migrate` (or App.migrate()) with the same DSN and schema")
            behind.absent = version is None
            return behind
        if version > known:
            return SchemaTooNew(
                f"the pgworker schema {self.schema!r} is at version {version}, newer than this "
                f"pgworker knows ({known}): upgrade pgworker before running it against this database")
        return None

    def _step(self, name: str, params: dict[str, Any] | None = None, prepare: bool | None = None) -> Exec:
        """The named statement as a plan's step (see :mod:`pgworker.store.plan`)."""
        return Exec(self.queries[name], params, prepare)


def _delay(seconds: Any) -> float:
    """A delay as the statements take it: seconds, NaN and negatives as 0, at most
    MAX_DELAY_SECONDS (the callers bound delays where they decide them; this keeps one
    bad value from failing a whole batched statement)."""
    value = float(seconds)
    return min(MAX_DELAY_SECONDS, value) if value > 0 else 0.0


