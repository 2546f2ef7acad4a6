"""One CLI call builds its settings once and checks the DSN's form no more than it must.

`pgworker enqueue --app file.py:app` used to build the settings twice (the App's module
read the environment, then the CLI replaced them with its flags even when none was given,
validating every field again and dropping the App's pool) and checked the DSN four
times (the App, its configure, the pool opener, the pool's probe connection). Now: one
Settings built, and two checks: the App's at construction (a malformed DSN fails there)
and db.connect's when the first connection opens.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pgworker import cli, config, db

TYPED_APP = "tests/apps/typed_app.py:app"


@pytest.fixture
def counted(app, monkeypatch):
    """The CLI's environment pointing at the test's migrated schema; then the counters."""
    monkeypatch.setenv("PGWORKER_DSN", app.settings.dsn)
    monkeypatch.setenv("PGWORKER_SCHEMA", app.settings.schema)
    monkeypatch.chdir(Path(__file__).parents[2])  # the --app path is the repository's
    # --app loads the file once per process (pgworker.loader keeps it in sys.modules): an
    # earlier test's load would hand this call an App built from another environment
    monkeypatch.delitem(sys.modules, "pgworker_app_typed_app", raising=False)
    counts = {"settings": 0, "check_dsn": 0}
    post_init, check_dsn = config.Settings.__post_init__, db.check_dsn

    def counting_post_init(self):  # every Settings built (from_env, replace) passes here
        counts["settings"] += 1
        post_init(self)

    def counting_check_dsn(dsn):
        counts["check_dsn"] += 1
        return check_dsn(dsn)

    monkeypatch.setattr(config.Settings, "__post_init__", counting_post_init)
    monkeypatch.setattr(db, "check_dsn", counting_check_dsn)  # the one function every caller reaches through db
    return counts


def test_cli_enqueue_with_an_app_builds_settings_once(counted, capsys):
    assert cli.main(["enqueue", "anything.at.all", "--payload", "{}", "--any-task", "--app", TYPED_APP]) == 0
    assert capsys.readouterr().out.strip().isdigit()
    assert counted == {"settings": 1, "check_dsn": 2}


def test_cli_enqueue_without_an_app_builds_settings_once(counted, capsys):
    assert cli.main(["enqueue", "anything.at.all", "--payload", "{}", "--any-task"]) == 0
    assert capsys.readouterr().out.strip().isdigit()
    assert counted == {"settings": 1, "check_dsn": 2}
