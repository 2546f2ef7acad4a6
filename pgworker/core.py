"""What every call on jobs needs, in one object the modules take instead of the App: the
settings, the store (the named statements of the schema), the task registry, the error
classifier, the client connection pool and the process's metrics.

The App (:mod:`pgworker.app`) owns one :class:`Core` and is a façade over the modules
that take it: :mod:`pgworker.producer` (enqueue), :mod:`pgworker.lifecycle` (claim and
settle), :mod:`pgworker.operations` (operator actions and reads), :mod:`pgworker.results`,
:mod:`pgworker.graphs` and :mod:`pgworker.aio`. None of them imports the App, so the
import graph has the App on top and nothing pointing back at it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import TYPE_CHECKING, Any, Iterator

import psycopg

from . import connections, db
from .config import Settings
from .jobspec import Preparer
from .retry import Classifier
from .store import Store

if TYPE_CHECKING:
    from .metrics import WorkerMetrics
    from .tasks import Task


class Core:
    """The state behind an App. ``tasks`` is the App's registry itself (a task registered
    later is seen); ``settings`` are checked once here (the DSN's form: :class:`ConfigError`)
    and replaced only through :meth:`configure`."""

    def __init__(self, settings: Settings, *, name: str, tasks: "dict[str, Task[Any]]",
                 classify_error: Classifier | None) -> None:
        if settings.dsn is not None:
            db.check_dsn(settings.dsn)
        self.name = name
        self.tasks = tasks
        self.classify_error = classify_error
        self._pool: Any = None
        self._metrics: "WorkerMetrics | None" = None
        self._use(settings)

    def _use(self, settings: Settings) -> None:
        self.settings = settings
        self.store = Store(settings.schema, error_history_entries=settings.error_history_entries)
        self.prepared = Preparer(self.tasks, settings.max_payload_bytes)

    def configure(self, settings: Settings) -> None:
        """Replace the settings: the pool (opened with the old ones) is closed, the store and
        the job checks are rebuilt. A DSN already checked is not checked again."""
        if settings.dsn is not None and settings.dsn != self.settings.dsn:
            db.check_dsn(settings.dsn)
        self.close()
        self._use(settings)

    # -- connections ----------------------------------------------------------------

    def connect(self, *, application_name: str = "pgworker", autocommit: bool = True) -> psycopg.Connection:
        """A new connection to the database (the caller closes it)."""
        return db.connect(self.settings.dsn, application_name=application_name, autocommit=autocommit,
                          prepare=self.settings.prepared_statements)

    @contextlib.contextmanager
    def connection(self, conn: psycopg.Connection | None = None) -> Iterator[psycopg.Connection]:
        """``conn`` if given (the caller's transaction), else a pooled autocommit connection
        (the pool opened at the first use); database failures become pgworker's errors."""
        connections.require_sync(conn, None)
        with connections.database_errors(self.settings):
            if conn is not None:
                yield conn
                return
            if self._pool is None:
                self._pool = connections.open_pool(self.settings, self.name)
            with connections.borrow(self._pool) as pooled:
                yield pooled

    def close(self) -> None:
        """Close the connection pool (safe to call twice)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # -- what several modules ask -----------------------------------------------------

    @property
    def metrics(self) -> "WorkerMetrics":
        """The process's metrics (created at the first use)."""
        if self._metrics is None:
            # here, not at the top: prometheus_client's set-up runs only in a process that counts
            from .metrics import process_metrics

            self._metrics = process_metrics(task_label=self.settings.metrics_task_label)
        return self._metrics

    def worker_id(self, suffix: str = "") -> str:
        """``worker_id`` setting, else host:pid; ``suffix`` appended after a colon."""
        base = self.settings.worker_id or f"{socket.gethostname()}:{os.getpid()}"
        return f"{base}{':' + suffix if suffix else ''}"

    def queues(self) -> tuple[str, ...]:
        """The configured queues, else those of the registered tasks (and 'default')."""
        if self.settings.queues:
            return self.settings.queues
        return tuple(sorted({"default", *(t.queue for t in self.tasks.values())}))
