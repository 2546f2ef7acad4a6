"""The claimer's floors (pgworker.claim_floors): how each moves after a claim, when they are
dropped, and that nothing is kept before a horizon was granted. The database side (the
protocol of migration 0013 and the claim that uses the floors) is
tests/integration/test_claim_floors.py."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from pgworker.claim_floors import MAX_PRIORITIES, ClaimFloors
from pgworker.jobs import ClaimedJob, ClaimResult

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
NONE = {"floor_priorities": None, "floor_at": None, "floor_id": None, "floor_default": None, "floor_aged": None}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def job(i: int, priority: int, run_at: float) -> ClaimedJob:
    return ClaimedJob(i, "q", "t", {}, priority, 1, 5, 1, at(3600), at(run_at), at(run_at), None, None, None, 0.0)


def result(jobs: list[ClaimedJob], allowance: int, horizon: float | None, epoch: int = 1, aged: int = 0,
           aging: float | None = None, granted: bool | None = None) -> ClaimResult:
    """A claim's result; its horizon granted unless said (None: not granted, no time)."""
    return ClaimResult(jobs=jobs, allowance=allowance, horizon_at=None if horizon is None else at(horizon),
                       horizon_epoch=epoch, horizon_granted=horizon is not None if granted is None else granted,
                       aged_count=aged, aging_seconds=aging)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def floors_with_horizon(t: float = 100.0, epoch: int = 1, clock: Clock | None = None) -> ClaimFloors:
    """Floors whose queue "q" has a granted horizon at ``t`` (and no floor yet)."""
    f = ClaimFloors(reset_seconds=60.0, clock=clock or Clock())
    assert f.params("q") == NONE
    assert f.learn("q", result([], 10, t, epoch)) is False
    return f


def test_nothing_is_kept_before_a_horizon_was_granted():
    f = ClaimFloors(reset_seconds=60.0, clock=Clock())
    f.params("q")
    f.learn("q", result([job(1, 0, 50)], 10, None))  # the writer held the lock: no horizon
    assert f.params("q")["floor_default"] is None and not f.used()
    f.learn("q", result([job(2, 0, 60)], 10, None))
    assert f.params("q") == NONE


def test_a_short_claim_ran_every_arm_to_its_end():
    f = floors_with_horizon(t=100.0)
    f.params("q")
    # took 3 of 10: priority 5 from its job at 40, priority 0 from 70 (capped at T = 100)
    f.learn("q", result([job(1, 5, 40), job(2, 5, 90), job(3, 0, 170)], 10, 200.0))
    p = f.params("q")
    assert p["floor_priorities"] == [5, 0]
    # the first job taken, but never above the horizon before (then the horizon, id 0)
    assert p["floor_at"] == [at(40), at(100)] and p["floor_id"] == [1, 0]
    assert p["floor_default"] == at(100)
    assert p["floor_aged"] is None  # no aging bound
    assert f.used()


def test_a_full_claim_moves_the_priorities_above_its_last_one_to_the_end():
    f = floors_with_horizon(t=100.0)
    f.params("q")
    f.learn("q", result([], 10, 110.0))  # short and empty: default floor 100
    f.params("q")
    # known: none yet; a full claim of 3: priority 9 read to its end, priority 5 partly
    f.learn("q", result([job(1, 9, 20), job(2, 5, 30), job(3, 5, 31)], 3, 120.0))
    p = f.params("q")
    assert dict(zip(p["floor_priorities"], p["floor_at"])) == {9: at(20), 5: at(30)}
    assert p["floor_default"] == at(100)  # a full claim leaves the other priorities' floor alone
    # next full claim took only priority 9 jobs: 9 moves to its first job (T is now 110), 5 stays
    f.learn("q", result([job(4, 9, 60), job(5, 9, 61)], 2, 130.0))
    p = f.params("q")
    assert dict(zip(p["floor_priorities"], p["floor_at"])) == {9: at(60), 5: at(30)}
    # a full claim down to priority 0: 9 and 5 were read to their ends (nothing taken from 9:
    # the horizon before this claim, 130)
    f.learn("q", result([job(6, 5, 80), job(7, 0, 5)], 2, 140.0))
    p = f.params("q")
    assert dict(zip(p["floor_priorities"], p["floor_at"])) == {9: at(130), 5: at(80), 0: at(5)}


