"""Fixtures of the console's tests: a real `pgworker web` (console_server.py) and a real
headless Chromium (browser.py). A missing browser skips the browser tests with the
reason, except in CI (PGWORKER_STRICT=1), where it fails them."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import browser as browser_mod  # noqa: E402
from console_server import ADMIN_TOKENS, ConsoleServer  # noqa: E402

DOC_SHOTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "web")


@pytest.fixture
def browser():
    why = browser_mod.missing()
    if why:
        if os.environ.get("PGWORKER_STRICT") == "1":
            pytest.fail(f"no browser for the console's tests: {why}")
        pytest.skip(f"no browser for the console's tests: {why}")
    driver = browser_mod.start()
    yield driver
    driver.quit()


@pytest.fixture
def console(app, pg_dsn):
    """A real `pgworker web` on the test's schema with one admin bearer token
    (console_server.ADMIN_AUTH); a test file needing other credentials or limits defines
    its own ``console``."""
    with ConsoleServer(pg_dsn, app.settings.schema, env={"PGWORKER_WEB_TOKENS": ADMIN_TOKENS}) as server:
        yield server


@pytest.fixture
def web_dir(tmp_path):
    """$WEB_TEST_DIR of tests/apps/web_app.py (its 'heal' file)."""
    return str(tmp_path)
