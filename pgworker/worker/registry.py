"""The pod registry: a row per pod in ``pods`` (host, pid, version, queues, claimers and
what each holds now), refreshed on the renewer's cadence, for the console's Workers page.

Nothing decides from it: the reaper recovers jobs from their leases alone, and a pod
whose row is stale is only *shown* as gone. Rows not refreshed for
``PRUNE_AFTER_SECONDS`` are deleted by any pod's registry (a pod killed with SIGKILL never
says it stopped); a pod that stops cleanly marks its row stopped. What the claimers hold
is read from their slot tables through :mod:`.holdings`: one statement per interval per
pod, none per job.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any, Callable

import psycopg

from .service import Service

log = logging.getLogger("pgworker.worker")

#: A registry row not refreshed for this long is deleted (the page shows it gone well before).
PRUNE_AFTER_SECONDS = 3600.0
#: Prune every this many refreshes (a pass is one statement; pruning a second one).
PRUNE_EVERY_PASSES = 30


class PodRegistry(Service):
    """Refreshes this pod's registry row every ``interval`` seconds. ``claimers()`` says
    what each claimer holds (:func:`pgworker.worker.holdings.claimer_holdings`)."""

    name = "registry"
    action = "refreshing the pod registry"

    def __init__(self, *, store: Any, interval: float, pod_id: str, version: str, queues: tuple[str, ...],
                 concurrency: int, drain: bool, claimers: Callable[[], list[dict[str, Any]]], **kw: Any) -> None:
        super().__init__(**kw)
        self.store = store
        self.interval = interval
        self.row = {"pod_id": pod_id, "host": socket.gethostname(), "version": version, "queues": queues,
                    "concurrency": concurrency, "drain": drain}
        self.claimers = claimers
        self.passes = 0

    def next_delay(self) -> float:
        return self.interval

    def run_once(self, conn: psycopg.Connection) -> None:
        import os

        self.store.pod_heartbeat(conn, pid=os.getpid(), claimers=self.claimers(), **self.row)
        self.passes += 1
        if self.passes % PRUNE_EVERY_PASSES == 1:
            self.store.pods_prune(conn, older_than=max(PRUNE_AFTER_SECONDS, 10 * self.interval))

    def run(self) -> None:
        try:
            super().run()
        finally:
            self._say_stopped()

    def _say_stopped(self) -> None:
        """Mark the row stopped on the way out (bounded: a database that does not answer
        leaves it to look gone, then pruned)."""
        if not self.passes:
            return
        try:
            def stop() -> None:
                with self.connect(f"pgworker:{self.name}") as conn:
                    self.store.pod_stop(conn, self.row["pod_id"])

            self.bounded(stop, min(self.pass_timeout, 5.0))
        except Exception as exc:  # noqa: BLE001 - the row then reads as gone
            log.debug("could not mark the pod stopped in the registry: %s", type(exc).__name__)


def registry_of(supervisor: Any, common: dict[str, Any]) -> PodRegistry:
    """The registry service of a :class:`pgworker.worker.supervisor.Supervisor` (``common``:
    the services' connect, stop, health, dsn and pass_timeout)."""
    from .._version import __version__
    from .holdings import claimer_holdings

    return PodRegistry(
        store=supervisor.store, interval=supervisor.settings.effective_renew_interval,
        pod_id=pod_id(supervisor.app.worker_id()), version=__version__, queues=tuple(supervisor.queues),
        concurrency=supervisor.settings.concurrency, drain=supervisor.drain,
        claimers=lambda: claimer_holdings(supervisor.pool.handles, queue_name=supervisor._queue_name,
                                          task_names=supervisor._task_names), **common)


def pod_id(worker_id: str) -> str:
    """This run's registry id: the worker id (host:pid by default) and the start time, so a
    restart in the same container (pid 1 again) is a new row."""
    return f"{worker_id}@{int(time.time())}"
