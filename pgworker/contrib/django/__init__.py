"""pgworker in a Django project: add ``"pgworker.contrib.django"`` to ``INSTALLED_APPS``.

Jobs then live in the database of ``DATABASES[PGWORKER["DATABASE"]]`` (default
``"default"``, which must use Django's psycopg (3) backend,
``django.db.backends.postgresql`` with psycopg installed), in the schema
``PGWORKER["SCHEMA"]`` (default ``"pgworker"``). ``PGWORKER["APP"]``: the App holding
your tasks (``"myproject.tasks:app"``), for the worker and for enqueues that should check
task names; without it, :func:`get_app` is a pure producer App.

Enqueue inside ``transaction.atomic()`` on Django's own connection: the job commits or
rolls back with the view's writes::

    from pgworker.contrib import django as pgworker_django

    with transaction.atomic():
        order = Order.objects.create(item="book")
        pgworker_django.enqueue("ship_order", {"order": order.pk})

``manage.py pgworker migrate|run|status|...`` runs the ``pgworker`` command with the DSN
and schema from those settings (see :mod:`.management.commands.pgworker`).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Unpack

import psycopg

import pgworker
from pgworker.enqueue_options import JobOptions, OnConflict

_lock = threading.Lock()
#: How long a claimer waits, around each job, for the async ORM's thread to close its stale
#: connections (it may be busy with a timed-out handler's blocking call).
ORM_THREAD_WAIT_SECONDS = 5.0
# The code of an attempt whose handler left a Django connection inside a transaction.
TRANSACTION_LEFT_OPEN = "TRANSACTION_LEFT_OPEN"
_apps: dict[tuple[str, str, str | None], pgworker.App] = {}


def _settings() -> tuple[str, str, str | None]:
    from django.conf import settings

    conf = getattr(settings, "PGWORKER", {}) or {}
    return conf.get("DATABASE", "default"), conf.get("SCHEMA", "pgworker"), conf.get("APP")


def dsn(using: str | None = None) -> str:
    """A libpq connection string for the Django database ``using`` (default: the
    ``PGWORKER["DATABASE"]`` alias), from its NAME, USER, PASSWORD, HOST, PORT and OPTIONS."""
    from django.db import connections

    db = connections[using or _settings()[0]].settings_dict
    parts: dict[str, Any] = {"dbname": db.get("NAME"), "user": db.get("USER"), "password": db.get("PASSWORD"),
                             "host": db.get("HOST"), "port": db.get("PORT")}
    options = dict(db.get("OPTIONS") or {})
    for key in ("pool", "server_side_binding", "isolation_level", "assume_role", "cursor_factory"):
        options.pop(key, None)  # Django's own options, not libpq's
    parts.update(options)
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in parts.items() if v not in (None, "")})


def get_app() -> pgworker.App:
    """The process's App for the configured database and schema: ``PGWORKER["APP"]``
    loaded (and pointed at that database), or a pure producer App. Built once."""
    alias, schema, app_ref = _settings()
    key = (alias, schema, app_ref)
    with _lock:
        app = _apps.get(key)
        if app is None:
            settings = pgworker.Settings.from_env(dsn=dsn(alias), schema=schema)
            if app_ref:
                from pgworker.loader import load_app

                app = load_app(app_ref)
                app.configure(settings)
            else:
                app = pgworker.App(settings=settings)
            _apps[key] = app
    return app


def setup_worker_process() -> Callable[[], None]:
    """In a claimer process started by ``manage.py pgworker run``: ``django.setup()``
    (the settings from ``DJANGO_SETTINGS_MODULE``, inherited from manage.py), before the
    app's modules import models; returns what the claimer runs before and after each job:
    ``django.db.close_old_connections`` (a worker has no request whose end closes a
    connection that broke, after a PostgreSQL restart say, or outlived ``CONN_MAX_AGE``),
    in the handler's thread and in the thread where async handlers' ORM calls run.

    A connection the handler left inside a transaction (an ``atomic()`` block entered and
    never exited, ``set_autocommit(False)``) is closed, which rolls that transaction back,
    and the hook raises :class:`pgworker.Permanent` (``TRANSACTION_LEFT_OPEN``, naming the
    database alias): the attempt that would have succeeded goes dead, since its writes are
    gone, and the next job gets a fresh connection (it once failed every later ORM call)."""
    import django
    from django.db import close_old_connections

    django.setup()
    try:  # where an async handler's ORM calls run (sync_to_async, thread-sensitive): its own connection
        from asgiref.sync import SyncToAsync

        orm_thread = getattr(SyncToAsync, "single_thread_executor", None)
    except ImportError:  # pragma: no cover - asgiref is one of Django's own dependencies
        orm_thread = None

    def tidy() -> list[str]:
        left_open = _close_open_transactions()
        close_old_connections()
        return left_open

    def around_job() -> None:
        left_open = tidy()
        # that thread's connection too (a trial: after it broke, every later async job failed),
        # once the thread exists (ThreadPoolExecutor starts it at its first task)
        if orm_thread is not None and getattr(orm_thread, "_threads", True):
            # bounded: that thread may still run a timed-out handler's blocking ORM call
            # (the claimer's hook logs the timeout and goes on; the close runs after it)
            left_open += orm_thread.submit(tidy).result(timeout=ORM_THREAD_WAIT_SECONDS)
        if left_open:
            raise pgworker.Permanent(
                f"the handler left Django's connection {', '.join(map(repr, sorted(set(left_open))))} inside a "
                "transaction (an atomic() block entered and not exited, or autocommit turned off): its "
                "uncommitted writes were rolled back; use `with transaction.atomic():` so the block always ends",
                code=TRANSACTION_LEFT_OPEN)

    return around_job


def _close_open_transactions() -> list[str]:
    """Close this thread's Django connections that are inside a transaction (rolling it
    back) so the next use reconnects in a clean state; their aliases. Django's close()
    alone keeps a connection closed inside an atomic block "in transaction" for good."""
    from django.db import connections

    left_open = []
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        if conn.in_atomic_block or conn.closed_in_transaction or (not conn.autocommit and _in_transaction(conn)):
            left_open.append(conn.alias)
            # close() then drops the connection (the next connect() resets the rest)
            conn.in_atomic_block = conn.closed_in_transaction = False
            conn.close()
    return left_open


def _in_transaction(conn: Any) -> bool:
    """Whether a Django connection with autocommit off is inside a transaction now (a
    handler may turn autocommit off and commit by hand, Django's documented pattern: a
    break-it trial saw that reported as left open; Django's own close_old_connections
    then replaces the connection, whose autocommit differs from the settings)."""
    raw = conn.connection
    status = getattr(getattr(raw, "info", None), "transaction_status", None)  # psycopg 3
    if status is None and hasattr(raw, "get_transaction_status"):  # psycopg2
        status = raw.get_transaction_status()
    if status is None:
        return bool(getattr(raw, "in_transaction", False))  # sqlite3, say
    return int(status) in (2, 3)  # INTRANS, INERROR in both psycopg versions


def connection(using: str | None = None) -> psycopg.Connection:
    """The psycopg connection under Django's connection ``using`` (opened if need be):
    pass it as ``conn=`` to join the current ``transaction.atomic()`` block. Raises
    TypeError when the backend is not psycopg 3."""
    from django.db import connections

    django_conn = connections[using or _settings()[0]]
    django_conn.ensure_connection()
    raw = django_conn.connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError(f"Django's connection {django_conn.alias!r} is a {type(raw).__module__}."
                        f"{type(raw).__name__}; pgworker needs the psycopg (3) backend: pip install psycopg "
                        "(Django picks it over psycopg2 when both are installed)")
    return raw


def enqueue(task: "str | pgworker.Task", payload: Any = None, *, using: str | None = None,
            **options: Unpack[JobOptions]) -> int:
    """:meth:`pgworker.App.enqueue` on Django's connection ``using``: inside
    ``transaction.atomic()`` the job commits or rolls back with it; outside, it commits at
    once (Django's autocommit). Returns the job id. From an async view, wrap it as Django
    says of every database call: ``await sync_to_async(enqueue)(...)`` (asgiref)."""
    with _django_hints():
        return get_app().enqueue(task, payload, conn=connection(using), **options)


def enqueue_many(jobs: Any, *, using: str | None = None, any_task: bool = False,
                 on_conflict: OnConflict = "return") -> list[int]:
    """:meth:`pgworker.App.enqueue_many` on Django's connection ``using``."""
    with _django_hints():
        return get_app().enqueue_many(jobs, conn=connection(using), any_task=any_task, on_conflict=on_conflict)


@contextlib.contextmanager
def _django_hints() -> Iterator[None]:
    """A missing schema's error says where a Django project sets it and how it migrates
    (its message speaks of --schema and `pgworker migrate`, the command line's terms)."""
    try:
        yield
    except pgworker.SchemaNotMigrated as exc:
        exc.add_note(f"In this Django project the schema is PGWORKER['SCHEMA'] in the settings "
                     f"({_settings()[1]!r}): run `python manage.py pgworker migrate`")
        raise
