"""pgworker itself: drain runs of ``pgworker run --drain``, enqueue, wake-up latency.

A drain run is a real ``pgworker run --drain`` subprocess (dispatcher + claimers) on a
prefilled schema. Its claimers wait at a start gate (see ``bench_app.py``) until all
are up; the rate is then read from the rows (first claim to last outcome, database
clock), the claim latency from the claimers' own ``pgworker_claim_duration_seconds``
histogram (their Prometheus multiprocess files), and the resident memory of every
process is sampled while it runs.
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
from dataclasses import dataclass, field
from typing import Any

from .server_cost import BackendCpu, RunWal, wal_figures
from .common import (QUEUE, BenchSchema, ServerCpu, children, cpu_seconds, machine_busy_seconds, rss_bytes,
                     wait_for)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BENCH_APP = os.path.join(HERE, "bench_app.py") + ":app"
MiB = 1024 * 1024


@dataclass
class Observability:
    """What a run records.

    ``tracing``: 'sdk' (an SDK provider at its default sampling, spans exported to a
    discarding exporter), 'console' (OTEL_TRACES_EXPORTER=console, stdout to /dev/null),
    'api' (pgworker's default with no exporter configured: the OpenTelemetry API only,
    non-recording spans), 'otlp' (pgworker's own set-up from OTEL_TRACES_EXPORTER=otlp_proto_http: SDK
    provider, batch span processor, OTLP/HTTP protobuf exporter to ``otlp_endpoint``, the
    benchmark's sink) or 'off' (--no-tracing). ``metrics``: False replaces pgworker's
    metrics with no-ops (bench_app.py) to measure what they cost.
    """

    tracing: str = "sdk"
    metrics: bool = True
    sampler_ratio: float | None = None  # parentbased_traceidratio instead of the SDK default
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. PGWORKER_SYNCHRONOUS_COMMIT
    otlp_endpoint: str | None = None  # tracing 'otlp': pgworker's own OTLP/HTTP set-up, to this receiver

    def args(self) -> list[str]:
        return ["--no-tracing"] if self.tracing == "off" else []

    def env(self) -> dict[str, str]:
        env = {} if self.metrics else {"BENCH_METRICS": "off"}
        env.update(self.extra_env)
        if self.sampler_ratio is not None:
            env.update({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                        "OTEL_TRACES_SAMPLER_ARG": str(self.sampler_ratio)})
        if self.tracing == "sdk":
            env["BENCH_TRACING"] = "sdk"
        elif self.tracing == "console":
            env["OTEL_TRACES_EXPORTER"] = "console"
        elif self.tracing == "otlp":
            # otlp_proto_http, not otlp: pgworker (at e7d8163) looks "otlp" up among the
            # entry points, where only the gRPC package registers it, so with the [otlp]
            # extra (HTTP) OTEL_TRACES_EXPORTER=otlp exports nothing (a warning in the log)
            env.update({"OTEL_TRACES_EXPORTER": "otlp_proto_http", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                        "OTEL_EXPORTER_OTLP_ENDPOINT": self.otlp_endpoint or ""})
        return env

    @property
    def label(self) -> str:
        return f"metrics {'on' if self.metrics else 'off'}, tracing {self.tracing}"


@dataclass
class DrainResult:
    jobs: int
    seconds: float
    claim_mean_ms: float
    claims: int
    rss_dispatcher: list[int] = field(default_factory=list)   # samples, bytes
    rss_claimers: dict[int, list[int]] = field(default_factory=dict)  # pid -> samples
    exit_code: int = 0
    wall_seconds: float = 0.0
    cpu_claimers: dict[int, float] = field(default_factory=dict)  # pid -> CPU seconds (last sample)
    cpu_dispatcher: float = 0.0
    machine_busy_cores: float = 0.0  # average busy cores of the whole machine during the run
    cpu_server: float = 0.0  # CPU seconds of the PostgreSQL server processes during the run
    cpu_backends: float = 0.0  # CPU seconds of the run's own backends (its sessions' ports)
    wal_bytes: int = 0       # WAL the server wrote during the run (the insert LSN's difference)
    wal_own: int | None = None  # of which the run's own records (pg_walinspect), when readable

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        claimers = self.rss_claimers.values()
        return {"jobs": self.jobs, "seconds": round(self.seconds, 4), "jobs_per_second": round(self.rate, 1),
                "claim_mean_ms": round(self.claim_mean_ms, 3), "claims": self.claims,
                "rss_dispatcher_max_mib": round(max(self.rss_dispatcher, default=0) / MiB, 1),
                "rss_claimer_max_mib": round(max((max(v) for v in claimers if v), default=0) / MiB, 1),
                "rss_claimer_first_mib": round(max((v[0] for v in claimers if v), default=0) / MiB, 1),
                "rss_claimer_last_mib": round(max((v[-1] for v in claimers if v), default=0) / MiB, 1),
                "exit_code": self.exit_code, "wall_seconds": round(self.wall_seconds, 2),
                "cpu_claimers_us_per_job": round(1e6 * sum(self.cpu_claimers.values()) / self.jobs, 1) if self.jobs else 0,
                "cpu_dispatcher_s": round(self.cpu_dispatcher, 2),
                "cpu_supervisor_us_per_job": round(1e6 * self.cpu_dispatcher / self.jobs, 1) if self.jobs else 0,
                "cpu_server_us_per_job": round(1e6 * self.cpu_server / self.jobs, 1) if self.jobs else 0,
                "cpu_backends_us_per_job": round(1e6 * self.cpu_backends / self.jobs, 1) if self.jobs else 0,
                **wal_figures(self.wal_bytes, self.wal_own, self.jobs),
                "machine_busy_cores": round(self.machine_busy_cores, 2)}


def _env(schema: BenchSchema, extra: dict[str, str], code_root: str | None = None) -> dict[str, str]:
    """The environment of a ``pgworker run``: this checkout's pgworker, or the one at
    ``code_root`` (another commit's checkout, measured side by side: ``--compare-with``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGWORKER_", "OTEL_", "PROMETHEUS_"))}
    env.update({"PGWORKER_DSN": schema.dsn, "PGWORKER_SCHEMA": schema.name, "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join([code_root or ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)})
    env.update(extra)
    return env


def claimer_pids(pid: int) -> list[int]:
    """The claimer processes of the supervisor ``pid``: the children of its fork server
    (a child running multiprocessing.forkserver's main), or children running spawn_main
    (an older checkout, ``--compare-with``)."""
    out = []
    for c in children(pid):
        try:
            with open(f"/proc/{c}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"multiprocessing.forkserver" in cmd:
            out += children(c)
        elif b"spawn_main" in cmd and b"resource_tracker" not in cmd:
            out.append(c)
    return out


def drain(schema: BenchSchema, *, concurrency: int, batch: int | None = None,
          obs: Observability | None = None, since_id: int = 0, max_duration: float | None = None,
          extra_args: tuple[str, ...] = (), extra_env: dict[str, str] | None = None,
          sample_every: float = 0.1, timeout: float = 900, code_root: str | None = None,
          profile_dir: str | None = None, metrics_dir: str | None = None) -> DrainResult:
    """Run ``pgworker run --drain`` on ``schema`` until it exits; return what it did.
    ``profile_dir``: sample every claimer and the supervisor with py-spy from the start
    gate to their exit, one collapsed-stack file each (``benchmarks/profile.py``).
    ``metrics_dir``: an empty folder for the claimers' metric files, which the caller may
    read while the run goes on (:func:`claim_latency`), and removes afterwards."""
    obs = obs or Observability()
    gate = tempfile.mkdtemp(prefix="pgworker-bench-gate-")
    own_metrics_dir = metrics_dir is None
    metrics_dir = metrics_dir or tempfile.mkdtemp(prefix="pgworker-bench-metrics-")
    cmd = [sys.executable, "-m", "pgworker.cli", "run", "--app", BENCH_APP, "--drain",
           "--concurrency", str(concurrency), "--metrics-dir", metrics_dir, "--log-level", "WARNING",
           *obs.args(), *extra_args]
    if batch is not None:
        cmd += ["--batch-size", str(batch)]
    if max_duration is not None:
        cmd += ["--max-duration", f"{max_duration}s"]
    env = _env(schema, {"BENCH_GATE_DIR": gate, **obs.env(), **(extra_env or {})}, code_root)
    out = subprocess.DEVNULL
    t0 = time.monotonic()
    # cwd: `python -m` puts the working directory first on sys.path, before PYTHONPATH
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=code_root or ROOT)
    result = DrainResult(0, 0.0, 0.0, 0)
    try:
        wait_for(lambda: proc.poll() is not None or len(glob.glob(os.path.join(gate, "ready-*"))) >= concurrency,
                 120, "the claimers to start")
        if proc.poll() is not None:
            raise RuntimeError(f"pgworker run exited early ({proc.returncode}): {proc.stderr.read()[-3000:]}")
        pids = claimer_pids(proc.pid)
        if profile_dir is not None:
            from .profile import sample_processes

            samplers = sample_processes({"supervisor": [proc.pid], "claimer": pids}, profile_dir)

        cpu0 = {p: cpu_seconds(p) for p in pids}
        cpu0_dispatcher = cpu_seconds(proc.pid)

        def sample() -> None:
            result.rss_dispatcher.append(rss_bytes(proc.pid))
            d = cpu_seconds(proc.pid)
            if d:
                result.cpu_dispatcher = d - cpu0_dispatcher
            for p in pids:
                r = rss_bytes(p)
                if r:
                    result.rss_claimers.setdefault(p, []).append(r)
                    result.cpu_claimers[p] = cpu_seconds(p) - cpu0[p]
            server.sample()
            backends.sample()

        server = ServerCpu()
        backends = BackendCpu(schema.dsn, proc.pid)
        sample()
        busy0, total0 = machine_busy_seconds()
        wal = RunWal(schema.dsn, schema.name)
        open(os.path.join(gate, "go"), "w").close()
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"pgworker run --drain did not finish in {timeout} s")
            time.sleep(sample_every)
            if proc.poll() is None:
                sample()
        result.exit_code = proc.returncode
        result.wall_seconds = time.monotonic() - t0
        result.wal_bytes, result.wal_own = wal.finish()
        result.cpu_server = server.seconds
        result.cpu_backends = backends.seconds
        backends.close()
        busy1, total1 = machine_busy_seconds()
        cores = os.cpu_count() or 1
        result.machine_busy_cores = cores * (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0
        err = proc.stderr.read()
        if proc.returncode not in (0, 75):
            raise RuntimeError(f"pgworker run --drain exited {proc.returncode}: {err[-3000:]}")
        if profile_dir is not None:
            samplers.wait()
    except BaseException:
        if own_metrics_dir:  # interrupted (Ctrl-C) or failed: nothing to read
            shutil.rmtree(metrics_dir, ignore_errors=True)
        raise
    finally:
        if proc.poll() is None:
            _stop(proc)
        shutil.rmtree(gate, ignore_errors=True)
    result.jobs, result.seconds = schema.window(since_id)
    result.claim_mean_ms, result.claims = claim_latency(metrics_dir)
    if own_metrics_dir:
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return result


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop a run cut short: SIGTERM first, so that pgworker removes its shared-memory
    files and semaphores, then SIGKILL to the group if it has not exited in 10 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def claim_latency(metrics_dir: str) -> tuple[float, int]:
    """(mean claim duration in ms, claims) from the claimers' multiprocess metric files
    (so far, when read during a run; :func:`claim_totals` for the raw sums)."""
    total, count = claim_totals(metrics_dir)
    return (1000.0 * total / count if count else 0.0), int(count)


def claim_totals(metrics_dir: str) -> tuple[float, float]:
    """(seconds spent in claims, claims) of the bench queue, from the claimers' metric files.
    A file listed and then removed before it is read (a claimer's, merged away as the run
    ends: a CI run's snapshot growth failed so) is read again from the start, a few times."""
    for attempt in range(5):
        try:
            return _claim_totals(metrics_dir)
        except FileNotFoundError:
            if attempt == 4:
                raise
            time.sleep(0.05)
    raise AssertionError("unreachable")


def _claim_totals(metrics_dir: str) -> tuple[float, float]:
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=metrics_dir)
    total = count = 0.0
    for family in registry.collect():
        if family.name != "pgworker_claim_duration_seconds":
            continue
        for s in family.samples:
            if s.name.endswith("_sum") and s.labels.get("queue") == QUEUE:
                total += s.value
            elif s.name.endswith("_count") and s.labels.get("queue") == QUEUE:
                count += s.value
    return total, count


class Service:
    """A long-running ``pgworker run`` (LISTEN or polling), for wake-up latency."""

    def __init__(self, schema: BenchSchema, *, concurrency: int, listen: bool, poll_interval: float,
                 obs: Observability | None = None, code_root: str | None = None) -> None:
        self.schema = schema
        self.gate = tempfile.mkdtemp(prefix="pgworker-bench-gate-")
        cmd = [sys.executable, "-m", "pgworker.cli", "run", "--app", BENCH_APP, "--concurrency", str(concurrency),
               "--metrics-port", "0", "--log-level", "WARNING", "--poll-interval", f"{poll_interval}s",
               *(obs or Observability()).args()]
        if not listen:
            cmd.append("--no-listen")
        env = _env(schema, {"BENCH_GATE_DIR": self.gate, **(obs or Observability()).env()}, code_root)
        self.concurrency = concurrency
        self.listen = listen
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, cwd=code_root or ROOT)

    def __enter__(self) -> "Service":
        wait_for(lambda: self.proc.poll() is not None or
                 len(glob.glob(os.path.join(self.gate, "ready-*"))) >= self.concurrency, 120, "the claimers to start")
        if self.proc.poll() is not None:
            raise RuntimeError(f"pgworker run exited early: {self.proc.stderr.read()[-3000:]}")
        open(os.path.join(self.gate, "go"), "w").close()
        if self.listen:
            from .common import connect

            from pgworker.store import notify_channel

            channel = f'LISTEN "{notify_channel(self.schema.name)}"'
            with connect(self.schema.dsn) as conn:
                wait_for(lambda: conn.execute("SELECT 1 FROM pg_stat_activity WHERE query = %s", [channel]).fetchall(),
                         60, "the supervisor to LISTEN")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.gate, ignore_errors=True)


def drain_pods(schema: BenchSchema, *, pods: int, concurrency: int, obs: Observability | None = None,
               since_id: int = 0, timeout: float = 900) -> dict[str, Any]:
    """``pods`` ``pgworker run --drain`` processes (``concurrency`` claimers each) on one
    schema, released together by one start gate; the rate from the rows, the CPU per job
    of the claimers, the supervisors and the server."""
    obs = obs or Observability()
    gate = tempfile.mkdtemp(prefix="pgworker-bench-gate-")
    env = _env(schema, {"BENCH_GATE_DIR": gate, **obs.env()})
    procs = []
    try:
        for _ in range(pods):
            cmd = [sys.executable, "-m", "pgworker.cli", "run", "--app", BENCH_APP, "--drain", "--concurrency",
                   str(concurrency), "--metrics-dir", tempfile.mkdtemp(prefix="pgworker-bench-metrics-"),
                   "--log-level", "WARNING", *obs.args()]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                          start_new_session=True, cwd=ROOT))
        wait_for(lambda: any(p.poll() is not None for p in procs) or
                 len(glob.glob(os.path.join(gate, "ready-*"))) >= pods * concurrency, 180, "every claimer to start")
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a pgworker run exited early: " + " ".join(p.stderr.read()[-1500:] for p in procs
                                                                          if p.poll() is not None))
        claimers = {c: cpu_seconds(c) for p in procs for c in claimer_pids(p.pid)}
        supervisors = {p.pid: cpu_seconds(p.pid) for p in procs}
        last = dict(claimers), dict(supervisors)
        server = ServerCpu()
        open(os.path.join(gate, "go"), "w").close()
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{pods} drain runs did not finish in {timeout} s")
            for table in last:
                for pid in table:
                    c = cpu_seconds(pid)
                    if c:
                        table[pid] = c
            server.sample()
            time.sleep(0.1)
        for p in procs:
            if p.returncode not in (0, 75):
                raise RuntimeError(f"a drain run exited {p.returncode}: {p.stderr.read()[-2000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(gate, ignore_errors=True)
    jobs, seconds = schema.window(since_id)
    per = lambda v: round(1e6 * v / jobs, 1) if jobs else 0.0  # noqa: E731
    return {"jobs": jobs, "seconds": round(seconds, 3), "jobs_per_second": round(jobs / seconds, 1) if seconds else 0,
            "cpu_claimers_us_per_job": per(sum(last[0][c] - claimers[c] for c in claimers)),
            "cpu_supervisor_us_per_job": per(sum(last[1][p] - supervisors[p] for p in supervisors)),
            "cpu_server_us_per_job": per(server.seconds)}
