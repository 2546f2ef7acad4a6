"""The profiles behind docs/benchmarks.md's "What limits each missed target"
(``python -m benchmarks.profile``): py-spy's samples read and grouped right, and the
profiled cases run end to end on a real server. Nothing here looks at a speed."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from benchmarks import profile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = "/v/lib/python3.11/site-packages"


def test_collapsed_stacks_are_summed_and_grouped_by_the_running_frames_area(tmp_path):
    one, two = tmp_path / "claimer-1.txt", tmp_path / "claimer-2.txt"
    loop = "run (/w/pgworker/worker/claimer/loop.py)"
    one.write_text(f"process 1:\"python\";{loop};execute ({SITE}/psycopg/cursor.py) 30\n"
                   f"{loop};inc ({SITE}/prometheus_client/values.py:12) 10\n"
                   "garbage line without a count\n")
    two.write_text(f"{loop};execute ({SITE}/psycopg/cursor.py) 20\n"
                   f"{loop};handle (/w/benchmarks/bench_app.py) 5\n"
                   f"{loop};dumps (/usr/lib/python3.11/json/__init__.py) 5\n")
    stacks = profile.read_stacks([str(one), str(two), str(tmp_path / "absent.txt")])
    assert sum(stacks.values()) == 70
    text = "\n".join(profile.summarize("claimers", stacks))
    assert "70 samples." in text
    assert "| psycopg | 50 | 71.4 % |" in text
    assert "| prometheus_client | 10 | 14.3 % |" in text
    assert "| stdlib json | 5 | 7.1 % |" in text and "| the job handler (benchmarks) | 5 | 7.1 % |" in text
    # every sample ran inside the claimer loop: 100 % including callees
    assert "| run (pgworker.worker.claimer.loop) | 70 | 100.0 % |" in text
    assert profile.area("/w/pgworker/store/__init__.py") == "pgworker.store"
    assert "No samples" in "\n".join(profile.summarize("empty", profile.read_stacks([])))


@pytest.mark.timeout(600)
def test_the_profiled_cases_run_end_to_end(pg_dsn):
    try:
        profile.py_spy()
    except RuntimeError as exc:
        if os.environ.get("PGWORKER_STRICT", "") not in ("", "0", "false", "no"):
            pytest.fail(f"{exc}; PGWORKER_STRICT=1 requires it", pytrace=False)
        pytest.skip(str(exc))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGWORKER_", "OTEL_", "PROMETHEUS_"))}
    done = subprocess.run([sys.executable, "-m", "benchmarks.profile", "--dsn", pg_dsn, "--cases",
                           "drain,enqueue_many,startup", "--jobs", "3000", "--seconds", "1", "--no-save"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    claimers = out.split("### Drain", 1)[1].split("### The same drain", 1)[0]
    assert "3,000 jobs in" in claimers
    assert int(re.search(r"([\d,]+) samples\.", claimers).group(1).replace(",", "")) > 0, claimers
    assert "pgworker.worker.claimer" in claimers  # the claimers' own frames were read
    producer = out.split("### enqueue_many", 1)[1].split("### Start-up", 1)[0]
    assert "pgworker.producer" in producer or "pgworker.store" in producer, producer
    assert "`import pgworker.cli`" in out and "`import pgworker.worker.claimer.preload`" in out


def test_an_unknown_case_is_refused_with_the_choices():
    done = subprocess.run([sys.executable, "-m", "benchmarks.profile", "--cases", "drian"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown case drian: choose from drain, otlp" in done.stderr


def test_a_profile_of_few_samples_says_so(tmp_path):
    path = tmp_path / "enqueue-1.txt"
    path.write_text(f"run (/w/pgworker/producer.py);execute ({SITE}/psycopg/cursor.py) 14\n")
    text = "\n".join(profile.summarize("producer", profile.read_stacks([str(path)])))
    assert "**Few samples** (under 200: each is 7.1 % of the whole)" in text


@pytest.mark.parametrize("args, said", [
    (["--cases", ","], "--cases names no case"),
    (["--jobs", "0"], "--jobs 0: give at least 1000 jobs"),
    (["--seconds", "-1"], "--seconds -1.0: give a positive number of seconds"),
])
def test_bad_sizes_are_refused_before_anything_runs(args, said):
    done = subprocess.run([sys.executable, "-m", "benchmarks.profile", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and said in done.stderr, done.stderr


def test_an_unusable_dsn_is_one_line_without_its_password():
    for dsn in ("postgresql://bob:s3cretpw@127.0.0.1:1/test", "host=127.0.0.1 password=s3cretpw bogus=1"):
        done = subprocess.run([sys.executable, "-m", "benchmarks.profile", "--cases", "enqueue", "--dsn", dsn],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "benchmark: cannot connect to" in done.stderr, done.stderr
        assert "s3cretpw" not in done.stderr and "Traceback" not in done.stderr, done.stderr
