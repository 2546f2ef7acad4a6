"""Imported by the claimers' fork server (:mod:`pgworker.worker.forkserver`): the modules
a claimer process uses, loaded once for every claimer forked from the server; and, in
the server only, SIGTERM and SIGHUP ignored (see that module for why; a claimer restores
SIGTERM's default as it starts, :func:`.process.claimer_main`, and keeps ignoring SIGHUP,
as it ignores SIGINT: the supervisor stops the pod on either)."""

from __future__ import annotations

import os
import signal
import sys

import prometheus_client  # noqa: F401 - loaded for the claimers (reads PROMETHEUS_MULTIPROC_DIR)

from ... import error_classes, loader, logs, metrics  # noqa: F401 - loaded for the claimers
from ..forkserver import SAFE_PATH_MARK
from . import process  # noqa: F401 - the claimer's own modules, psycopg and OpenTelemetry's API with them

# The server's command line is multiprocessing's `-c "from multiprocessing.forkserver
# import main; ..."`: anywhere else (a tool importing every module) this changes nothing.
if any("multiprocessing.forkserver import main" in arg for arg in sys.orig_argv):
    if os.environ.pop(SAFE_PATH_MARK, None):
        os.environ.pop("PYTHONSAFEPATH", None)  # the server's start only, not the claimers' children
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a terminal's hangup reaches the group: the supervisor decides
