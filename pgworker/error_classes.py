"""The budget of the ``error_class`` label: the first ``catalogue.ERROR_CLASS_TOP_N``
handler error classes are exported as themselves, any later one as ``other``, so a
handler raising ever new classes cannot make ever new series. pgworker's own codes
(``catalogue.KNOWN_ERROR_CODES``) never count against it.

Under ``pgworker run`` the budget is the pod's, not a process's (a pod exported 29
classes with a cap of 20, and every recycled claimer started a budget of its own): the
classes admitted so far are one file in the pod's multiprocess directory,
``PROMETHEUS_MULTIPROC_DIR/error_classes`` (one JSON string a line; not a ``.db``
file, so no scrape reads it), which every process of the pod (the supervisor, each
claimer, each replacement) reads and appends to under an exclusive ``flock``. The kernel
releases that lock when its holder dies, even by ``kill -9``: no peer can be wedged by
it (a multiprocessing lock held by a killed process stays taken). ``pgworker run`` starts
each run with the file gone, as it starts with the metric files gone.

Each process remembers what it learned: a class admitted stays admitted, and a class
refused stays refused, since the budget only fills; so a class costs at most one read of
the file per process, and its steady-state cost is a set lookup. Outside multiprocess
mode (a web process that enqueues) the budget is the process's own.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from typing import Iterable

BUDGET_FILE = "error_classes"


class ErrorClassBudget:
    """``label(code)``: ``code`` while it is among the first ``limit`` classes (of the pod
    when ``directory`` is given, else of this process), else ``other``. ``always`` are
    codes exported as themselves without counting."""

    def __init__(self, limit: int, always: Iterable[str], other: str, directory: str | None = None) -> None:
        self.limit = limit
        self.other = other
        self.path = os.path.join(directory, BUDGET_FILE) if directory else None
        self._admitted: set[str] = set(always)
        self._always = len(self._admitted)
        self._refused: set[str] = set()
        self._lock = threading.Lock()

    def label(self, code: str) -> str:
        if code in self._admitted:
            return code
        if code in self._refused:
            return self.other
        with self._lock:
            if code in self._admitted:
                return code
            if code in self._refused:
                return self.other
            try:
                admitted = self._admit_in_pod(code) if self.path else self._admit_here(code)
            except OSError:  # the directory went away: this process's budget, not a failing metric
                admitted = self._admit_here(code)
            (self._admitted if admitted else self._refused).add(code)
        return code if admitted else self.other

    def _admit_here(self, code: str) -> bool:
        return len(self._admitted) - self._always < self.limit

    def _admit_in_pod(self, code: str) -> bool:
        """Read the pod's admitted classes and append ``code`` while there is room, under
        the file's exclusive lock."""
        assert self.path is not None
        with open(self.path, "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, or its process dies
            f.seek(0)
            data = f.read()
            pod = set()
            for line in data.splitlines():
                try:
                    pod.add(json.loads(line))
                except ValueError:  # a line its writer was killed writing: that class was never exported
                    continue
            if code in pod:
                return True
            if len(pod) >= self.limit:
                return False
            torn = bool(data) and not data.endswith(b"\n")
            f.write((b"\n" if torn else b"") + json.dumps(code).encode() + b"\n")
            f.flush()
            return True


def clear(directory: str) -> None:
    """Forget the pod's budget (a new run, with new series)."""
    try:
        os.unlink(os.path.join(directory, BUDGET_FILE))
    except FileNotFoundError:
        pass
