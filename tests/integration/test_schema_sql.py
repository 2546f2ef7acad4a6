"""schema.sql is the migrations' result: both produce exactly the same catalog."""

from __future__ import annotations

import itertools
import os

import psycopg
import pytest

from pgworker import sql as sqlfiles
from pgworker.migrate import drop_schema, migrate

pytestmark = pytest.mark.integration
_counter = itertools.count()

# Everything a schema holds that pgworker relies on, with the schema name blanked out of
# definitions so two schemas compare equal. Column order (attnum) counts: a column added
# by a migration comes last, and schema.sql must say so too.
CATALOG = {
    "tables": """
        SELECT c.relname, c.relkind::text, c.relpersistence::text FROM pg_class c
        WHERE c.relnamespace = %(ns)s::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
        ORDER BY 1""",
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity::text, a.attgenerated::text,
               a.attcollation
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = %(ns)s::regnamespace AND c.relkind = 'r' AND a.attnum > 0
          AND NOT a.attisdropped
        ORDER BY 1, 2""",
    "constraints": """
        SELECT c.relname, k.conname, k.contype::text, pg_get_constraintdef(k.oid), k.condeferrable
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        WHERE k.connamespace = %(ns)s::regnamespace
        ORDER BY 1, 2""",
    "indexes": """
        SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
        WHERE i.relnamespace = %(ns)s::regnamespace ORDER BY 1""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
        FROM pg_proc p WHERE p.pronamespace = %(ns)s::regnamespace ORDER BY 1, 2""",
    "types": """
        SELECT t.typname, t.typtype::text,
               (SELECT array_agg(e.enumlabel ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid)
        FROM pg_type t WHERE t.typnamespace = %(ns)s::regnamespace AND t.typtype IN ('e', 'd', 'c')
          AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.reltype = t.oid)
        ORDER BY 1""",
    "sequences": """
        SELECT c.relname, s.seqtypid::regtype::text, s.seqstart, s.seqincrement, s.seqmin, s.seqmax,
               s.seqcache, s.seqcycle
        FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
        WHERE c.relnamespace = %(ns)s::regnamespace ORDER BY 1""",
    # Storage parameters (autovacuum settings, fillfactor) of tables and indexes, sorted:
    # CREATE TABLE ... WITH and ALTER TABLE ... SET may list them in any order.
    "reloptions": """
        SELECT c.relname, c.relkind::text, array(SELECT o FROM unnest(c.reloptions) AS o ORDER BY o)
        FROM pg_class c
        WHERE c.relnamespace = %(ns)s::regnamespace AND c.reloptions IS NOT NULL
        ORDER BY 1""",
    "triggers": """
        SELECT t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = %(ns)s::regnamespace AND NOT t.tgisinternal ORDER BY 1""",
}


def catalog(conn: psycopg.Connection, schema: str) -> dict[str, list[tuple]]:
    def blank(v):
        return v.replace(f'"{schema}".', "{schema}.").replace(f"{schema}.", "{schema}.") if isinstance(v, str) else v

    ident = psycopg.sql.Identifier(schema).as_string(conn)
    return {kind: [tuple(blank(v) for v in row) for row in conn.execute(q, {"ns": ident}).fetchall()]
            for kind, q in CATALOG.items()}


@pytest.fixture
def two_schemas(pg_dsn):
    names = [f"cat_{os.getpid()}_{next(_counter)}_{x}" for x in ("migrated", "flat")]
    yield names
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for n in names:
            drop_schema(conn, n)


def test_schema_sql_equals_the_migrations(pg_dsn, two_schemas):
    migrated, flat = two_schemas
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate(conn, migrated)
        with conn.transaction():
            conn.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(psycopg.sql.Identifier(flat)))
            conn.execute(sqlfiles.render(sqlfiles.schema_template(), flat))
        a, b = catalog(conn, migrated), catalog(conn, flat)
    assert a["tables"] and a["indexes"] and a["functions"]  # the comparison compares something
    for kind in CATALOG:
        assert a[kind] == b[kind], f"{kind} differ between the migrations and schema.sql"
