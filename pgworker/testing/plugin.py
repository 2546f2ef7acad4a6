"""The pytest plugin: fixtures for a migrated throwaway schema and an App bound to it.

Installed with pgworker and loaded by pytest on its own (entry point ``pgworker`` in
``pytest11``): nothing to add to a conftest. ``-p no:pgworker`` turns it off; with
``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` load it with ``-p pgworker.testing.plugin``.

Fixtures (all named ``pgworker_*``, so they cannot clash with a project's own):

- ``pgworker_dsn`` (session): ``PGWORKER_TEST_DSN``, else ``PGWORKER_DSN``; a test
  that uses it without either set errors with a message naming them.
- ``pgworker_schema``: a freshly created and migrated schema, dropped after the test.
- ``pgworker_app``: the App named by the ini option ``pgworker_app``
  (``module:attribute``, as ``pgworker run --app`` takes it), bound to
  ``pgworker_schema`` for the test (:func:`pgworker.testing.bind`); without the option,
  a new empty App on that schema. Override it in a conftest to bind your App yourself.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from ..errors import ConfigError
from .schema import bind, dsn_from_env, throwaway_schema

INI_APP = "pgworker_app"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(INI_APP, "module:attribute of the pgworker.App that the pgworker_app fixture binds to a "
                           "throwaway schema for each test (as `pgworker run --app` takes it)", default="")


@pytest.fixture(scope="session")
def pgworker_dsn() -> str:
    """The test database: ``PGWORKER_TEST_DSN``, else ``PGWORKER_DSN``."""
    try:
        return dsn_from_env()
    except ConfigError as exc:
        problem = str(exc)
    pytest.fail(problem, pytrace=False)  # outside the except: the message is shown once


@pytest.fixture
def pgworker_schema(pgworker_dsn: str) -> Iterator[str]:
    """The name of a new, migrated schema on ``pgworker_dsn``, dropped after the test."""
    with throwaway_schema(pgworker_dsn) as name:
        yield name


@pytest.fixture
def pgworker_app(request: pytest.FixtureRequest, pgworker_dsn: str, pgworker_schema: str) -> Iterator[Any]:
    """Your App (ini ``pgworker_app = package.module:app``) bound to ``pgworker_schema`` for
    this test; without that option, a new :class:`pgworker.App` with no tasks on it."""
    from ..app import App
    from ..loader import load_app

    ref = request.config.getini(INI_APP)
    if not ref:
        app = App(pgworker_dsn, schema=pgworker_schema)
        try:
            yield app
        finally:
            app.close()
        return
    try:
        target = load_app(ref)
    except ConfigError as exc:
        problem = f"the ini option {INI_APP} = {ref!r} does not name a pgworker.App: {exc}"
    else:
        problem = ""
    if problem:
        pytest.fail(problem, pytrace=False)
    with bind(target, pgworker_schema, dsn=pgworker_dsn) as app:
        yield app
