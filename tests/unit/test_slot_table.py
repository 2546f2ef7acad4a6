"""The slot table survives kill -9 of the process on the other side."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest

from pgworker.worker.shm import layout as lease
from pgworker.worker.shm.slots import SlotTable, SlotTableBusy

pytestmark = pytest.mark.unit
CTX = multiprocessing.get_context("spawn")


def _claim(table, job_id, token):
    """Record one claimed job the way the claimer does (put_many); returns its slot."""
    entry = lease.SlotEntry(job_id, token, 0, 1, 60.0, lease.RENEW_ALIVE)
    return table.put_many([entry], claimed_at=time.monotonic())[0]


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
    table = SlotTable(4, CTX)
    _spawn_and_kill(_wait_forever, table)
    assert _returns_within(table.wake.set, 3)
    assert _returns_within(lambda: [table.wake.set() for _ in range(100_000)], 10)  # one pending wake-up is enough


def test_a_lock_held_by_a_dead_claimer_is_released_with_it():
    table = SlotTable(4, CTX)
    _spawn_and_kill(_hold_lock_forever, table)
    outcome = []

    def read():
        try:
            outcome.append(table.held())
        except SlotTableBusy:
            outcome.append("busy")

    assert _returns_within(read, 10) and outcome == [[]]  # no lock to replace: the kernel released it
    assert table.reset_for_replacement() is not None


def test_a_lock_held_by_a_stopped_process_gives_a_bounded_busy_answer():
    table = SlotTable(4, CTX)
    p = CTX.Process(target=_hold_lock_forever, args=(table,))
    p.start()
    try:
        deadline = time.monotonic() + 30
        while not table.header.idle and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(p.pid, signal.SIGSTOP)
        outcome = []

        def read():
            try:
                table.held()
            except SlotTableBusy:
                outcome.append("busy")

        assert _returns_within(read, 10) and outcome == ["busy"]  # a bounded wait, then a clear answer
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join()


# -- issue 18, item 7: a claimer killed inside a PEER's table --------------------------

def _peer(tables, index, commands, answers):
    """A claimer stand-in: runs commands on the pod's tables until told to stop."""
    while True:
        command = commands.get(timeout=60)
        if command == "hold-peer-lock-and-die":  # killed inside a take-over of claimer 0's job
            tables[0].lock.acquire()
            os.kill(os.getpid(), signal.SIGKILL)
        elif command == "hold-own-lock-and-die":
            tables[index].lock.acquire()
            os.kill(os.getpid(), signal.SIGKILL)
        elif command == "take-from-0":
            try:
                v = tables[0].take_over_next(index)
                answers.put(None if v is None else v.job_id)
            except SlotTableBusy:
                answers.put("busy")
        else:
            return


def _pod(count, commands, answers):
    from pgworker.worker.supervisor.pool import ClaimerPool

    def start(h):
        p = CTX.Process(target=_peer, args=(pool.tables, h.index, commands[h.index], answers))
        p.start()
        return p

    pool = ClaimerPool(mp=CTX, count=count, capacity=4, start_process=start)
    pool.start()
    return pool


def _died(pool, h):
    h.process.join(30)
    assert h.process.exitcode == -signal.SIGKILL
    pool.held_by(h)  # what the supervisor does for a claimer that is gone (the lock recovery)


def test_a_peer_killed_inside_a_claimers_table_does_not_wedge_that_claimer():
    """Claimer 1 dies (SIGKILL) while it holds claimer 0's table lock, as in a take-over.
    Claimer 0 (here: this process) waits for its own lock without a timeout: it must get
    it, and the supervisor's bounded reads must not find the table busy for good."""
    commands, answers = [CTX.Queue() for _ in range(2)], CTX.Queue()
    pool = _pod(2, commands, answers)
    try:
        commands[1].put("hold-peer-lock-and-die")
        _died(pool, pool.handles[1])
        t0 = pool.tables[0]
        assert _returns_within(lambda: _claim(t0, 7, 1), 10), \
            "claimer 0 waits forever on its own lock"
        assert [v.job_id for v in t0.live()] == [7]
    finally:
        commands[0].put("stop")
        pool.kill_all()


