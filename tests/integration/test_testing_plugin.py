"""The pytest plugin (pgworker.testing.plugin) as users meet it: its fixtures, and the
errors they give first (no DSN, an ini option that names no App), in pytest runs of their
own that load the plugin from the installed entry point. And docs/testing.md, which
cannot rot: its example files run the same way, exactly as a user would copy them, and
its sample failure message is compared with the real one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from pgworker.testing import assert_enqueued, drain

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
BLOCK = re.compile(r"<!-- (example|example-alternative): (\S+) -->\n```\w*\n(.*?)```", re.S)


@pytest.fixture(scope="session")
def pgworker_dsn(pg_dsn):
    """The plugin's fixtures on the suite's own server (the plugin alone reads the environment)."""
    return pg_dsn


def doc_files(*kinds: str) -> dict[str, str]:
    """The files of docs/testing.md's example blocks of these kinds, by file name."""
    files = {name: body for kind, name, body in BLOCK.findall(DOC.read_text()) if kind in kinds}
    assert files, f"no {kinds} blocks in {DOC}"
    return files


def run_pytest(folder: Path, env_dsn: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PGWORKER_DSN", "PGWORKER_SCHEMA", "PGWORKER_TEST_DSN",
                        "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    if env_dsn is not None:
        env["PGWORKER_TEST_DSN"] = env_dsn
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=240)


def write(folder: Path, files: dict[str, str]) -> None:
    for name, body in files.items():
        (folder / name).write_text(body)


def schemas_left(pg_dsn) -> int:
    with psycopg.connect(pg_dsn) as c:
        return c.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'pgworker\\_test\\_%'").fetchone()[0]


# -- the fixtures, in this process ------------------------------------------------------


def test_plugin_fixtures_give_a_migrated_schema_and_an_app_on_it(pgworker_app, pgworker_schema, pgworker_dsn):
    assert pgworker_app.settings.schema == pgworker_schema and pgworker_app.settings.dsn == pgworker_dsn
    assert pgworker_app.check_schema() >= 1

    @pgworker_app.task(name="ping")
    def ping(payload):
        pass

    ping.enqueue({})
    assert drain(pgworker_app).succeeded == 1


USER_APP = """
import pgworker

app = pgworker.App()  # no PGWORKER_DSN in this run: the fixture supplies the database


@app.task(name="signup")
def signup(payload):
    app.enqueue("welcome", {"user": payload["user"]})  # through the module-level App


@app.task(name="welcome")
def welcome(payload):
    pass
"""

USER_TESTS = """
import myapp
from pgworker.testing import assert_enqueued, drain

seen = []


def test_first(pgworker_app):
    assert pgworker_app is myapp.app and pgworker_app.settings.schema.startswith("pgworker_test_")
    myapp.signup.enqueue({"user": 1})
    assert drain(pgworker_app).succeeded == 2
    assert_enqueued(pgworker_app, "welcome", {"user": 1}, state="succeeded")
    seen.append(pgworker_app.settings.schema)


def test_second_gets_a_fresh_schema(pgworker_app):
    assert pgworker_app.settings.schema != seen[0]
    assert pgworker_app.list_jobs() == []


def test_after_the_fixture_the_app_is_restored():
    assert myapp.app.settings.schema == "pgworker" and myapp.app.settings.dsn is None
"""


def test_the_ini_option_binds_the_users_app_for_each_test(tmp_path, pg_dsn):
    write(tmp_path, {"pytest.ini": "[pytest]\npgworker_app = myapp:app\n", "myapp.py": USER_APP,
                     "test_user.py": USER_TESTS})
    before = schemas_left(pg_dsn)
    run = run_pytest(tmp_path, pg_dsn)
    assert run.returncode == 0 and "3 passed" in run.stdout, run.stdout + run.stderr
    assert schemas_left(pg_dsn) == before  # each test's schema was dropped


# -- what a user meets first -------------------------------------------------------------


def test_without_a_dsn_the_fixtures_name_PGWORKER_TEST_DSN(tmp_path):
    write(tmp_path, {"pytest.ini": "[pytest]\n",
                     "test_needs_db.py": "def test_it(pgworker_app):\n    pass\n"})
    run = run_pytest(tmp_path, None)
    assert run.returncode == 1 and "1 error" in run.stdout, run.stdout + run.stderr
    # Once in the error's own section, without a traceback. The short summary at the end
    # repeats the message as far as the terminal is wide (all of it when COLUMNS is large,
    # as on CI), so it is left out of the count.
    errors_section = run.stdout.split("short test summary info")[0]
    assert errors_section.count("set PGWORKER_TEST_DSN (or PGWORKER_DSN)") == 1, run.stdout
    assert "Traceback" not in run.stdout and "raise ConfigError" not in run.stdout, run.stdout


def test_an_ini_option_naming_no_app_says_so(tmp_path, pg_dsn):
    write(tmp_path, {"pytest.ini": "[pytest]\npgworker_app = no_such_module:app\n",
                     "test_it.py": "def test_it(pgworker_app):\n    pass\n"})
    run = run_pytest(tmp_path, pg_dsn)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "the ini option pgworker_app = 'no_such_module:app' does not name a pgworker.App" in run.stdout
    assert "cannot import 'no_such_module'" in run.stdout


# -- docs/testing.md ----------------------------------------------------------------------


def test_the_documented_example_passes_as_written(tmp_path, pg_dsn):
    files = doc_files("example")
    assert set(files) == {"shop.py", "pytest.ini", "test_shop.py"}
    write(tmp_path, files)
    before = schemas_left(pg_dsn)
    run = run_pytest(tmp_path, pg_dsn)
    assert run.returncode == 0 and "4 passed" in run.stdout, run.stdout + run.stderr
    assert schemas_left(pg_dsn) == before  # each test's schema was dropped


def test_the_documented_conftest_alternative_passes(tmp_path, pg_dsn):
    files = {**doc_files("example"), **doc_files("example-alternative")}
    files["pytest.ini"] = "[pytest]\n"  # no pgworker_app option: the conftest binds the App
    write(tmp_path, files)
    run = run_pytest(tmp_path, pg_dsn)
    assert run.returncode == 0 and "4 passed" in run.stdout, run.stdout + run.stderr


def test_the_documented_failure_message_is_the_real_one(app):
    documented = re.search(r"```\nAssertionError: (.*?)\n```", DOC.read_text(), re.S).group(1)
    app.enqueue("send_email", {"to": "b@example.com", "extra": 1}, queue="emails")
    app.enqueue("send_email", {"to": "a@example.com"}, queue="default")
    app.enqueue("report", {})
    with pytest.raises(AssertionError) as caught:
        assert_enqueued(app, "send_email", {"to": "a@example.com"}, queue="emails")
    assert str(caught.value) == documented
