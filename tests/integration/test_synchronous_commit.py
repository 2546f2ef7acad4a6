"""The opt-in synchronous_commit setting reaches the claimer's session, and only it."""

from __future__ import annotations

from pgworker import App, Settings
from pgworker.worker.claimer import Claimer
from pgworker.worker.shm.slots import SlotTable


def _claimer(pg_dsn, schema, **overrides):
    app = App(settings=Settings.from_env(environ={}, dsn=pg_dsn, schema=schema, metrics_port=0, tracing=False,
                                         **overrides))
    return app, Claimer(app, app.settings, 0, SlotTable(4), ["default"], drain=True)


def test_claimer_session_uses_the_opt_in_synchronous_commit(pg_dsn, schema, app):
    _, claimer = _claimer(pg_dsn, schema, synchronous_commit="off")
    assert claimer.ensure_connection()
    try:
        assert claimer.conn.execute("SHOW synchronous_commit").fetchone()[0] == "off"
    finally:
        claimer.conn.close()


def test_without_the_setting_the_server_default_stays(pg_dsn, schema, app, conn):
    server = conn.execute("SHOW synchronous_commit").fetchone()[0]
    _, claimer = _claimer(pg_dsn, schema)
    assert claimer.ensure_connection()
    try:
        assert claimer.conn.execute("SHOW synchronous_commit").fetchone()[0] == server
    finally:
        claimer.conn.close()
