"""The slot table survives kill -9 of the process on the other side."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest

from pgworker.worker import slots as lease

pytestmark = pytest.mark.unit
CTX = multiprocessing.get_context("spawn")


def _wait_forever(table):
    table.header.idle = 1
    table.wake.wait(600)


def _hold_lock_forever(table):
    table.lock.acquire()
    table.header.idle = 1
    time.sleep(600)


def _wait_then_exit(table):
    table.header.idle = 1
    raise SystemExit(0 if table.wake.wait(30) else 3)


def _spawn_and_kill(target, table):
    p = CTX.Process(target=target, args=(table,))
    p.start()
    deadline = time.monotonic() + 30
    while not table.header.idle and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(p.pid, signal.SIGKILL)
    p.join()


def _returns_within(fn, seconds):
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive()


def test_waking_a_claimer_killed_while_waiting_never_hangs():
    table = lease.SlotTable(4, CTX)
    _spawn_and_kill(_wait_forever, table)
    assert _returns_within(table.wake.set, 3)
    assert _returns_within(lambda: [table.wake.set() for _ in range(100_000)], 10)  # one pending wake-up is enough


def test_a_lock_held_by_a_dead_claimer_is_not_a_deadlock():
    table = lease.SlotTable(4, CTX)
    _spawn_and_kill(_hold_lock_forever, table)
    outcome = []

    def read():
        try:
            table.held()
        except lease.SlotTableBusy:
            outcome.append("busy")

    assert _returns_within(read, 5) and outcome == ["busy"]  # a bounded wait, then a clear answer
    table.replace_lock(CTX)  # what the dispatcher does for the replacement claimer
    assert table.held() == [] and table.reset() is not None


def test_a_replacement_claimer_gets_a_working_wake_up():
    table = lease.SlotTable(4, CTX)
    _spawn_and_kill(_wait_forever, table)
    table.reset()
    table.header.idle = 0
    p = CTX.Process(target=_wait_then_exit, args=(table,))
    p.start()
    deadline = time.monotonic() + 30
    while not table.header.idle and time.monotonic() < deadline:
        time.sleep(0.01)
    table.wake.set()
    p.join(30)
    assert p.exitcode == 0


def test_slot_protocol():
    table = lease.SlotTable(2, CTX)
    i = table.put(7, 3, 0, 1, 60.0, lease.RENEW_ALIVE)
    assert table.free_count() == 1
    assert table.mark(i, 7, 3, cancel=True) and table.flags(i, 7) == (False, True)
    assert not table.mark(i, 7, 4, lost=True)  # another token: not this lease
    assert table.start(i, 7)
    table.set_state(i, 7, lease.WRITING)
    assert not table.mark(i, 7, 3, lost=True)  # an outcome write in flight is never marked lost
    table.clear(i, 7)
    assert table.free_count() == 2 and table.flags(i, 7) == (True, False)  # a gone job reads as lost
