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
    # a domain's rules (migration 0015), with whether each was validated
    "domain constraints": """
        SELECT t.typname, k.conname, pg_get_constraintdef(k.oid), k.convalidated
        FROM pg_constraint k JOIN pg_type t ON t.oid = k.contypid
        WHERE k.connamespace = %(ns)s::regnamespace
        ORDER BY 1, 2""",
    "indexes": """
        SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
        WHERE i.relnamespace = %(ns)s::regnamespace ORDER BY 1""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid), p.proacl::text
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
    def blank(v):  # the schema qualifying a name, and as a string (a function's SET search_path)
        if not isinstance(v, str):
            return v
        return v.replace(f'"{schema}".', "{schema}.").replace(f"{schema}.", "{schema}.").replace(f"'{schema}'", "'{schema}'")

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


def migrate_to(conn: psycopg.Connection, schema: str, version: int) -> None:
    """Apply migrations 1..version by hand, as `pgworker migrate` would have then."""
    ident = psycopg.sql.Identifier(schema)
    with conn.transaction():
        conn.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(ident))
        conn.execute(psycopg.sql.SQL("CREATE TABLE {}.migrations (version integer PRIMARY KEY, name text NOT NULL, "
                                     "checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
                     .format(ident))
        for mig in sqlfiles.migrations()[:version]:
            conn.execute(sqlfiles.render(mig.template, schema))
            conn.execute(psycopg.sql.SQL("INSERT INTO {}.migrations (version, name, checksum) VALUES (%s, %s, %s)")
                         .format(ident), [mig.version, mig.name, mig.checksum])


def test_migration_0005_keeps_rows_whose_timestamps_no_claim_could_handle(pg_dsn, schema):
    """Rows a version-4 schema could hold (SQL, a restore) with timestamps the claim cannot
    handle: the migration keeps every one, clamps each value to the nearest bound, notes the
    old values in the job's audit trail, and the queue works again."""
    from pgworker import App
    from pg import make_settings
    from worker import q

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate_to(conn, schema, 4)
        insert = ("INSERT INTO {s}.jobs (queue, task, payload, run_at, created_at) "
                  "VALUES ('poisoned', 't', %s, %s, %s) RETURNING id")
        ids = {name: q(conn, schema, insert, f'"{name}"', run_at, created)[0][0] for name, run_at, created in [
            ("minus infinity", "-infinity", "now"), ("infinity", "infinity", "now"),
            ("before christ", "0001-12-31 23:00:00+00 BC", "now"), ("created never", "now", "-infinity"),
            ("fine", "now", "now")]}
        [(running,)] = q(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload, state, attempts, lease_token, "
                                       "lease_expires_at) VALUES ('poisoned', 't', '1', 'running', 1, 1, "
                                       "'-infinity') RETURNING id")
        q(conn, schema, "INSERT INTO {s}.queues (name, rate_per_second, rate_burst, tokens, tokens_at) "
                        "VALUES ('poisoned', 1000, 1000, 1000, 'infinity') RETURNING 1")
        with pytest.raises(psycopg.errors.DatetimeFieldOverflow):  # what the claim met
            q(conn, schema, "SELECT extract(epoch FROM now() - run_at) FROM {s}.jobs")
        assert migrate(conn, schema).applied[0].startswith("0005_")
        rows = dict(q(conn, schema, "SELECT payload #>> '{{}}', to_char(run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') || "
                                    "' ' || to_char(created_at AT TIME ZONE 'UTC', 'YYYY') FROM {s}.jobs "
                                    "WHERE state = 'pending'"))
        this_year = q(conn, schema, "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY')")[0][0]
        today = q(conn, schema, "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD')")[0][0]
        assert rows == {"minus infinity": f"1970-01-01 {this_year}", "infinity": f"9999-01-01 {this_year}",
                        "before christ": f"1970-01-01 {this_year}", "created never": f"{today} 1970",
                        "fine": f"{today} {this_year}"}
        events = {r[0]: r[1] for r in q(conn, schema, "SELECT job_id, detail FROM {s}.job_events "
                                                      "WHERE kind = 'timestamps_clamped'")}
        assert set(events) == {ids["minus infinity"], ids["infinity"], ids["before christ"], ids["created never"],
                               running}
        assert events[ids["minus infinity"]] == {"run_at": "-infinity"}
        assert events[ids["created never"]] == {"created_at": "-infinity"}
        assert events[running] == {"lease_expires_at": "-infinity"}
        assert "BC" in events[ids["before christ"]]["run_at"]
        assert q(conn, schema, "SELECT kind, detail FROM {s}.queue_events") == [
            ("tokens_at_reset", {"tokens_at": "infinity"})]
    app = App(settings=make_settings(pg_dsn, schema))
    try:
        claimed = {j.id for j in app.claim("poisoned", limit=10)}
        assert claimed == {ids["minus infinity"], ids["before christ"], ids["created never"], ids["fine"]}
        assert app.reap().requeued == (running,)  # its lease expired in 1970
        assert app.get_job(ids["minus infinity"])["events"][0]["kind"] == "timestamps_clamped"
    finally:
        app.close()