def test_peers_keep_using_the_table_of_a_claimer_that_died_holding_its_lock():
    """Claimer 0 dies holding its own lock; claimer 1, started before, must still reach
    claimer 0's table (its replacement's waiting jobs) with the lock it was given at
    spawn: no lock is replaced behind its back, so it never pays the lock timeout."""
    commands, answers = [CTX.Queue() for _ in range(2)], CTX.Queue()
    pool = _pod(2, commands, answers)
    try:
        commands[0].put("hold-own-lock-and-die")
        _died(pool, pool.handles[0])
        pool.tables[0].reset_for_replacement()
        _claim(pool.tables[0], 9, 1)  # claimed by the replacement claimer
        commands[1].put("take-from-0")
        assert answers.get(timeout=30) == 9
    finally:
        commands[1].put("stop")
        pool.kill_all()


def test_a_replacement_claimer_gets_a_working_wake_up():
    table = SlotTable(4, CTX)
    _spawn_and_kill(_wait_forever, table)
    table.reset_for_replacement()
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
    table = SlotTable(2, CTX)
    i = _claim(table, 7, 3)
    assert table.free_count() == 1
    assert table.mark(i, 7, 3, cancel=True) and table.flags(i, 7) == (False, True)
    assert not table.mark(i, 7, 4, lost=True)  # another token: not this lease
    assert table.start(i, 7)
    table.set_state_many([(i, 7)], lease.WRITING)
    assert not table.mark(i, 7, 3, lost=True)  # an outcome write in flight is never marked lost
    table.empty_job(i, 7)
    assert table.free_count() == 2 and table.flags(i, 7) == (True, False)  # a gone job reads as lost


# -- issue 18, item 9: the wake-up generation never moves backwards -------------------

BUMPS = 40_000


def _bump_and_watch(signals, go, backwards):
    go.wait(30)
    last = 0
    for _ in range(BUMPS):
        signals.announce([], -1)
        seen = signals.generation
        if seen < last:
            backwards.value += 1
        last = seen


def test_the_wake_up_generation_counts_every_bump_of_every_process():
    """Four processes announce work at once, as the supervisor's threads and the claimers
    do: the generation each sees never goes back (a claimer that saw it move must not see
    it return to a value it had), and no bump is lost."""
    from pgworker.worker.shm.wakeups import PodSignals

    signals = PodSignals(CTX)
    go = CTX.Event()
    backwards = CTX.Value("q", 0)
    procs = [CTX.Process(target=_bump_and_watch, args=(signals, go, backwards)) for _ in range(4)]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert backwards.value == 0
    assert signals.generation == 4 * BUMPS


