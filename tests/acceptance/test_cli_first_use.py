"""What a new user tripped over on the command line (issue 13), run as a user would: the
real `pgworker` CLI in a subprocess, against the real PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.acceptance

TASKS_MODULE = '''
import pgworker

app = pgworker.App()


@app.task(name="greet", queue="greetings", max_attempts=3)
def greet(payload):
    print("GREETED AT LOAD TIME")


@app.task(name="send_email", queue="emails")
def send_email(payload):
    pass


def create_app():
    return app


def helper():
    print("HELPER CALLED AT LOAD TIME")
'''


def cli(dsn, schema, *args, cwd=None, env=None):
    e = dict(os.environ, PGWORKER_DSN=dsn, PGWORKER_SCHEMA=schema, **(env or {}))
    e.pop("PGWORKER_APP", None)
    e.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-m", "pgworker.cli", *args], env=e, capture_output=True,
                          text=True, timeout=120, cwd=cwd)


@pytest.fixture
def project(tmp_path):
    """A user's project folder with `myproj/tasks.py` (an App with two tasks)."""
    (tmp_path / "myproj").mkdir()
    (tmp_path / "myproj" / "__init__.py").write_text("")
    (tmp_path / "myproj" / "tasks.py").write_text(TASKS_MODULE)
    return tmp_path


# -- item 4: --app names something that is not the App ----------------------------------


@pytest.mark.parametrize("ref, fragments", [
    ("myproj.tasks:greet", ["is the pgworker Task 'greet', not an App", "--app myproj.tasks:app"]),
    ("myproj/tasks.py:greet", ["is the pgworker Task 'greet', not an App", "--app myproj/tasks.py:app"]),
    ("myproj.tasks:helper", ["is a function, not a pgworker.App", "--app myproj.tasks:app",
                             "--app myproj.tasks:helper()"]),
    ("pgworker:App", ["is a class, not a pgworker.App"]),
    ("myproj.tasks:greet()", ["'()' calls an App factory, but this is a pgworker Task"]),
])
def test_app_that_is_not_an_app_is_refused_without_running_it(app, pg_dsn, project, ref, fragments):
    proc = cli(pg_dsn, app.settings.schema, "status", "--app", ref, cwd=project)
    assert proc.returncode == 1, proc.stderr
    assert "AT LOAD TIME" not in proc.stdout + proc.stderr  # nothing of the user's was called
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr


def test_an_app_factory_is_called_when_the_reference_says_so(app, pg_dsn, project):
    proc = cli(pg_dsn, app.settings.schema, "schedules", "--app", "myproj.tasks:create_app()", "--json",
               cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


# -- item 8: a missing dependency inside the user's module ------------------------------


@pytest.mark.parametrize("ref", ["myproj.tasks:app", "myproj/tasks.py:app"])
def test_a_missing_dependency_of_the_app_module_is_named(app, pg_dsn, project, ref):
    tasks = project / "myproj" / "tasks.py"
    tasks.write_text("import json\nimport no_such_dependency_xyz  # the user forgot to install it\n"
                     + tasks.read_text())
    proc = cli(pg_dsn, app.settings.schema, "status", "--app", ref, cwd=project)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "imports 'no_such_dependency_xyz'" in proc.stderr
    assert f"{tasks}:2" in proc.stderr  # where the import is
    assert "install the package that provides it" in proc.stderr
    assert "PYTHONPATH" not in proc.stderr  # the path is fine: the hint would mislead


def test_a_missing_app_module_still_points_at_the_path(app, pg_dsn, project):
    proc = cli(pg_dsn, app.settings.schema, "status", "--app", "myproj.nosuch:app", cwd=project)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "cannot import 'myproj.nosuch'" in proc.stderr and "PYTHONPATH" in proc.stderr


# -- item 5: a task name the App could have caught ----------------------------------------


def test_enqueue_with_an_app_refuses_a_typo_with_the_closest_names(app, pg_dsn, project):
    schema = app.settings.schema
    typo = cli(pg_dsn, schema, "enqueue", "greeet", "--app", "myproj.tasks:app", cwd=project)
    assert typo.returncode == 1 and "Traceback" not in typo.stderr
    assert "task 'greeet' is not registered on this App (did you mean 'greet'?)" in typo.stderr
    assert "--any-task" in typo.stderr
    assert app.list_jobs() == []
    ok = cli(pg_dsn, schema, "enqueue", "greet", "--app", "myproj.tasks:app", "--json", cwd=project)
    assert ok.returncode == 0 and ok.stderr == ""  # the task's own queue and attempts: nothing to note
    on_purpose = cli(pg_dsn, schema, "enqueue", "billing.charge", "--any-task", "--app", "myproj.tasks:app",
                     cwd=project)
    assert on_purpose.returncode == 0, on_purpose.stderr
    assert "--app does not register 'billing.charge'" in on_purpose.stderr
    jobs = {j["task"]: j for j in app.list_jobs()}
    assert (jobs["greet"]["queue"], jobs["greet"]["max_attempts"]) == ("greetings", 3)
    assert (jobs["billing.charge"]["queue"], jobs["billing.charge"]["max_attempts"]) == ("default", 5)


def test_enqueue_without_an_app_says_which_defaults_it_used(app, pg_dsn):
    schema = app.settings.schema
    plain = cli(pg_dsn, schema, "enqueue", "greet")
    assert plain.returncode == 0
    assert ("note: no --app, so the task's own settings are unknown here; used the defaults "
            "queue='default' (--queue), max_attempts=5 (--max-attempts)") in plain.stderr
    assert plain.stdout.strip().isdigit()  # stdout stays the id alone
    given = cli(pg_dsn, schema, "enqueue", "greet", "--queue", "greetings")
    assert "queue=" not in given.stderr and "max_attempts=5 (--max-attempts)" in given.stderr
    both = cli(pg_dsn, schema, "enqueue", "greet", "--queue", "greetings", "--max-attempts", "3")
    assert both.returncode == 0 and both.stderr == ""
