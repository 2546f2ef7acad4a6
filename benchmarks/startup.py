"""Start-up of a drain run: what a CronJob pays on every run.

``pgworker run --drain`` is started as a deployment starts it (a fresh interpreter, the
app imported, metrics on, tracing API), on a schema that already holds due jobs, without
the benchmark's start gate. Measured from the moment the process is spawned (wall
clock): the first claim (the earliest ``started_at`` of any job, the database clock: the
server is local, so it is the same clock) and the first job of every claimer (each
claimer writes the wall-clock time of its first job: ``BENCH_STARTUP_DIR`` in
``bench_app.py``). Jobs sleep ``job_ms`` each so that the run lasts until the last
claimer is up; the run is then stopped with SIGTERM (a graceful stop: its claimed jobs
are released).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .common import BenchSchema, connect, wait_for
from .drain_runs import BENCH_APP, ROOT, _env


def startup(dsn: str, *, claimers: int, jobs_per_claimer: int = 400, job_ms: float = 10.0,
            timeout: float = 120.0, code_root: str | None = None) -> dict[str, float]:
    """``code_root``: another checkout's pgworker to start instead of this one's (its own
    schema version), to measure a change against the code before it in the same run."""
    with BenchSchema(dsn, "start", code_root=code_root) as s:
        s.fill(claimers * jobs_per_claimer)
        folder = tempfile.mkdtemp(prefix="pgworker-bench-start-")
        metrics_dir = tempfile.mkdtemp(prefix="pgworker-bench-metrics-")
        err = tempfile.TemporaryFile("w+")
        cmd = [sys.executable, "-m", "pgworker.cli", "run", "--app", BENCH_APP, "--drain",
               "--concurrency", str(claimers), "--metrics-dir", metrics_dir, "--log-level", "WARNING"]
        env = _env(s, {"BENCH_STARTUP_DIR": folder, "BENCH_JOB_MS": str(job_ms)}, code_root)
        t0 = time.time()
        # cwd: `python -m` puts the working directory first on sys.path, before PYTHONPATH
        proc = subprocess.Popen(cmd, env=env, cwd=code_root or ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=err)
        try:
            wait_for(lambda: proc.poll() is not None or len(glob.glob(os.path.join(folder, "first-*"))) >= claimers
                     and not glob.glob(os.path.join(folder, "*.tmp")), timeout, "every claimer's first job")
            if proc.poll() is not None:
                err.seek(0)
                raise RuntimeError(f"pgworker run exited early ({proc.returncode}): {err.read()[-3000:]}")
            firsts = [float(open(p).read()) for p in glob.glob(os.path.join(folder, "first-*"))]
            with connect(dsn) as conn:
                first_claim = s.q(conn, "SELECT extract(epoch FROM min(started_at))::float8 FROM {s}.jobs")[0][0]
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            err.close()
            shutil.rmtree(folder, ignore_errors=True)
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return {"first_claim_seconds": round(first_claim - t0, 3),
            "first_job_seconds": round(min(firsts) - t0, 3),
            "every_claimer_seconds": round(max(firsts) - t0, 3), "claimers": claimers}