def test_outcome_counts_of_two_threads_are_exact():
    """Issue 18, item 16 (c): a claimer's main thread and its flusher thread both account
    their flushes in the table's counters (the drain summary's): none may be lost."""
    import sys

    table = SlotTable(2, CTX)
    n = 100_000

    def account():
        for _ in range(n):
            table.count("succeeded", 1)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # thread switches as often as a loaded machine may make them
    try:
        threads = [threading.Thread(target=account) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        sys.setswitchinterval(interval)
    assert table.outcome_counts()["succeeded"] == 2 * n


def test_a_taker_that_dies_mid_move_leaves_no_stolen_slot_behind():
    """Issue 18, item 16 (b). Claimer 1 takes over claimer 0's waiting job, records it in
    its own table, and dies before it empties the old slot. Settling claimer 1's jobs must
    empty that old slot too: it once stayed MOVING (then called STOLEN) for good (a slot lost to claimer 0, the
    pod's per-queue count off, and a drain that never ended, since the pod held a job)."""
    from types import SimpleNamespace

    from pgworker.worker.supervisor.pool import ClaimerPool
    from pgworker.worker.settler import settlements

    pool = ClaimerPool(mp=CTX, count=2, capacity=2, start_process=lambda h: None)
    owner, taker = pool.tables
    slot = _claim(owner, 7, 3)
    view = owner.take_over_next(1)
    assert view is not None and view.job_id == 7
    _claim(taker, 7, 3)  # the taker's _hold; then it is killed
    held, in_transit = pool.held_by(pool.handles[1])
    items = settlements(held, in_transit, app=SimpleNamespace(tasks={}), queue_name=lambda v: "default",
                        kill_reasons={}, clear=lambda v: None)
    assert [i.write.lease.job_id for i in items] == [7]  # settled once (released: it never started)
    for i in items:
        i.clear()  # what settle() does once the write went through
    assert owner.state_of(slot, 7) == lease.EMPTY
    assert owner.live() == [] and owner.free_count() == 2


def test_a_waiting_job_whose_lease_is_past_the_cutoff_is_marked_lost_not_started():
    """SlotTable.start with the lease contract's start_cutoff: a lease renewed within the
    cutoff starts; one whose last renewal (or claim) was sent before it is marked lost
    and never started, and stays so (the lease clock sees it lost)."""
    from pgworker.worker.lease import LeaseTerms, start_cutoff

    table = SlotTable(4, CTX)
    terms = LeaseTerms(6.0, 2.0)
    fresh, stale = _claim(table, 1, 1), _claim(table, 2, 1)
    now = time.monotonic()
    table.slots[stale].claimed_at = now - 5.5  # a lease less half an interval ago: about to pass
    assert table.start(fresh, 1, start_cutoff(terms, now)) == lease.STARTED
    assert table.start(stale, 2, start_cutoff(terms, now)) == lease.LEASE_EXPIRED
    assert table.flags(stale, 2) == (True, False) and table.state_of(stale, 2) == lease.CLAIMED
    assert table.start(stale, 2) == lease.NOT_STARTABLE  # lost for good: never started later


def test_the_lease_watch_marks_an_orphans_jobs_lost_and_a_stopped_supervisors_leases_presumed():
    """LeaseWatch (claimer/lease_watch.py): the supervisor gone, every job waiting or
    running is marked lost at once, a decided one is left to its write; the supervisor
    there but silent, only a lease a whole lease old is presumed lost, on the claimer's
    clock. Each is counted as a lost renewal."""
    from pgworker.worker.claimer.lease_watch import LeaseWatch
    from pgworker.worker.lease import LeaseTerms

    counted: list[tuple[str, str, int]] = []

    class Counts:
        def renewals(self, queue, result, count):
            counted.append((queue, result, count))

    terms = LeaseTerms(6.0, 2.0)
    table = SlotTable(4, CTX)
    waiting, running, decided = _claim(table, 1, 1), _claim(table, 2, 1), _claim(table, 3, 1)
    table.start(running, 2)
    table.decide(decided, 3, 1)
    gone = [False]
    watch = LeaseWatch(table, terms, lambda: gone[0], lambda v: "q", Counts(), 0)
    now = time.monotonic()
    assert watch.tick(now) == 0  # fresh leases, the supervisor there
    table.slots[running].claimed_at = now - 6.5  # not renewed for more than a lease
    assert watch.tick(now + 0.1) == 0  # within WATCH_SECONDS of the last look: not yet
    assert watch.tick(now + 1.0) == 1 and table.flags(running, 2) == (True, False)
    gone[0] = True
    assert watch.tick(now + 2.0) == 1 and table.flags(waiting, 1) == (True, False)
    assert table.flags(decided, 3) == (False, False)  # its outcome is decided: the fence decides the write
    assert counted == [("q", "lost", 1), ("q", "lost", 1)]


def test_a_claimed_slot_is_written_whole_over_what_its_last_job_left():
    """put_many writes a slot in one struct call (CLAIMED_SLOT): every field must read back
    through ctypes as the field stores did, and nothing of the slot's previous job (its
    flags, outcome, code and message) may survive."""
    table = SlotTable(3, CTX)
    first = _claim(table, 11, 5)
    table.start(first, 11)
    table.decide(first, 11, 2, delay=3.5, permanent=True, code="BOOM", message="it failed")
    table.mark(first, 11, 5, cancel=True)
    table.slots[first].lost = 1
    table.empty_job(first, 11)
    entries = [lease.SlotEntry(21, 7, 2, 3, 60.0, lease.RENEW_PROGRESS, 4, 1234.5),
               lease.SlotEntry(22, 8, 1, 1, 30.0, lease.RENEW_ALIVE, -1, 99.0)]
    slots = table.put_many(entries, claimed_at=42.0)
    assert slots[0] == first and len(set(slots)) == 2
    views = {v.job_id: v for v in table.held()}
    reused = views[21]
    assert (reused.state, reused.queue_index, reused.token, reused.claimed_at, reused.renewed_at,
            reused.started_at, reused.progress_at, reused.expires_at, reused.hard_limit, reused.renew_policy,
            reused.attempt, reused.task_index, reused.moved_to) == (
        lease.CLAIMED, 2, 7, 42.0, 0.0, 0.0, 0.0, 1234.5, 60.0, lease.RENEW_PROGRESS, 3, 4, -1)
    assert (reused.lost, reused.outcome, reused.permanent, reused.delay, reused.code, reused.message) == (
        False, 0, False, 0.0, "", "")
    assert table.slots[first].cancel == 0
    assert views[22].order == reused.order + 1 and views[22].task_index == -1 and views[22].expires_at == 99.0
    with pytest.raises(RuntimeError, match="slot table full"):
        table.put_many(entries, claimed_at=43.0)  # one slot left for two jobs: nothing recorded
    assert len(table.held()) == 2


def _lock_in_forked_child(table, out):
    out.put(table.lock.acquire(timeout=2))
    table.lock.release()


def test_a_forked_child_takes_the_lock_on_its_own_descriptor():
    """The lock forgets the parent's descriptor in a fork hook (it compared os.getpid() on
    every call): a child forked while the parent holds it must wait for it, not share it."""
    table = SlotTable(1, CTX)
    fork = multiprocessing.get_context("fork")
    out = fork.Queue()
    import fcntl

    fd = table.lock._own_fd()
    fcntl.flock(fd, fcntl.LOCK_EX)  # the parent's descriptor holds the flock (its thread lock is free)
    try:
        child = fork.Process(target=_lock_in_forked_child, args=(table, out))
        child.start()
        # the child's own descriptor waited 2 s and was refused; the parent's, inherited,
        # would have been granted at once (an flock belongs to the open file a fork shares)
        assert out.get(timeout=10) is False
        child.join(10)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
    child = fork.Process(target=_lock_in_forked_child, args=(table, out))
    child.start()
    assert out.get(timeout=10) is True
    child.join(10)


def test_a_claimer_not_started_yet_reads_as_starting_not_exited():
    """A new user's trial: /workers said "exited" (pid -) for the live claimers of a pod
    for its first 20 s: the registry's first row is written before the pool starts its
    claimers. A handle without a process is `starting`; one whose process ended, exited."""
    from pgworker.worker.holdings import claimer_holdings
    from pgworker.worker.supervisor.pool import ClaimerPool

    pool = ClaimerPool(mp=CTX, count=2, capacity=4, start_process=lambda h: None)
    ended = CTX.Process(target=int)
    ended.start()
    ended.join()
    pool.handles[1].process = ended
    rows = claimer_holdings(pool.handles, queue_name=lambda v: "q", task_names=())
    assert [(r["starting"], r["alive"], r["pid"]) for r in rows] == [(True, False, None), (False, False, ended.pid)]
