"""The worker runtime of ``pgworker run``: one supervisor process and its claimer processes.

One module per duty (docs/architecture.md draws them):

- :mod:`.supervisor` starts, watches and stops the pod; :mod:`.claimers` its processes;
  :mod:`.drain` what a ``--drain`` run does before and after;
- :mod:`.lease` the lease contract (renew, stop renewing, presume lost, late outcomes);
  :mod:`.slots` the shared-memory slot tables it reads;
- services of the supervisor, on one base (:mod:`.service`): :mod:`.renewer`,
  :mod:`.settler`, :mod:`.listener`, :mod:`.reaper`, :mod:`.pruner`, :mod:`.scheduler`;
  :mod:`.wakeups` how work announced wakes one idle claimer; :mod:`.health` /readyz;
  :mod:`.stats` the queue statistics of /metrics;
- the claimer side, :mod:`.claimer`: the claim loop, the executor, the completer;
  :mod:`.outcome` what an attempt's outcome is and how it is written.
"""

from .supervisor import EXIT_DRAIN_DEADLINE, EXIT_ERROR, EXIT_OK, Supervisor

__all__ = ["EXIT_DRAIN_DEADLINE", "EXIT_ERROR", "EXIT_OK", "Supervisor"]
