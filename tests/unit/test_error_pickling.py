"""The exceptions a handler raises cross a process boundary intact (a handler that runs
its work in a ProcessPoolExecutor re-raises what the pool's worker raised, by pickle)."""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

import pgworker


def _raise_retry() -> None:
    raise pgworker.Retry(after=30, reason="rate limited")


@pytest.mark.parametrize("error", [pgworker.Retry(5, "x"), pgworker.Retry(), pgworker.Retry(after=0.5),
                                   pgworker.Snooze(3), pgworker.Permanent("no", code="BAD")],
                         ids=["retry", "retry-default", "retry-after-only", "snooze", "permanent"])
def test_a_handler_outcome_survives_pickling(error):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert vars(back) == vars(error)


def test_a_retry_raised_in_a_process_pool_comes_back_as_a_retry():
    with ProcessPoolExecutor(1) as pool:
        with pytest.raises(pgworker.Retry) as info:
            pool.submit(_raise_retry).result(timeout=60)
    assert (info.value.after, str(info.value)) == (30, "rate limited")