def test_a_floor_is_a_position_jobs_of_one_run_at_are_passed_by_id():
    """A bulk enqueue gives thousands of jobs one run_at: the floor moves through them by id."""
    f = floors_with_horizon(t=100.0)
    f.params("q")
    f.learn("q", result([job(7, 0, 50), job(8, 0, 50)], 2, 200.0))
    f.learn("q", result([job(9, 0, 50), job(10, 0, 50)], 2, 300.0))
    p = f.params("q")
    assert (p["floor_at"], p["floor_id"]) == ([at(50)], [9])


def test_floors_only_rise_between_drops():
    f = floors_with_horizon(t=100.0)
    f.params("q")
    f.learn("q", result([job(1, 0, 90)], 1, 200.0))
    assert f.params("q")["floor_at"] == [at(90)]
    # the horizon before is now 200; a job at 95 taken later (an older one released behind,
    # found after a drop) is the only way below: only a drop brings a floor down
    f.learn("q", result([job(2, 0, 150)], 1, 300.0))
    assert f.params("q")["floor_at"] == [at(150)]


def test_an_epoch_change_drops_the_floors_and_asks_for_a_claim_at_once():
    f = floors_with_horizon(t=100.0, epoch=7)
    f.params("q")
    assert f.learn("q", result([job(1, 0, 90)], 5, 200.0, epoch=7)) is False
    assert f.params("q")["floor_at"] == [at(90)]
    assert f.learn("q", result([], 5, 300.0, epoch=8)) is True
    assert f.params("q") == NONE
    assert not f.used()
    # the new horizon counts: the next claim moves the floors again, capped at 300
    f.learn("q", result([job(2, 0, 400)], 5, 500.0, epoch=8))
    assert f.params("q")["floor_at"] == [at(300)]
    # an empty claim that ran to the end: every priority's floor is the horizon before it
    assert f.learn("q", result([], 5, 600.0, epoch=8)) is False
    assert f.params("q")["floor_default"] == at(500) and f.used()


def test_an_epoch_change_drops_the_floors_even_when_the_horizon_is_not_granted():
    """A writer of the bucket in flight keeps the horizon from being granted, but the bump
    is seen at once: the floors go, and every claim is exact until a granted horizon
    makes the new epoch the baseline."""
    f = floors_with_horizon(t=100.0, epoch=3)
    f.params("q")
    f.learn("q", result([job(1, 0, 50)], 5, 200.0, epoch=3))
    assert f.params("q")["floor_default"] == at(100)
    assert f.learn("q", result([], 5, None, epoch=4)) is True  # not granted, but bumped
    assert f.params("q") == NONE
    for _ in range(3):  # still not granted: nothing is kept, every claim from the start
        assert f.learn("q", result([job(2, 0, 60)], 5, None, epoch=4)) is False
        assert f.params("q") == NONE
    f.learn("q", result([], 5, 300.0, epoch=4))  # granted: the new baseline
    f.params("q")
    f.learn("q", result([job(3, 0, 250)], 5, 400.0, epoch=4))
    assert f.params("q")["floor_at"] == [at(250)]


def test_floors_are_capped_at_the_claims_own_now():
    """A claim's due range ends at its now(): a floor never passes it, whatever the
    horizon (a claim in a transaction that began before the horizon)."""
    f = floors_with_horizon(t=100.0)
    f.params("q")
    f.learn("q", ClaimResult(jobs=[], allowance=5, horizon_at=at(200), horizon_epoch=1, horizon_granted=True,
                             due_until=at(80)))
    assert f.params("q")["floor_default"] == at(80)


def test_a_drop_forgets_that_floors_were_used():
    """Drain mode drops floors and claims again when a round used them: a queue the next
    round does not claim (rate limited) must not keep it spinning."""
    f = floors_with_horizon(t=100.0)
    f.params("q")
    f.learn("q", result([], 5, 200.0))
    f.params("q")
    assert f.used()
    f.drop()
    assert not f.used()


