"""Apply pending schema migrations under an advisory lock.

All pending migrations run in one transaction holding a transaction-level advisory lock
(``pg_advisory_xact_lock``, PostgreSQL docs 9.27.10 "Advisory Lock Functions"), so
concurrent ``pgworker migrate`` runs (several pods starting at once) apply each
migration once, a failure leaves the schema as it was, and the lock works through a
transaction-mode pooler. The applied versions are recorded in ``<schema>.migrations``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
from psycopg import sql

from . import sql as sqlfiles
from .errors import SchemaTooNew
from .names import check_schema_name

log = logging.getLogger("pgworker.migrate")

_BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""


@dataclass(frozen=True)
class MigrationReport:
    """What a migrate run found and did."""

    schema: str
    version_before: int
    version_after: int
    applied: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.applied)


def latest_version() -> int:
    """The schema version this pgworker ships (the number of migrations)."""
    return len(sqlfiles.migrations())


def migrate(conn: psycopg.Connection, schema: str) -> MigrationReport:
    """Apply the pending migrations to ``schema`` (created if missing); idempotent.

    Takes an open connection as a role that may create the schema and its objects.
    Returns a :class:`MigrationReport`. Raises :class:`SchemaTooNew` when the database
    records a version this pgworker does not know (never downgrades), and psycopg errors
    when a statement fails (nothing is applied then).
    """
    check_schema_name(schema)
    known = sqlfiles.migrations()
    ident = sql.Identifier(schema)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('pgworker:migrate'), hashtext(%s))", [schema])
        conn.execute(sql.SQL(_BOOTSTRAP).format(schema=ident))
        rows = conn.execute(sql.SQL("SELECT version, checksum FROM {}.migrations ORDER BY version")
                            .format(ident)).fetchall()
        applied = {v: c for v, c in rows}
        before = max(applied, default=0)
        if before > len(known):
            raise SchemaTooNew(
                f"schema {schema!r} is at version {before}, newer than this pgworker knows "
                f"({len(known)}): upgrade pgworker; it will not downgrade a schema")
        done = []
        for mig in known:
            if mig.version in applied:
                if applied[mig.version] != mig.checksum:
                    log.warning("migration %04d_%s differs from the one applied to schema %r",
                                mig.version, mig.name, schema)
                continue
            log.info("applying migration %04d_%s to schema %r", mig.version, mig.name, schema)
            conn.execute(sqlfiles.render(mig.template, schema))
            conn.execute(sql.SQL("INSERT INTO {}.migrations (version, name, checksum) VALUES (%s, %s, %s)")
                         .format(ident), [mig.version, mig.name, mig.checksum])
            done.append(f"{mig.version:04d}_{mig.name}")
    return MigrationReport(schema, before, max(before, len(known)), tuple(done))


def drop_schema(conn: psycopg.Connection, schema: str) -> None:
    """Drop the whole pgworker schema and everything in it (tests and teardown)."""
    check_schema_name(schema)
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
