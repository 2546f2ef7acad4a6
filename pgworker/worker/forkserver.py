"""Where a pod's claimer processes come from: a fork server with their modules loaded.

A ``spawn``ed claimer is a fresh interpreter that imports psycopg, prometheus_client,
OpenTelemetry and pgworker all over again: about 0.3 to 0.5 CPU-seconds per claimer on
these 2-core machines, so a drain run of 16 claimers took 12 s until every claimer had
claimed, and even one claimer waited for the supervisor's imports and then its own, one
after the other (issue 23's start-up target: 1 s to the first claim).

With multiprocessing's ``forkserver`` start method one server process, started by
``pgworker run`` as early as it can (:func:`start_early`, before the supervisor's own
modules load, so that the two imports run side by side), imports the claimer's modules
once (:data:`PRELOAD`, through :mod:`.claimer.preload`); each claimer is then a fork of
it. What does not change: the claimer loads the app itself (an app's import-time code
runs in every claimer, as before, and never in the server), gets its
:class:`~.claimer.ClaimerSpec` by pickle as a spawned one did, and sets up its own
metrics and tracing after the fork. The server is the supervisor's child and the
claimers are the server's; a claimer watches the supervisor itself through
``multiprocessing.parent_process()`` (a pipe the supervisor holds), not its parent pid.
The server exits when the supervisor does.

The server ignores SIGTERM (a group-wide SIGTERM, as dumb-init forwards to the pod,
would otherwise kill it, and the supervisor would take its live claimers for dead: it
learns their exit codes from the server). A server killed outright (SIGKILL) makes the
supervisor see every claimer as exited: their jobs are settled as a dead claimer's are,
and the fences keep a late outcome from landing.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

# Imported once by the fork server (the claimer's modules: what a claimer process holds
# in sys.modules at its first job, measured, less the app's own).
PRELOAD = ("pgworker.worker.claimer.preload",)


# The environment the running server was started with: a claimer forked from it gets
# that one, not the supervisor's of now (a spawned claimer got the current one).
_server_env: dict[str, str] | None = None


def claimer_context() -> Any:
    """The multiprocessing context of a pod: ``forkserver``, preloading :data:`PRELOAD`.

    A server started under another environment than this process's now (a second
    ``pgworker run`` in one process, say through ``cli.main``, with another metrics
    directory) is stopped first, so that the next claimer starts a fresh one."""
    global _server_env
    from multiprocessing import forkserver

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    server = forkserver._forkserver  # type: ignore[attr-defined]
    if getattr(server, "_forkserver_pid", None) is None:
        _server_env = dict(os.environ)
    elif _server_env != dict(os.environ):
        server._stop()  # multiprocessing's own way to stop the server (its tests use it)
        _server_env = dict(os.environ)
        _start_server()
    return ctx


#: Set beside PYTHONSAFEPATH for the server's start only: the preload (.claimer.preload)
#: then removes both from the server's environment, so that claimers and what their
#: handlers start get the supervisor's environment, not -P.
SAFE_PATH_MARK = "PGWORKER_FORKSERVER_SAFE_PATH"


def _start_server() -> None:
    """Start the fork server as ``python -P``: without the current directory on its path.

    The server is ``python -c ...``, whose sys.path starts with the current directory,
    and it imports :data:`PRELOAD` before anything of ours runs (it ignores the
    supervisor's sys.path, and an ImportError). Run from the folder that *contains* a
    clone (itself named ``pgworker``) with an editable install, that folder was imported
    as an empty namespace package ``pgworker`` (setuptools' editable finder comes after
    the path), the preload failed silently, and every claimer then failed with
    ``module 'pgworker' has no attribute 'App'`` (a new user's trial). Starting it from
    another directory only moved the trap (``/``, where an image's ``COPY . /pgworker``
    puts a clone: a review). multiprocessing passes the supervisor's interpreter flags,
    not an environment of its own, so PYTHONSAFEPATH is set for the spawn alone; each
    claimer still runs in the supervisor's directory with its sys.path (multiprocessing
    sends both with the process). A server killed later is restarted by multiprocessing
    itself, without it (that one case keeps the old trap)."""
    from multiprocessing import forkserver

    if os.environ.get("PYTHONSAFEPATH"):
        forkserver.ensure_running()  # -P already, the user's: theirs to keep
        return
    os.environ.update({"PYTHONSAFEPATH": "1", SAFE_PATH_MARK: "1"})
    try:
        forkserver.ensure_running()
    finally:
        os.environ.pop("PYTHONSAFEPATH", None)
        os.environ.pop(SAFE_PATH_MARK, None)


def start_early() -> None:
    """Start the fork server now rather than at the first claimer's start, so that its
    imports overlap the supervisor's (call it after PROMETHEUS_MULTIPROC_DIR is set: the
    server's prometheus_client reads it at import, and the server keeps this
    environment for every claimer it forks)."""
    claimer_context()
    _start_server()