def test_floors_are_dropped_every_reset_interval_and_never_with_zero():
    clock = Clock()
    f = ClaimFloors(reset_seconds=10.0, clock=clock)
    f.params("q")
    f.learn("q", result([], 5, 100.0))
    f.params("q")
    f.learn("q", result([job(1, 0, 50)], 5, 200.0))
    clock.now = 9.9
    assert f.params("q")["floor_at"] == [at(50)]
    clock.now = 10.0
    assert f.params("q")["floor_priorities"] is None and not f.used()
    off = ClaimFloors(reset_seconds=0.0, clock=clock)
    for horizon in (100.0, 200.0, 300.0):
        assert off.params("q")["floor_default"] is None
        off.learn("q", result([job(1, 0, 50)], 5, horizon))
    assert not off.used()
    with pytest.raises(ValueError, match="reset_seconds"):
        ClaimFloors(reset_seconds=-1)


def test_the_aging_arm_keeps_a_floor_of_its_own():
    f = floors_with_horizon(t=1000.0)
    f.params("q")
    # aging bound 60 s: the aging arm took 2 of 5 (it ran to its end): its floor is T - 60
    f.learn("q", result([job(1, 0, 10), job(2, 9, 20), job(3, 9, 500)], 5, 1100.0, aged=2, aging=60.0))
    assert f.params("q")["floor_aged"] == at(940)
    # a claim the aging arm filled: its floor is its first job
    f.learn("q", result([job(4, 0, 30), job(5, 0, 31)], 2, 1200.0, aged=2, aging=60.0))
    assert f.params("q")["floor_aged"] == at(30)


def test_no_allowance_moves_nothing_and_drop_forgets_one_queue_or_all():
    f = floors_with_horizon(t=100.0)
    f.params("q")
    f.learn("q", result([job(1, 0, 50)], 5, 200.0))
    before = f.params("q")
    f.learn("q", result([], 0, 300.0))  # paused or at its limit: no arm ran
    assert f.params("q") == before
    f.params("other")
    f.learn("other", result([], 5, 100.0))
    f.params("other")
    f.learn("other", result([], 5, 200.0))
    assert f.params("other")["floor_default"] == at(100)
    f.drop("q")
    assert f.params("q")["floor_default"] is None and f.params("other")["floor_default"] == at(100)
    f.drop()
    assert f.params("other")["floor_default"] is None


def test_at_most_max_priorities_are_kept_the_highest_ones():
    f = floors_with_horizon(t=100.0)
    f.params("q")
    jobs = [job(i, p, 10 + p) for i, p in enumerate(range(20, 0, -1))]
    f.learn("q", result(jobs, 50, 200.0))
    p = f.params("q")
    assert p["floor_priorities"] == list(range(20, 20 - MAX_PRIORITIES, -1))
    assert p["floor_default"] == at(100)  # the priorities let go fall back to it: still safe


def test_a_horizon_not_granted_moves_the_cap_to_the_oldest_writers_start():
    """Writers in flight (producers enqueueing all the time): the horizon's time is the
    oldest holder's transaction start. With the epoch unchanged the cap moves on to it (never
    back), so floors follow the queue; the epoch is not taken as a baseline."""
    f = floors_with_horizon(t=100.0, epoch=5)
    f.params("q")
    f.learn("q", result([job(1, 0, 150)], 5, 140.0, epoch=5, granted=False))  # capped at 100 still
    assert f.params("q")["floor_default"] == at(100)
    f.learn("q", result([job(2, 0, 190)], 5, 120.0, epoch=5, granted=False))  # the cap is now 140
    assert f.params("q")["floor_default"] == at(140)
    f.learn("q", result([job(3, 0, 250)], 5, 260.0, epoch=5, granted=False))  # 120 is older: the cap stays 140
    assert f.params("q")["floor_default"] == at(140)
    f.learn("q", result([job(4, 0, 300)], 5, 280.0, epoch=5, granted=False))  # capped at 260
    assert f.params("q")["floor_default"] == at(260)
    # a bump seen at a horizon not granted: drop, and neither the cap nor the epoch moves
    assert f.learn("q", result([], 5, 400.0, epoch=6, granted=False)) is True
    assert f.params("q") == NONE
    f.learn("q", result([job(5, 0, 300)], 5, 410.0, epoch=6, granted=False))
    assert f.params("q") == NONE  # still the old baseline: every claim exact until a grant
    f.learn("q", result([], 5, 420.0, epoch=6))  # granted: the new baseline
    f.params("q")
    f.learn("q", result([job(6, 0, 450)], 5, 500.0, epoch=6))
    assert f.params("q")["floor_at"] == [at(420)]
