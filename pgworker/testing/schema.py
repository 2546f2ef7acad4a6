"""Throwaway schemas for tests, and pointing your own App at one (``bind``)."""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
from typing import Any, Iterator, Mapping

from ..db import connect
from ..errors import ConfigError
from ..migrate import drop_schema, migrate
from ..names import check_schema_name

DSN_VARIABLES = ("PGWORKER_TEST_DSN", "PGWORKER_DSN")
SCHEMA_PREFIX = "pgworker_test"
_counter = itertools.count()


def dsn_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The database for tests: ``PGWORKER_TEST_DSN``, else ``PGWORKER_DSN``.

    Raises :class:`pgworker.ConfigError` naming both variables when neither is set.
    """
    environ = os.environ if environ is None else environ
    for name in DSN_VARIABLES:
        if environ.get(name):
            return environ[name]
    raise ConfigError("no database for pgworker's test helpers: set PGWORKER_TEST_DSN (or PGWORKER_DSN) to a "
                      "PostgreSQL the tests may create schemas in, such as "
                      "postgresql://postgres@127.0.0.1:5432/test")


def new_schema_name(prefix: str = SCHEMA_PREFIX) -> str:
    """A schema name no other test run uses: ``<prefix>_<pid>_<n>_<6 hex digits>``."""
    return check_schema_name(f"{prefix}_{os.getpid()}_{next(_counter)}_{secrets.token_hex(3)}")


@contextlib.contextmanager
def throwaway_schema(dsn: str | None = None, *, prefix: str = SCHEMA_PREFIX) -> Iterator[str]:
    """Create a uniquely named schema on ``dsn`` (default :func:`dsn_from_env`), migrate it
    to this pgworker's version, yield its name, and drop it (CASCADE) afterwards.

    The role needs CREATE on the database. Raises :class:`pgworker.ConfigError` without a
    DSN, :class:`pgworker.DatabaseUnavailable` when the server cannot be reached.
    """
    dsn = dsn or dsn_from_env()
    name = new_schema_name(prefix)
    with contextlib.closing(connect(dsn, application_name="pgworker:testing")) as conn:
        migrate(conn, name)
    try:
        yield name
    finally:
        with contextlib.closing(connect(dsn, application_name="pgworker:testing")) as conn:
            drop_schema(conn, name)


@contextlib.contextmanager
def bind(app: Any, schema: str, *, dsn: str | None = None) -> Iterator[Any]:
    """Point ``app`` itself at ``schema`` (on ``dsn``) inside the block; restore it after.

    ``app`` is your own :class:`pgworker.App`, usually a module-level ``app =
    pgworker.App()`` with its tasks. It is changed in place rather than copied because
    that is the object your code uses: handlers and request code call ``app.enqueue``
    or ``some_task.enqueue`` (which goes to the App the task was registered on), so a
    copy would leave their jobs in the real schema. Inside the block every enqueue,
    :func:`~pgworker.testing.drain` and assertion uses the test schema; on exit the App's
    pool is closed and its previous settings come back (even after an exception).

    ``dsn``: default ``PGWORKER_TEST_DSN``, else the App's own DSN. The other settings
    (queues, lease, limits) stay as they are. Yields ``app``. Raises
    :class:`pgworker.ConfigError` for an invalid schema name or when there is no DSN.
    Not thread-safe: bind an App in one test at a time (pytest-xdist runs each worker in
    its own process, which is fine).
    """
    from ..app import App

    if not isinstance(app, App):
        raise TypeError(f"bind() takes a pgworker.App, got {type(app).__name__}")
    check_schema_name(schema)
    dsn = dsn or os.environ.get("PGWORKER_TEST_DSN") or app.settings.dsn
    if not dsn:
        raise ConfigError("bind() needs a database: pass dsn=, or set PGWORKER_TEST_DSN (or PGWORKER_DSN)")
    previous = app.settings
    app.configure(previous.replace(dsn=dsn, schema=schema))
    try:
        yield app
    finally:
        app.configure(previous)  # closes the pool on the test schema first
