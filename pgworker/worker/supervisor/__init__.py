"""The supervisor: the parent process of ``pgworker run``.

It starts the pod's claimer processes and its services, then watches: every tick it
runs the lease clock (leases presumed lost without waiting on the database), stops
attempts past their hard limit, replaces claimers that exited and has what they held
settled, announces work on the fallback poll, and decides when to stop. Its services,
each a thread with its own connection: the renewer, the settler, the pod registry (read
by the console only), the listener, the reaper, the pruner and the scheduler (the last
four not in drain mode). /metrics,
/healthz and /readyz are served from here.

Modules: :mod:`.main` (the Supervisor, start-up, HTTP), :mod:`.tick` (the tick and the
stop decision), :mod:`.pool` (the claimer processes), :mod:`.services` (the services'
wiring), :mod:`.settlement` (claimers gone, hand-backs), :mod:`.shutdown` (the grace,
the final settlement, the drain report and the exit code).

Shutdown (SIGTERM, SIGINT or SIGHUP: ``STOP_SIGNALS``): stop claiming, release the jobs waiting unstarted (fenced,
no attempt spent), give running jobs ``shutdown_grace`` seconds (timeouts still hold),
then fail what still runs with ``SHUTDOWN`` (the attempt counts) and exit 0 (a drain run:
128 + the signal's number, below). A second signal exits at once with 128 + the signal's
number; leases then expire and a reaper recovers the jobs.

Drain mode (``--drain``): maintenance once (:mod:`pgworker.worker.drain`), then claim (woken by the
fallback poll; no LISTEN) until nothing is due and nothing is in flight, and exit 0; with ``max_duration`` and due work left at the
deadline, exit ``EXIT_DRAIN_DEADLINE``; stopped by a signal (the graceful stop above), exit
128 + its number (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP), so that a script or a CronJob tells a
stopped run from a completed one.
"""

from .main import Supervisor
from .settlement import WAITING_HAND_BACK_SECONDS
from .shutdown import EXIT_DRAIN_DEADLINE, EXIT_ERROR, EXIT_OK, STOP_SIGNALS

__all__ = ["EXIT_DRAIN_DEADLINE", "EXIT_ERROR", "EXIT_OK", "STOP_SIGNALS", "WAITING_HAND_BACK_SECONDS", "Supervisor"]
