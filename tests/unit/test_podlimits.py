"""Per-pod queue limits in shared memory (no database)."""

from __future__ import annotations

import copy
import fcntl
import multiprocessing
import os
import signal
import time

import pytest

from pgworker.worker.podlimits import PodQueueLimits

pytestmark = pytest.mark.unit


def test_reservations_share_the_cap_between_claimers():
    ctx = multiprocessing.get_context("spawn")
    limits = PodQueueLimits({"emails": 3}, claimers=2, ctx=ctx)
    # each claimer process has its own copy (as after spawn), sharing the counts
    c0, c1 = copy.copy(limits), copy.copy(limits)
    held = {0: 0, 1: 0}
    try:
        assert c0.reserve(0, "emails", 2, lambda q: held[0]) == 2
        assert c1.reserve(1, "emails", 5, lambda q: held[1]) == 1  # the cap is shared
        assert c1.reserve(1, "emails", 5, lambda q: held[1]) == 0
        held[0] = 1  # claimer 0's claim returned one job of the two it was granted
        c0.claimed(0, "emails", 2, lambda q: held[0])
        held[1] = 1
        c1.claimed(1, "emails", 1, lambda q: held[1])
        assert c1.reserve(1, "emails", 5, lambda q: held[1]) == 1  # the pod holds 2 of 3: one more
        limits.drop_claimer(1)  # claimer 1 died: the dispatcher drops its share
        assert c0.reserve(0, "emails", 5, lambda q: held[0]) == 2
        assert c0.reserve(0, "other", 7, lambda q: 0) == 7  # queues without a limit
    finally:
        limits.close()


def _hold_the_lock(path, ready):
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    time.sleep(60)


def test_a_claimer_killed_inside_the_lock_does_not_wedge_the_pod():
    ctx = multiprocessing.get_context("spawn")
    limits = PodQueueLimits({"q": 1}, claimers=2, ctx=ctx)
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_the_lock, args=(limits.lock_path, ready))
    holder.start()
    try:
        assert ready.wait(30)
        os.kill(holder.pid, signal.SIGKILL)  # dies holding the pod lock
        holder.join(30)
        assert limits.reserve(0, "q", 1, lambda q: 0) == 1  # the kernel released it
    finally:
        if holder.is_alive():
            holder.kill()
        limits.close()
