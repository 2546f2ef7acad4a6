"""What a claimer process pays at start (issue 23: a drain run's start-up, what a CronJob
pays on every run), checked by what each process had loaded, never by a timing.

A claimer is forked from the pod's fork server with its modules already imported (a
spawned claimer re-imported psycopg, prometheus_client, OpenTelemetry and pgworker: 0.3
to 0.5 CPU-seconds each, 12 s for 16 claimers to claim on 2 cores); the server never runs
the app's code; and nothing a drain run does not need (croniter, whose import runs
``file -b`` on the interpreter) is imported by an app without schedules.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys

import pytest

from pg import wait_until
from worker import HERE, Worker, q

pytestmark = pytest.mark.acceptance

PROBE_APP = os.path.join(HERE, "apps", "startup_probe_app.py") + ":app"
# What a claimer must find loaded when it comes to import the app (the fork server's).
PRELOADED = ("psycopg", "prometheus_client", "opentelemetry.trace", "pgworker.worker.claimer.loop",
             "pgworker.metrics", "pgworker.loader")


def _probes(folder):
    return [json.load(open(p)) for p in sorted(glob.glob(os.path.join(folder, "*.json")))]


def test_claimers_are_forked_with_their_modules_loaded_and_the_server_runs_no_app_code(app, pg_dsn, tmp_path):
    app.enqueue_many([("noop", i) for i in range(20)])
    with Worker(pg_dsn, app.settings.schema, "--drain", "--concurrency", "3", app=PROBE_APP,
                env={"PROBE_DIR": str(tmp_path)}) as w:
        assert w.wait(90) == 0, w.logs()[-3000:]
    seen = _probes(tmp_path)
    claimers = [p for p in seen if p["process"].startswith("pgworker-claimer")]
    others = [p for p in seen if not p["process"].startswith("pgworker-claimer")]
    assert len(claimers) == 3, seen
    # the supervisor loads the app too; nothing else does (the fork server never imports it)
    assert len(others) == 1 and others[0]["process"] == "MainProcess", others
    assert not any("multiprocessing.forkserver" in " ".join(p["argv"]) for p in others)
    for p in claimers:
        assert any("multiprocessing.forkserver" in a for a in p["argv"]), p["argv"]  # forked, not spawned
        missing = [m for m in PRELOADED if m not in p["modules"]]
        assert missing == [], f"not preloaded by the fork server: {missing}"
    # an app without schedules never imports croniter (its import forks `file`): by the
    # time the app is imported, all of pgworker is, in the supervisor and in a claimer
    for p in seen:
        assert "croniter" not in p["modules"], p["process"]



def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def test_a_killed_fork_server_costs_the_pod_its_claimers_never_two_on_one_table(app, pg_dsn, conn):
    """The fork server reports its claimers' exits; killed (SIGKILL: it ignores SIGTERM),
    it leaves them running, orphaned, while the supervisor reads them as exited. They are
    stopped before their replacements take their slot tables (a sync handler's claimer
    would otherwise run on beside its replacement), and the pod goes on."""
    schema = app.settings.schema
    with Worker(pg_dsn, schema, "--concurrency", "2", app=PROBE_APP) as w:
        old = wait_until(lambda: len(w.claimer_pids()) == 2 and w.claimer_pids(), 60, message="claimers started")
        app.enqueue_many([("nap", 30), ("nap", 30)], any_task=True)
        wait_until(lambda: q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'running'")[0][0] == 2,
                   60, message="both claimers run a long job")
        (server,) = w.fork_server_pids()
        os.kill(server, signal.SIGKILL)
        # replacements: other pids (until the kill lands, the old claimers are still the
        # dying server's children, and read as the pod's claimers)
        new = wait_until(lambda: len(pids := w.claimer_pids()) == 2 and set(pids).isdisjoint(old) and pids, 60,
                         message=lambda: f"replacement claimers; log:\n{w.logs()[-3000:]}")
        assert [p for p in old if _running(p)] == [], "an orphaned claimer runs beside its replacement"
        assert set(new).isdisjoint(old) and w.fork_server_pids() not in ([], [server])
        ids = app.enqueue_many([("noop", i) for i in range(20)])
        wait_until(lambda: q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE id = ANY(%s) AND state = 'succeeded'",
                             list(ids))[0][0] == 20, 60, message="the jobs run after the restart")
        assert w.stop() == 0


def test_the_command_line_loads_no_driver_before_run_starts_its_fork_server():
    """``pgworker run`` starts the claimers' fork server first thing (forkserver.start_early),
    so that the server's imports overlap the supervisor's: the command line's own imports
    (``pgworker.cli``, and the package, whose public names load on first use) must load
    none of psycopg, prometheus_client and OpenTelemetry. A module that imports one of them
    at the top from cli/ or pgworker/__init__.py fails this test."""
    code = ("import sys, pgworker.cli\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'psycopg_pool', "
            "'prometheus_client', 'opentelemetry'))\n"
            "assert heavy == [], heavy\n"
            "import pgworker\n"
            "assert pgworker.App.__module__ == 'pgworker.app' and 'App' in dir(pgworker)\n"
            "from pgworker import NOT_DONE, JobSpec, Settings, Task  # noqa: F401\n"
            "assert pgworker.retry.FailureClass and 'importlib' not in dir(pgworker)  # submodules load too\n"
            "try:\n"
            "    pgworker.Missing\n"
            "except AttributeError as exc:\n"
            "    assert 'Missing' in str(exc)\n"
            "else:\n"
            "    raise SystemExit('pgworker.Missing resolved')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE)
    assert done.returncode == 0, done.stderr


def _console_script() -> list[str]:
    """The `pgworker` console script of this environment, as a shell runs it (its sys.path
    starts with the script's folder, not the current directory)."""
    return [sys.executable, os.path.join(os.path.dirname(sys.executable), "pgworker")]


def test_a_run_from_the_folder_holding_a_clone_named_pgworker_starts_its_claimers(app, pg_dsn, tmp_path):
    """A new user's trial: `pgworker run` from the folder that contains the clone (named
    pgworker) of an editable install: the fork server (`python -c`, the current directory
    first on its path) imported that folder as an empty namespace package, its preload
    failed without a word, and every claimer died with "module 'pgworker' has no attribute
    'App'". The server now starts as `python -P` (starting it from `/` only moved the trap
    to an image's `/pgworker`: a review); the claimers still run in the run's folder, and
    their environment (what a handler's subprocess gets) has no PYTHONSAFEPATH.
    (With the editable install CI and the README make, an empty `pgworker` folder is enough
    to shadow the package: `python -c 'import pgworker'` there finds no App.)"""
    (tmp_path / "pgworker").mkdir()
    app.enqueue_many([("noop", i) for i in range(5)])
    env = dict(os.environ, PGWORKER_DSN=pg_dsn, PGWORKER_SCHEMA=app.settings.schema, PROBE_DIR=str(tmp_path))
    out = subprocess.run([*_console_script(), "run", "--app", PROBE_APP, "--drain", "--concurrency", "2",
                          "--metrics-port", "0"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["succeeded"] == 5
    claimers = [p for p in _probes(tmp_path) if p["process"].startswith("pgworker-claimer")]
    assert len(claimers) == 2 and all("pgworker.worker.claimer.loop" in p["modules"] for p in claimers)
    assert {p["cwd"] for p in claimers} == {str(tmp_path)}  # the run's folder
    # forked from a server started with -P, whatever its directory; the flag is the server's alone
    assert all(p["safe_path"] and p["PYTHONSAFEPATH"] is None for p in claimers), claimers
