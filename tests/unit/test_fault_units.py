"""Unit tests (no database) for the fault-tolerance pieces: the outage log, failure
descriptions, the kill-safe wake-up, the safe JSON loader and the grant statements."""

from __future__ import annotations

import logging
import multiprocessing

import psycopg
import pytest

from pgworker import db
from pgworker.errors import ConfigError, DatabaseReadOnly, DatabaseUnavailable, InvalidName
from pgworker.grants import grant_statements, render
from pgworker.jobs import UndecodablePayload, safe_json_loads
from pgworker.worker.shm.wakeups import WakeUp

pytestmark = pytest.mark.unit


def test_outage_log_says_it_once_and_says_when_it_is_over(caplog):
    log = logging.getLogger("test.outage")
    outage = db.OutageLog(log, "claimer 0", "postgresql://u:hunter2@h/db")
    with caplog.at_level(logging.DEBUG, logger="test.outage"):
        for _ in range(20):
            outage.failed(DatabaseUnavailable("cannot connect to PostgreSQL at 'postgresql://u:********@h/db'"))
        assert outage.down
        outage.failed(psycopg.errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction"))
        outage.ok()
        outage.ok()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2  # the outage, then its change of kind (read-only)
    assert "read-only" in errors[1].getMessage() and "PGWORKER_DSN" in errors[1].getMessage()
    back = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(back) == 1 and "back after" in back[0].getMessage() and "21 failed" in back[0].getMessage()
    assert "hunter2" not in caplog.text and not outage.down


def test_failures_are_described_with_the_fix():
    class Prepared(psycopg.errors.InvalidSqlStatementName):
        pass

    assert db.failure_kind(DatabaseReadOnly()) == "read-only"
    assert "PGWORKER_PREPARED_STATEMENTS=false" in db.describe_failure(Prepared("prepared statement \"_pg3_0\" does not exist"))
    assert db.failure_kind(psycopg.OperationalError("x")) == "unreachable"
    text = db.describe_failure(psycopg.OperationalError("connection to postgresql://u:hunter2@h failed\nmore"),
                               "postgresql://u:hunter2@h/db")
    assert "hunter2" not in text and "unreachable" in text and "\n" not in text


def test_wake_up_never_blocks_the_setter_and_holds_one_pending_wake_up():
    w = WakeUp(multiprocessing.get_context("spawn"))
    assert not w.wait(0.01)
    for _ in range(5):
        w.set()  # never blocks, never raises
    assert w.wait(0.01) and not w.wait(0.01)  # one wake-up, however many sets
    w.set()
    assert w.wait(0.01) and not w.wait(0.01)  # a wait consumes it


def test_safe_json_loads_turns_what_python_cannot_decode_into_a_marker():
    assert safe_json_loads('{"a": [1]}') == {"a": [1]}
    deep = safe_json_loads("[" * 5000 + "]" * 5000)
    assert isinstance(deep, UndecodablePayload) and "nested" in repr(deep)
    assert isinstance(safe_json_loads(b"{bad"), UndecodablePayload)


def test_grants_quote_every_name_and_refuse_nonsense():
    text = render(grant_statements('we"ird; DROP', producer='p"; DROP ROLE x; --', worker="w"))
    assert '"we""ird; DROP".jobs' in text and '"p""; DROP ROLE x; --"' in text
    assert text.count(";\n") + 1 == len(grant_statements("s", producer="p", worker="w"))
    assert "UPDATE (state" in render(grant_statements("s", worker="w"))
    producer = render(grant_statements("s", producer="p"))
    # a producer's only UPDATEs: releasing a dedupe hold whose window after success has
    # passed, and marking a parent of a job it enqueues with depends_on (issue 21)
    assert [line for line in producer.splitlines() if "UPDATE" in line] == [
        'GRANT UPDATE (dedupe_until) ON "s".jobs TO "p";', 'GRANT UPDATE (has_children) ON "s".jobs TO "p";']
    with pytest.raises(ConfigError, match="--producer"):
        grant_statements("s")
    with pytest.raises(InvalidName):
        grant_statements("x" * 64, producer="p")


def _hold_lock_forever(table, taken):
    table.lock.acquire()
    taken.set()
    import time

    time.sleep(600)


def test_a_slot_table_whose_claimer_died_holding_the_lock_is_usable_at_once():
    import os
    import signal

    from pgworker.worker.shm.slots import SlotTable

    ctx = multiprocessing.get_context("fork")
    table = SlotTable(4, ctx)
    taken = ctx.Event()
    child = ctx.Process(target=_hold_lock_forever, args=(table, taken))
    child.start()
    assert taken.wait(30)
    os.kill(child.pid, signal.SIGKILL)  # dies holding the lock
    child.join()
    assert table.held() == [] and table.live() == []  # the kernel released its lock as it died
