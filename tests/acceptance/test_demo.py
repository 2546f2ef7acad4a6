"""`pgworker demo`, the README's first command, run as a user would: a small workload
through the real CLI, with the embedded PostgreSQL and with a server of one's own."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.acceptance


def demo(tmp_path, *args, dsn=None):
    """Run the demo with its temporary files (worker log, outputs, embedded server) under
    tmp_path, so the test leaves nothing in /tmp."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGWORKER_")}
    env["TMPDIR"] = str(tmp_path)
    if dsn:
        env["PGWORKER_DSN"] = dsn
    proc = subprocess.run([sys.executable, "-m", "pgworker.cli", "demo", "--jobs", "20", "--concurrency", "1",
                           *args], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def dead_job_in_the_log(out):
    log = re.search(r"worker log \(.*\): (\S+)", out).group(1)
    with open(log) as f:
        return re.search(r"see `pgworker jobs show (\d+)[^`]*`", f.read()).group(1)


def test_the_embedded_database_is_gone_and_the_closing_hint_says_so(tmp_path):
    out = demo(tmp_path)
    dead_job_in_the_log(out)  # the log does name jobs to inspect...
    assert "jobs show" not in out  # ...but the demo points at no database that is gone
    assert "the embedded PostgreSQL was deleted at exit" in out and "demo --keep` leaves it running" in out
    log = re.search(r"worker log \(.*\): (\S+)", out).group(1)
    assert f"the log stays until you delete it: rm {log}" in out, out  # it was left in /tmp without a word


def test_a_kept_embedded_database_answers_the_printed_commands(tmp_path):
    out = demo(tmp_path, "--keep")
    # the printed command runs as printed from where the demo ran (the virtualenv's script
    # when `pgworker` on PATH is not this installation, as after the README's set-up)
    dsn = re.search(r"PGWORKER_DSN='([^']+)' \S+ jobs show \d+", out).group(1)
    stop = out.rstrip().splitlines()[-1].strip()
    console = re.search(r"the web console keeps running too: (http://127\.0\.0\.1:\d+/)", out)
    try:
        assert console, out  # `demo --keep` leaves the console running and prints its URL
        import requests

        page = requests.get(console.group(1), timeout=30)
        assert page.status_code == 200 and "Queues" in page.text and "default" in page.text
        dead_job_in_the_log(out)
        # pasted as printed (a real dead job's id, not a placeholder), from another directory
        printed = re.search(r"(PGWORKER_DSN='[^']+' \S+ jobs show \d+)", out).group(1)
        shown = subprocess.run(printed + " --json", shell=True, cwd=tmp_path, capture_output=True, text=True,
                               timeout=60)
        assert shown.returncode == 0 and '"state": "dead"' in shown.stdout, shown.stderr
        kept = re.search(r"outputs kept in (\S+)", out).group(1)
        worker_log = re.search(r"worker log \(failed attempts and dead jobs, as a real worker logs them\): (\S+)",
                               out).group(1)
        assert os.path.isdir(kept) and os.path.exists(worker_log)
    finally:
        stopped = subprocess.run(stop, shell=True, capture_output=True, text=True, timeout=60)
    assert "Warning" not in stopped.stderr, stopped.stderr  # platformdirs' RuntimeDirWarning was printed
    datadir = re.search(r"host=([^&'\s]+)", dsn).group(1)
    assert not os.path.exists(datadir)  # the printed command stopped and deleted it
    assert not os.path.exists(kept) and not os.path.exists(worker_log)  # and the kept outputs and logs
    import requests

    with pytest.raises(requests.ConnectionError):  # and stopped the console
        requests.get(console.group(1), timeout=5)


def test_with_a_server_of_ones_own_the_hint_names_the_schema(tmp_path, pg_dsn, schema):
    out = demo(tmp_path, "--schema", schema, dsn=pg_dsn)  # the demo takes --schema only, not PGWORKER_SCHEMA
    # --jobs 20 makes 20 jobs, said so and counted so (a new user's trial: --jobs 100 made 101, and 106)
    assert "; 20 jobs in all" in out and re.search(r"^jobs +20$", out, re.M), out
    assert re.search(rf" jobs show \d+ --schema {schema}` \(same DSN\)", out), out
    # its wording: one claimer, not "1 claimers"; jobs held by claimers counted as claimed
    # (a claimed job's handler may not have started yet), not as running
    assert "starting `pgworker run` with 1 claimer..." in out
    progress = [line for line in out.splitlines() if line.startswith("[")]
    assert progress and all(re.search(r"finished  claimed +\d+  pending", line) for line in progress)
    assert not any("running" in line for line in progress)
    job = dead_job_in_the_log(out)
    shown = subprocess.run([sys.executable, "-m", "pgworker.cli", "jobs", "show", job, "--schema", schema],
                           env=dict(os.environ, PGWORKER_DSN=pg_dsn), capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "PAYLOAD_INVALID" in shown.stdout, shown.stderr
    # a second run in the same schema counted the first run's jobs as its own: refused, naming the fix
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGWORKER_")}
    again = subprocess.run([sys.executable, "-m", "pgworker.cli", "demo", "--jobs", "20", "--schema", schema],
                           env=dict(env, PGWORKER_DSN=pg_dsn, TMPDIR=str(tmp_path)), capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 1 and f"schema {schema!r} already holds jobs" in again.stderr, again.stderr
    assert "--schema" in again.stderr and "Traceback" not in again.stderr


def test_a_failed_demo_says_how_to_stop_what_it_kept_and_leaves_nothing_else(tmp_path):
    """The worker exits early (here: a log level it refuses, passed on from the user's
    environment): the demo printed only the error, and with --keep its embedded PostgreSQL
    ran on unnoticed; without --keep an empty outputs folder stayed behind."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGWORKER_")}
    env.update(TMPDIR=str(tmp_path), PGWORKER_LOG_LEVEL="NOPE")
    run = [sys.executable, "-m", "pgworker.cli", "demo", "--jobs", "20", "--concurrency", "1"]
    kept = subprocess.run(run + ["--keep"], env=env, capture_output=True, text=True, timeout=240)
    assert kept.returncode == 1, kept.stdout + kept.stderr
    assert "the worker exited early with code 1" in kept.stderr
    assert "log level 'NOPE' (--log-level or PGWORKER_LOG_LEVEL) is not one of" in kept.stderr  # not a traceback
    assert "Traceback" not in kept.stderr
    stop = kept.stderr.rstrip().splitlines()[-1].strip()
    assert "cleanup()" in stop, kept.stderr
    datadir = next(tmp_path.glob("pgworker-demo-pg-*"))
    stopped = subprocess.run(stop, shell=True, capture_output=True, text=True, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert not datadir.exists() and not list(tmp_path.glob("pgworker-demo-out-*"))
    plain = subprocess.run(run, env=env, capture_output=True, text=True, timeout=240)
    assert plain.returncode == 1 and "the embedded PostgreSQL was deleted at exit" in plain.stderr, plain.stderr
    assert not list(tmp_path.glob("pgworker-demo-pg-*")) and not list(tmp_path.glob("pgworker-demo-out-*"))


@pytest.mark.unit
def test_the_workload_has_as_many_jobs_as_asked_and_too_few_is_refused(capsys):
    import random

    from pgworker import cli
    from pgworker.demo import FIXED_JOBS, GRAPH_TILES, build_workload

    for n in (1, 14, 95, 394):
        specs, duplicates = build_workload(n, random.Random(7))
        assert len(specs) - duplicates == n == len({(s.task, repr(s.payload)) for s in specs})
    assert FIXED_JOBS == GRAPH_TILES + 2 == 6
    assert cli.main(["demo", "--jobs", "5"]) == 2  # before any database is started
    assert cli.main(["demo", "--concurrency", "0"]) == 2  # so is a pool of no claimers (a review)
    err = capsys.readouterr().err
    assert "the demo makes at least 6 jobs" in err and "--concurrency 0: give 1 to 1024 claimer processes" in err


def test_the_demo_runs_from_the_folder_holding_a_clone_named_pgworker(tmp_path, pg_dsn, schema):
    """A new user's trial: `pgworker demo` from the folder that contains the clone of an
    editable install failed ("the worker exited early with code 1"): its worker and console
    were `python -m pgworker.cli`, whose path starts with the current directory, where the
    clone's folder shadowed the package. They run with -P now."""
    (tmp_path / "pgworker").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGWORKER_")}
    proc = subprocess.run([sys.executable, os.path.join(os.path.dirname(sys.executable), "pgworker"), "demo",
                           "--jobs", "20", "--concurrency", "1", "--schema", schema],
                          cwd=tmp_path, env=dict(env, TMPDIR=str(tmp_path), PGWORKER_DSN=pg_dsn),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "; 20 jobs in all" in proc.stdout
