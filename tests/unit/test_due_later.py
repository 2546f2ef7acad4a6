"""The claimer's own wake-ups for the retries and snoozes it wrote (due_later.py)."""

from __future__ import annotations

import pytest

from pgworker.worker.claimer import due_later
from pgworker.worker.claimer.due_later import DueLater


def test_the_soonest_job_sets_the_wait_and_passes_once_due():
    d = DueLater(2.0)
    assert d.seconds_to_next(now=100.0) is None and not d.pop_due(now=100.0)
    d.add(5.0, retry=True, now=100.0)
    d.add(0.3, retry=False, now=100.0)
    assert d.seconds_to_next(now=100.0) == pytest.approx(0.3)
    assert not d.pop_due(now=100.2)
    assert d.pop_due(now=100.3) and not d.pop_due(now=100.3)  # forgotten once due
    assert d.seconds_to_next(now=101.0) == pytest.approx(4.0)


def test_a_drain_run_holds_for_retries_within_the_horizon_only():
    d = DueLater(2.0, drain=True)
    d.add(60.0, retry=True, now=0.0)  # a minute away: the next run's
    assert not d.holds_drain(now=0.0)
    d.add(0.5, retry=True, now=0.0)
    assert d.holds_drain(now=0.4) and not d.holds_drain(now=0.5)
    assert d.pop_due(now=1.0)
    d.add(0.1, retry=False, now=1.0)  # a snooze in a drain run: no hold, no wake-up
    assert not d.holds_drain(now=1.0) and d.seconds_to_next(now=1.0) == 59.0


def test_the_wake_ups_are_bounded_keeping_the_soonest(monkeypatch):
    monkeypatch.setattr(due_later, "MAX_WAKEUPS", 3)
    d = DueLater(2.0)
    for delay in (10.0, 20.0, 30.0, 5.0, 40.0):
        d.add(delay, retry=False, now=0.0)
    assert d.seconds_to_next(now=0.0) == 5.0
    assert sorted(d._wakeups) == [5.0, 10.0, 20.0]
