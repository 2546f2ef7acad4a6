"""What a new user tripped over on the command line (issue 13), run as a user would: the
real `pgworker` CLI in a subprocess, against the real PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

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
                             "--app 'myproj.tasks:helper()'"]),
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
    assert ("note: no --app, so the task name 'greet' was not checked against any registered task "
            "(name --app to check it); its own settings are unknown here too: used the defaults "
            "queue='default' (--queue), max_attempts=5 (--max-attempts)") in plain.stderr
    assert plain.stdout.strip().isdigit()  # stdout stays the id alone
    given = cli(pg_dsn, schema, "enqueue", "greet", "--queue", "greetings")
    assert "queue=" not in given.stderr and "max_attempts=5 (--max-attempts)" in given.stderr
    # every setting given: the name is still unchecked (a typo would die UNKNOWN_TASK), and said so
    typo = cli(pg_dsn, schema, "enqueue", "slow_progres", "--queue", "greetings", "--max-attempts", "3")
    assert typo.returncode == 0 and typo.stdout.strip().isdigit()  # a task defined elsewhere is legitimate
    assert typo.stderr == ("note: no --app, so the task name 'slow_progres' was not checked against any "
                           "registered task (name --app to check it)\n"), typo.stderr


# -- item 7: pausing a queue nobody uses, and deleting a queue's row ----------------------


def test_pausing_a_queue_nothing_uses_warns_and_queue_delete_removes_it(app, pg_dsn, project):
    schema = app.settings.schema
    env = {"PGWORKER_ACTOR": "tester@ci"}
    typo = cli(pg_dsn, schema, "queue", "pause", "emials", env=env)
    assert typo.returncode == 0 and "paused" in typo.stdout  # done: pausing ahead of use is allowed
    assert ("warning: queue 'emials' has no pending, running or dead jobs, none among the jobs that finished "
            "last, no schedule and no history of settings, and no --app was given to check its tasks' queues: a "
            "typo? Undo with `pgworker queue resume emials` then `pgworker queue delete emials`") in typo.stderr
    for args in (("queue", "pause", "default"),  # always a queue of every worker
                 ("queue", "pause", "emails", "--app", "myproj.tasks:app"),  # a queue of a task of the app
                 ("queue", "pause", "emials"),  # it has a row now: the first warning said so
                 ("queue", "set", "emails", "--rate", "5")):
        proc = cli(pg_dsn, schema, *args, cwd=project, env=env)
        assert proc.returncode == 0 and "warning" not in proc.stderr, (args, proc.stderr)
    app.enqueue("anything", queue="used")
    assert "warning" not in cli(pg_dsn, schema, "queue", "pause", "used").stderr
    # a real queue whose jobs had just finished was called a typo
    app.enqueue("anything", queue="finished")
    [job] = app.claim("finished")
    app.complete(job)
    assert "warning" not in cli(pg_dsn, schema, "queue", "pause", "finished").stderr
    unused_set = cli(pg_dsn, schema, "queue", "set", "reprots", "--concurrency", "2", "--app", "myproj.tasks:app",
                     cwd=project)
    assert unused_set.returncode == 0
    assert "no task of the --app uses it: a typo? Undo with `pgworker queue delete reprots`" in unused_set.stderr

    paused = cli(pg_dsn, schema, "queue", "delete", "emials", env=env)
    assert paused.returncode == 1 and "Traceback" not in paused.stderr
    assert "queue 'emials' is paused" in paused.stderr and "`pgworker queue resume emials`" in paused.stderr
    assert "emials" in {q["name"] for q in app.queue_settings()}  # nothing was changed
    assert cli(pg_dsn, schema, "queue", "resume", "emials", env=env).returncode == 0
    deleted = cli(pg_dsn, schema, "queue", "delete", "emials", env=env)
    assert deleted.returncode == 0 and "queue 'emials' deleted" in deleted.stdout
    limited = cli(pg_dsn, schema, "queue", "delete", "reprots", "--json", env=env)
    assert json.loads(limited.stdout) == {"queue": "reprots", "deleted": True, "settings": {
        "concurrency_limit": 2, "rate_per_second": None, "rate_burst": None, "aging_seconds": None}}
    assert {q["name"] for q in app.queue_settings()} == {"default", "emails", "used", "finished"}
    again = cli(pg_dsn, schema, "queue", "delete", "emials")
    assert again.returncode == 0 and "has no settings: nothing to delete" in again.stdout
    events = json.loads(cli(pg_dsn, schema, "queue", "events", "emials", "--json").stdout)
    assert [(e["kind"], e["actor"]) for e in events] == [
        ("deleted", "tester@ci"), ("resumed", "tester@ci"), ("paused", "tester@ci"), ("paused", "tester@ci")]
    assert json.loads(cli(pg_dsn, schema, "queue", "events", "reprots", "--json").stdout)[0]["detail"] == {
        "concurrency_limit": 2, "rate_per_second": None, "rate_burst": None, "aging_seconds": None}
    # and the table shows the detail as JSON (it once printed a Python dict)
    table = cli(pg_dsn, schema, "queue", "events", "reprots").stdout
    assert '"concurrency_limit":2' in table and '"rate_per_second":null' in table and "None" not in table, table
    # the printed commands are shell-quoted: a queue name with a space pasted as printed
    # reaches the same queue (a new user's `queue resume bad queue!` did not)
    odd = cli(pg_dsn, schema, "queue", "pause", "bad queue!")
    resume, delete = re.findall(r"`(pgworker queue [^`]+)`", odd.stderr)
    assert shlex.split(resume) == ["pgworker", "queue", "resume", "bad queue!"], odd.stderr
    assert shlex.split(delete) == ["pgworker", "queue", "delete", "bad queue!"], odd.stderr
    paused = cli(pg_dsn, schema, "queue", "delete", "bad queue!")
    [hint] = re.findall(r"`(pgworker queue resume [^`]+)`", paused.stderr)
    assert shlex.split(hint) == ["pgworker", "queue", "resume", "bad queue!"], paused.stderr


# -- item 9: the CLI as a traced producer ---------------------------------------------------


def test_enqueue_is_traced_from_the_otel_variables(app, pg_dsn):
    """With OTEL_TRACES_EXPORTER=console, `pgworker enqueue` exports its send span (to
    stderr: stdout stays the job id) and stores its context in the job row, so the job's
    attempts join the trace; PGWORKER_TRACING=false turns it off."""
    schema = app.settings.schema
    otel = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "cli-test"}
    proc = cli(pg_dsn, schema, "enqueue", "reports.build", "--queue", "reports", "--json", env=otel)
    assert proc.returncode == 0, proc.stderr
    job_id = json.loads(proc.stdout)["id"]  # nothing but the result on stdout
    assert '"name": "send reports"' in proc.stderr and '"kind": "SpanKind.PRODUCER"' in proc.stderr
    assert '"service.name": "cli-test"' in proc.stderr
    stored = app.get_job(job_id)["trace_context"]
    assert stored is not None
    trace_id = stored["traceparent"].split("-")[1]
    assert f'"trace_id": "0x{trace_id}"' in proc.stderr  # the row carries the exported span's trace
    off = cli(pg_dsn, schema, "enqueue", "reports.build", "--queue", "reports", "--json",
              env=dict(otel, PGWORKER_TRACING="false"))
    assert off.returncode == 0 and "send reports" not in off.stderr
    assert app.get_job(json.loads(off.stdout)["id"])["trace_context"] is None


# -- item 11: cosmetics of the output --------------------------------------------------------


def test_jobs_show_aligns_nested_values_and_hides_what_does_not_apply(app, pg_dsn):
    schema = app.settings.schema
    plain = app.enqueue("t", {"a": 1, "b": [1, 2]})
    keyed = app.enqueue("t", ordering_key="k", ordering_on_dead="skip")
    out = cli(pg_dsn, schema, "jobs", "show", str(plain)).stdout.splitlines()
    start = next(i for i, line in enumerate(out) if line.split()[:1] == ["payload"])
    column = out[start].index("{")  # where values start
    assert out[start + 1:start + 7] == [" " * column + text for text in (
        '  "a": 1,', '  "b": [', "    1,", "    2", "  ]", "}")], out[start:start + 7]
    assert not any(line.split()[:1] == ["dead_blocks_key"] for line in out)  # no ordering key
    shown = cli(pg_dsn, schema, "jobs", "show", str(keyed)).stdout
    assert re.search(r"^ *dead_blocks_key  False$", shown, re.MULTILINE)
    assert json.loads(cli(pg_dsn, schema, "jobs", "show", str(plain), "--json").stdout)["dead_blocks_key"] is True


def test_counts_are_worded_in_the_singular_for_one(app, pg_dsn):
    from pgworker import Permanent

    schema = app.settings.schema
    app.enqueue("t")
    [job] = app.claim()
    app.fail(job, Permanent("broken"))
    replayed = cli(pg_dsn, schema, "dead", "replay", "--queue", "default", "--all")
    assert replayed.stdout.startswith("replayed 1 job: "), replayed.stdout
    app.cancel(app.list_jobs()[0]["id"])
    assert cli(pg_dsn, schema, "prune", "--older-than", "0s").stdout == "deleted 1 finished job\n"
    assert cli(pg_dsn, schema, "prune", "--older-than", "0s").stdout == "deleted 0 finished jobs\n"
