"""The retries the supervisor wrote that a drain run waits for (supervisor/retry_hold.py)."""

from __future__ import annotations

from pgworker.worker.supervisor.retry_hold import WAKE_MARGIN_SECONDS, RetryHold


def test_a_drain_run_holds_until_the_retry_is_due_wakes_a_claimer_once_then_a_margin_more():
    woken: list[float] = []
    hold = RetryHold(2.0, drain=True)
    assert not hold.holds(0.0, lambda: woken.append(0.0))  # nothing written
    hold.add(0.5, now=10.0)
    assert hold.holds(10.4, lambda: woken.append(10.4)) and woken == []  # not due yet: no wake-up
    assert hold.holds(10.5, lambda: woken.append(10.5)) and woken == [10.5]  # due: one claimer woken
    assert hold.holds(10.5 + WAKE_MARGIN_SECONDS / 2, lambda: woken.append(-1.0)) and woken == [10.5]
    assert not hold.holds(10.5 + WAKE_MARGIN_SECONDS, lambda: woken.append(-1.0)) and woken == [10.5]
    hold.add(0.2, now=20.0)  # a later retry holds again, and wakes again
    assert hold.holds(20.2, lambda: woken.append(20.2)) and woken == [10.5, 20.2]


def test_only_a_drain_runs_retries_within_the_horizon_hold_it():
    hold = RetryHold(2.0, drain=True)
    hold.add(60.0, now=0.0)  # a minute away: the next run's (next_due_seconds says when)
    assert not hold.holds(0.0, lambda: None)
    always_on = RetryHold(2.0, drain=False)  # its fallback poll and LISTEN find its retries
    always_on.add(0.1, now=0.0)
    assert not always_on.holds(0.0, lambda: None)


def test_an_earlier_retry_after_a_later_one_does_not_shorten_the_hold():
    hold = RetryHold(2.0, drain=True)
    hold.add(1.5, now=0.0)
    hold.add(0.1, now=0.0)
    assert hold.holds(1.0, lambda: None)