def test_migration_0005_promotes_the_keys_the_fixed_defects_stranded(pg_dsn, schema):
    """A version-4 schema can hold keys stranded by the defects version 5 fixes (a batch
    enqueue's refused job, a pruned dead head): every job of the key blocked, none active.
    The migration promotes each such head and leaves every other key as it was."""
    from worker import q

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate_to(conn, schema, 4)

        def job(key, state="pending", blocked=True):
            lease = "now() + interval '1 minute'" if state == "running" else "NULL"
            return q(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload, ordering_key, state, blocked, "
                                   f"finished_at, lease_expires_at) VALUES ('default', 't', '1', %s, %s, %s, "
                                   f"CASE WHEN %s = 'dead' THEN now() END, {lease}) RETURNING id",
                     key, state, blocked, state)[0][0]

        stranded = [job("stranded"), job("stranded")]
        behind_running = [job("running", "running", False), job("running")]
        behind_dead = [job("dead", "dead", False), job("dead")]
        active = [job("active", blocked=False), job("active")]
        migrate(conn, schema)
        rows = dict(q(conn, schema, "SELECT id, blocked FROM {s}.jobs"))
        assert [rows[i] for i in stranded] == [False, True]
        assert [rows[i] for i in behind_running + behind_dead + active] == [False, True, False, True, False, True]
        assert q(conn, schema, "SELECT job_id, kind FROM {s}.job_events") == [(stranded[0], "promoted")]


def test_migration_0014_carries_the_console_filters_grants_to_its_new_signature(pg_dsn):
    """console_job_filter gains an argument (the graph), so migration 0014 replaces the
    function: the grants of the old one (`pgworker sql grants --viewer`, and PUBLIC's
    EXECUTE revoked, as default privileges may have it) hold on the new one. Without
    that, a viewer of a database that revokes PUBLIC's EXECUTE lost the jobs list. The
    schema and role names hold a quote and a dollar sign (the block quotes neither)."""
    schema = f"g'r$aph_{os.getpid()}_{next(_counter)}"
    role = f'Viewer"{os.getpid()}$'
    ident, rident = psycopg.sql.Identifier(schema), psycopg.sql.Identifier(role)
    old = psycopg.sql.SQL("{}.console_job_filter(jsonb, text, text, text, text, text, text, timestamptz, jsonb)"
                          ).format(ident)
    new_args = "jsonb, text, text, text, text, text, text, timestamptz, jsonb, bigint"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("DROP ROLE IF EXISTS {}").format(rident))
        conn.execute(psycopg.sql.SQL("CREATE ROLE {}").format(rident))
        try:
            migrate_to(conn, schema, 13)
            conn.execute(psycopg.sql.SQL("REVOKE EXECUTE ON FUNCTION {} FROM PUBLIC").format(old))
            conn.execute(psycopg.sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(old, rident))
            assert migrate(conn, schema).applied[0] == "0014_console_graph_filter"
            forms = conn.execute("SELECT pg_get_function_identity_arguments(p.oid) FROM pg_proc p "
                                 "WHERE p.pronamespace = %s::regnamespace AND p.proname = 'console_job_filter' "
                                 "ORDER BY p.pronargs", [ident.as_string(conn)]).fetchall()
            # the old form stays for a console of the version before, still running (a break-it trial)
            assert [f.endswith("payload jsonb") for (f,) in forms] == [True, False], forms
            assert forms[1][0].endswith("payload jsonb, graph_id bigint"), forms
            fn = f"{ident.as_string(conn)}.console_job_filter({new_args})"
            can = "SELECT has_function_privilege(%s, %s, 'EXECUTE')"
            assert conn.execute(can, [role, fn]).fetchone()[0] is True
            assert conn.execute(can, ["public", fn]).fetchone()[0] is False
            assert conn.execute(can, [role, old.as_string(conn)]).fetchone()[0] is True  # the old one's, kept
            # the old form still answers as it did
            row = conn.execute(psycopg.sql.SQL("SELECT {}('{{\"queue\": \"a\"}}'::jsonb, 'a', 'dead', 't', NULL, "
                                               "NULL, NULL, now(), '{{}}'::jsonb)").format(
                psycopg.sql.SQL(old.as_string(conn).split("(")[0]))).fetchone()
            assert row == (True,)
            # and search_path is as it was before the migration
            assert schema not in conn.execute("SHOW search_path").fetchone()[0]
        finally:
            drop_schema(conn, schema)
            conn.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(rident))
            conn.execute(psycopg.sql.SQL("DROP ROLE {}").format(rident))


