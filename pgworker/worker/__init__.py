"""The worker runtime of ``pgworker run``: one supervisor process and its claimer processes.

One module per duty (docs/architecture.md draws them):

- :mod:`.supervisor` starts, watches and stops the pod (main, tick, pool of claimer
  processes, services wiring, settlement, shutdown); :mod:`.drain` what a ``--drain``
  run does before and after; :mod:`.startup` the wait for the database;
  :mod:`.forkserver` the process the claimers are forked from, their modules loaded;
- :mod:`.shm` the pod's shared memory: slot layout, the slot state machine, a claimer's
  header, the wake-ups, the lock; :mod:`.podlimits` the per-pod queue shares;
- :mod:`.lease` the lease contract (renew, stop renewing, presume lost, late outcomes);
- services of the supervisor, on one base (:mod:`.service`: thread, backoff, the one
  connection-drop rule): :mod:`.renewer`, :mod:`.settler`, :mod:`.registry`,
  :mod:`.listener`, :mod:`.reaper`, :mod:`.pruner`, :mod:`.scheduler`; :mod:`.health`
  /readyz; :mod:`.stats` the queue statistics of /metrics; :mod:`.metrics_setup` the
  metrics of a pod process;
- the claimer side, :mod:`.claimer`: loop, planner, runner, executor, completer;
  :mod:`.outcome` what an attempt's outcome is, how it is written, and whether a refused
  write had already committed.

The names below load the supervisor on first use (PEP 562), not when the package is
imported: ``pgworker run`` starts the claimers' fork server (:mod:`.forkserver`) before
the supervisor's own modules are imported, so that the two imports overlap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .supervisor import EXIT_DRAIN_DEADLINE, EXIT_ERROR, EXIT_OK, Supervisor

__all__ = ["EXIT_DRAIN_DEADLINE", "EXIT_ERROR", "EXIT_OK", "Supervisor"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import supervisor

        return getattr(supervisor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
