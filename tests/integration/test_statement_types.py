"""Every named statement returns only types the client can read.

A column whose type is pgworker's own (an enum, a domain: migration 0015 gave nine jobs
columns domains) reaches psycopg under that type's oid. A plain domain column is
described by its base type and reads as before, but an array of one (``array_agg`` of
``task``) or a bare enum does not: psycopg hands back the value's text, and
``list('{add}')`` became the "did you mean" names of `pgworker jobs list`. So each
statement of ``queries/*.sql`` is prepared on a migrated schema and described (the
protocol's Describe: no parameters needed, nothing runs) and every result column's type
must be one psycopg has a loader for.
"""

from __future__ import annotations

import re

import psycopg
import pytest

from pgworker.store import Store

pytestmark = pytest.mark.integration


def test_every_statement_returns_types_psycopg_reads(app, conn: psycopg.Connection):
    queries = Store(app.settings.schema).queries
    unreadable, unprepared = [], []
    for name, text in sorted(queries.items()):
        order: list[str] = []

        def number(m: re.Match[str]) -> str:
            if m[1] not in order:
                order.append(m[1])
            return f"${order.index(m[1]) + 1}"
        prepared = conn.pgconn.prepare(b"described", re.sub(r"%\((\w+)\)s", number, text).replace("%%", "%").encode())
        if prepared.status != psycopg.pq.ExecStatus.COMMAND_OK:
            unprepared.append((name, (prepared.error_message or b"").decode()))
            continue
        described = conn.pgconn.describe_prepared(b"described")
        for i in range(described.nfields):
            if conn.adapters.types.get(described.ftype(i)) is None:
                unreadable.append((name, (described.fname(i) or b"").decode(), described.ftype(i)))
        conn.execute("DEALLOCATE described")
    assert len(queries) > 100  # the comparison compares something
    assert not unprepared, unprepared
    assert not unreadable, f"cast these columns to a built-in type (::text, ...): {unreadable}"