# (column, a value its rule refuses, the rule's name in the error) for every rule of the
# jobs table that migration 0015 moved to a domain
DOMAIN_RULES = [
    ("attempts", "-1", "job_attempts_nonnegative"),
    ("max_attempts", "0", "job_max_attempts_positive"),
    ("progress", "1.5", "job_progress_range"),
    ("progress_message", "repeat('x', 201)", "job_progress_message_length"),
    ("task", "''", "job_task_length"),
    ("dedupe_window", "interval '0'", "job_dedupe_window_positive"),
    ("created_at", "'-infinity'", "job_time_range"),
    ("lease_expires_at", "'infinity'", "job_time_range"),
]


def test_migration_0015_keeps_the_rows_and_every_rule_without_rewriting_the_table(pg_dsn, schema):
    """Migration 0015 moves nine single-column rules of the jobs table from CHECK
    constraints (evaluated at every write of a row, whichever columns it writes) to the
    columns' domains (checked where a value is written): the rows a version-14 table held
    stay as they were, the table is not rewritten (its file is the same), no index is
    rebuilt, and each rule still refuses what it refused, by raw SQL too."""
    from worker import q

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate_to(conn, schema, 14)
        q(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload, state, attempts, max_attempts, lease_token, "
                        "lease_expires_at, progress, progress_message, dedupe_key, dedupe_window) "
                        "VALUES ('q', 'running task', '{{\"a\": 1}}', 'running', 2, 3, 7, now() + interval '1 hour', "
                        "0.25, 'a quarter', 'k', interval '1 minute') RETURNING 1")
        q(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload) SELECT 'q', 't', to_jsonb(g) "
                        "FROM generate_series(1, 1000) g RETURNING 1")
        files = "SELECT relname, relfilenode FROM pg_class WHERE relnamespace = %s::regnamespace ORDER BY 1"
        ident = psycopg.sql.Identifier(schema).as_string(conn)
        before_files = conn.execute(files, [ident]).fetchall()
        before_rows = q(conn, schema, "SELECT to_jsonb(j) FROM {s}.jobs AS j ORDER BY id")
        assert migrate(conn, schema).applied == ("0015_column_domains",)
        assert conn.execute(files, [ident]).fetchall() == before_files
        assert q(conn, schema, "SELECT to_jsonb(j) FROM {s}.jobs AS j ORDER BY id") == before_rows
        checks = {r[0] for r in q(conn, schema, "SELECT conname FROM pg_constraint "
                                                "WHERE conrelid = '{s}.jobs'::regclass AND contype = 'c'")}
        assert checks == {"jobs_waiting_parents_nonnegative", "jobs_queue_length", "jobs_running_has_lease",
                          "jobs_schedule_slot_pair", "jobs_run_at_range"}
        for column, bad, rule in DOMAIN_RULES:
            for statement in (f"UPDATE {{s}}.jobs SET {column} = {bad} WHERE id = 1 RETURNING 1",
                              f"INSERT INTO {{s}}.jobs (queue, task, payload, {column}) "
                              f"VALUES ('q', 't', '1', {bad}) RETURNING 1"):
                if column == "task":
                    statement = statement.replace("(queue, task, payload, task)", "(queue, payload, task)")
                    statement = statement.replace("VALUES ('q', 't', '1',", "VALUES ('q', '1',")
                with pytest.raises(psycopg.errors.CheckViolation, match=rule):
                    q(conn, schema, statement)
        # the reads keep their types: what psycopg decodes is the base type's value
        row = q(conn, schema, "SELECT attempts, progress, task, created_at, lease_expires_at, dedupe_window "
                              "FROM {s}.jobs WHERE id = 1")[0]
        assert (row[0], row[1], row[2]) == (2, 0.25, "running task")
        assert row[3].tzinfo is not None and row[4] > row[3] and row[5].total_seconds() == 60
