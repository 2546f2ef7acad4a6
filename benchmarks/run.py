"""pgworker's benchmark, every figure beside its reference, in one run (issue 23).

    python -m benchmarks.run --peers        # the full run, with PGQueuer and Procrastinate (~16 minutes on 2 quiet cores, 30-40 loaded)
    python -m benchmarks.run --quick        # a smoke run (one repetition, smaller cases)
    python -m benchmarks.run --sections matrix,growth,scale   # the optional sections

Each measurement runs on a fresh schema; every figure is the median of ``--repeat``
repetitions (3 by default, 1 with --quick), with a figure and its reference (the minimal
lease queue of ``reference.py``, PGQueuer, pgworker untraced) measured in turn inside each
repetition so that a noisy neighbour hurts both alike (the traps too, beside their plain
drain); the held snapshot's long fills, latency and the idle fleet run in the first
repetition only. Results go to
``benchmarks/results/<UTC date-time>.json`` and ``.md``; the Markdown table is also
printed. Timings are never asserted: the tests only run the smallest case of every
section (``--smallest``) to keep the harness working. See the "Benchmarks" section of
the README.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import capacity, cases, report, targets  # noqa: E402
from benchmarks.common import connect, find_dsn  # noqa: E402
from benchmarks.drain_runs import Observability  # noqa: E402

# Sections of the default run (issue 23's targets), and those only asked for by name.
SECTIONS = ("cost", "capacity", "enqueue", "obs", "startup", "snapshot", "latency", "idle", "traps", "peers")
OPTIONAL = ("matrix", "growth", "scale")


@dataclass
class Plan:
    """How much work each measurement does."""

    repeat: int
    clients: int                         # claimers / processes of the side-by-side cases (4)
    cost_jobs: int                       # each claim + complete case at batch 100
    obs_jobs: int
    enqueue_seconds: float
    enqueue_many_seconds: float
    enqueue_many_batch: int
    latency_jobs: int
    latency_gap: float                  # mean seconds between enqueues with LISTEN
    poll_jobs: int
    poll_gap: float
    poll_interval: float
    peer_jobs: int
    startup_claimers: tuple[int, ...] = (1, 4, 16)
    capacity_jobs: int = 20_000           # enqueued for the enqueue's server cost (the capacity model)
    snap_milestones: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    snap_budget: float = 150.0            # seconds the held-snapshot drain may run
    idle_pods: int = 3
    idle_claimers: int = 4
    idle_seconds: float = 60.0
    trap_rows: int = 1_000_000            # jobs scheduled later / finished jobs kept, in the traps section
    trap_due: int = 100_000
    # optional sections
    matrix_clients: tuple[int, ...] = (1, 2, 4)
    batches: tuple[int, ...] = (1, 10, 100)
    drain_jobs: dict[Any, int] = field(default_factory=lambda: {1: 6_000, 10: 40_000, 100: 150_000, None: 150_000})
    growth: tuple[tuple[int, int], ...] = ((1_000, 0), (100_000, 0), (1_000_000, 0), (100_000, 1_000_000))
    scale_pods: tuple[int, ...] = (1, 2, 4)
    scale_claimers: int = 2               # per pod
    scale_jobs: int = 150_000

    @property
    def procrastinate_jobs(self) -> int:  # ~200 jobs/s: a tenth of the others' is enough for its rate
        return max(100, self.peer_jobs // 10)


FULL = Plan(repeat=3, clients=4, cost_jobs=100_000, obs_jobs=100_000, enqueue_seconds=4, enqueue_many_seconds=3,
            enqueue_many_batch=10_000, latency_jobs=300, latency_gap=0.02, poll_jobs=100, poll_gap=0.05,
            poll_interval=2.0, peer_jobs=30_000)
QUICK = Plan(repeat=1, clients=4, cost_jobs=30_000, obs_jobs=30_000, enqueue_seconds=2, enqueue_many_seconds=1.5,
             enqueue_many_batch=10_000, latency_jobs=200, latency_gap=0.01, poll_jobs=100, poll_gap=0.02,
             poll_interval=0.5, peer_jobs=5_000, snap_milestones=(10_000, 30_000, 100_000), snap_budget=40.0,
             idle_seconds=30.0, trap_rows=100_000, trap_due=30_000, matrix_clients=(1, 4),
             drain_jobs={1: 1_500, 10: 8_000, 100: 30_000, None: 30_000},
             growth=((1_000, 0), (30_000, 0), (30_000, 100_000)), scale_jobs=30_000)
SMALLEST = Plan(repeat=1, clients=2, cost_jobs=400, obs_jobs=200, enqueue_seconds=0.3, enqueue_many_seconds=0.3,
                enqueue_many_batch=1_000, latency_jobs=10, latency_gap=0.01, poll_jobs=5, poll_gap=0.02,
                poll_interval=0.2, peer_jobs=200, startup_claimers=(1, 2), capacity_jobs=2_000, snap_milestones=(100, 200),
                snap_budget=20.0, idle_pods=1, idle_claimers=2, idle_seconds=2.0, trap_rows=1_000, trap_due=200,
                matrix_clients=(1,), batches=(10,), drain_jobs={10: 200, None: 200}, growth=((200, 0), (200, 1_000)),
                scale_pods=(1, 2), scale_claimers=1, scale_jobs=400)


@dataclass
class Results:
    rows: dict[str, dict[str, list[Any]]] = field(default_factory=dict)  # key -> field -> values per repetition
    errors: list[str] = field(default_factory=list)

    def add(self, key: str, values: dict[str, Any]) -> None:
        slot = self.rows.setdefault(key, {})
        for k, v in values.items():
            slot.setdefault(k, []).append(v)

    def median(self, key: str, name: str = "jobs_per_second") -> float | None:
        values = [v for v in self.rows.get(key, {}).get(name, []) if isinstance(v, (int, float))]
        return statistics.median(values) if values else None

    def as_json(self) -> dict[str, Any]:
        out = {}
        for key, fields in self.rows.items():
            out[key] = {name: {"median": statistics.median(vals) if all(isinstance(v, (int, float)) for v in vals) else None,
                               "values": vals} for name, vals in fields.items()}
        return out


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _measure(results: Results, key: str, fn: Callable[[], dict[str, Any]]) -> None:
    t0 = time.monotonic()
    try:
        values = fn()
    except Exception as exc:  # one failed case is reported, the run goes on
        results.errors.append(f"{key}: {type(exc).__name__}: {exc}")
        _log(f"{key}: FAILED {type(exc).__name__}: {exc}")
        if os.environ.get("BENCH_DEBUG"):
            traceback.print_exc()
        return
    results.add(key, values)
    shown = next((values[k] for k in ("jobs_per_second", "median_ms", "first_claim_seconds") if k in values), None)
    _log(f"{key}: {shown:,.1f} ({time.monotonic() - t0:.1f} s)" if isinstance(shown, (int, float)) else key)


def run(dsn: str, plan: Plan, sections: tuple[str, ...], peers: bool, before: str | None = None) -> Results:
    """Every section of ``sections``, ``plan.repeat`` times (the big fills and the
    once-only figures in the first repetition only). ``before``: the root of another
    checkout (``--compare-with``), whose pgworker is measured beside this one's in the
    matrix and idle sections."""
    from benchmarks import reference
    from benchmarks.snapshot_growth import snapshot_growth
    from benchmarks.startup import startup

    r = Results()
    sdk = Observability("sdk", True)
    api = Observability("api", True)  # pgworker's default: metrics on, tracing API without an SDK
    c, jobs = plan.clients, plan.cost_jobs
    for rep in range(plan.repeat):
        _log(f"repetition {rep + 1} of {plan.repeat}")
        if "cost" in sections:  # claim + complete at batch 100, c claimers: the reference and pgworker
            _measure(r, "ref loop", lambda: reference.loop(dsn, clients=c, batch=100, jobs=jobs))
            _measure(r, "ref pgbench", lambda: reference.pgbench_drain(dsn, clients=c, batch=100, jobs=jobs))
            _measure(r, "cost plain", lambda: cases.plain(dsn, clients=c, batch=100, jobs=jobs))
            _measure(r, "cost pgbench", lambda: cases.sql_ceiling(dsn, clients=c, batch=100, jobs=jobs))
            _measure(r, "cost pgworker b100", lambda: cases.pgworker_drain(dsn, clients=c, batch=100, jobs=jobs,
                                                                            obs=api))
        if "capacity" in sections:  # the enqueue's server cost, for the capacity model (with cost's figures)
            _measure(r, "capacity ref enqueue", lambda: capacity.reference_enqueue_cost(dsn, jobs=plan.capacity_jobs))
            _measure(r, "capacity enqueue", lambda: capacity.enqueue_cost(dsn, jobs=plan.capacity_jobs))
        if "obs" in sections or "cost" in sections:  # the drain with defaults, and what tracing costs
            _measure(r, "obs metrics+api", lambda: cases.pgworker_drain(dsn, clients=c, batch=None,
                                                                        jobs=plan.obs_jobs, obs=api))
        if "obs" in sections:
            for label, obs in (("off", Observability("off", False)), ("metrics", Observability("off", True)),
                               ("metrics+sdk", sdk)):
                _measure(r, f"obs {label}", lambda: cases.pgworker_drain(dsn, clients=c, batch=None,
                                                                         jobs=plan.obs_jobs, obs=obs))
            for ratio in (1.0, 0.1):
                _measure(r, f"obs otlp {ratio:.0%}", lambda: cases.pgworker_drain_otlp(
                    dsn, clients=c, jobs=plan.obs_jobs, ratio=ratio))
        if "enqueue" in sections:
            secs = plan.enqueue_seconds
            _measure(r, "ref insert loop", lambda: reference.insert_loop(dsn, seconds=secs))
            _measure(r, "enqueue single", lambda: cases.enqueue_single(dsn, seconds=secs))
            _measure(r, "insert plain loop", lambda: cases.insert_plain_loop(dsn, seconds=secs))
            _measure(r, "ref pgbench 100 rows", lambda: reference.pgbench_insert_rows(dsn, rows=100, seconds=secs))
            _measure(r, "enqueue_many 100", lambda: cases.enqueue_many_calls(
                dsn, batch=100, seconds=plan.enqueue_many_seconds))
            _measure(r, "enqueue_many", lambda: cases.enqueue_many_calls(
                dsn, batch=plan.enqueue_many_batch, seconds=plan.enqueue_many_seconds))
            _measure(r, "insert pgbench 100 rows", lambda: cases.insert_rows_baseline(dsn, rows=100, seconds=secs))
            if rep == 0:
                _measure(r, "insert pgbench job_insert", lambda: cases.insert_baseline(
                    dsn, seconds=secs, plain_insert=False))
                _measure(r, "insert pgbench plain", lambda: cases.insert_baseline(
                    dsn, seconds=secs, plain_insert=True))
        if "startup" in sections:
            for n in plan.startup_claimers:
                _measure(r, f"startup {n}", lambda: startup(dsn, claimers=n))
        if peers and "peers" in sections:
            from benchmarks import peers as peers_mod

            _measure(r, f"peer pgworker defaults, {c} claimers", lambda: cases.pgworker_drain(
                dsn, clients=c, batch=None, jobs=plan.peer_jobs, obs=api))
            for name in peers_mod.PEERS:
                if name == "procrastinate" and rep:
                    continue  # slow (about 200 jobs/s): once, on fewer jobs
                n_jobs = plan.procrastinate_jobs if name == "procrastinate" else plan.peer_jobs
                for label, settings in peers_mod.configurations(name):
                    _measure(r, f"peer {name} {label}", lambda: peers_mod.drain(
                        name, dsn, jobs=n_jobs, settings=settings))
        if "matrix" in sections:
            for cl in plan.matrix_clients:
                for b in plan.batches:
                    n_jobs = plan.drain_jobs[b]
                    _measure(r, f"ceiling c{cl} b{b}", lambda: cases.sql_ceiling(dsn, clients=cl, batch=b, jobs=n_jobs))
                    _measure(r, f"plain c{cl} b{b}", lambda: cases.plain(dsn, clients=cl, batch=b, jobs=n_jobs))
                    _measure(r, f"pgworker c{cl} b{b}",
                             lambda: cases.pgworker_drain(dsn, clients=cl, batch=b, jobs=n_jobs, obs=sdk))
                _measure(r, f"pgworker c{cl} auto",
                         lambda: cases.pgworker_drain(dsn, clients=cl, batch=None, jobs=plan.drain_jobs[None], obs=sdk))
                if before:
                    for b in (None, max(plan.batches)):
                        _measure(r, f"before c{cl} {'auto' if b is None else f'b{b}'}",
                                 lambda: cases.pgworker_drain(dsn, clients=cl, batch=b, jobs=plan.drain_jobs[b],
                                                              obs=sdk, code_root=before))
        if "traps" in sections:  # every repetition: a trap's figure is a ratio to the plain drain beside it
            for trap in ("none", "scheduled", "finished"):
                _measure(r, f"trap {trap}", lambda: cases.trap_drain(
                    dsn, clients=c, due=plan.trap_due, trap=trap, trap_rows=plan.trap_rows, obs=api))
        if rep:
            continue  # the rest: once (the held snapshot's long fills, or figures that are not ratios)
        if "snapshot" in sections:
            _measure(r, "snapshot growth", lambda: snapshot_growth(
                dsn, jobs=max(plan.snap_milestones) + max(plan.snap_milestones) // 10,
                milestones=plan.snap_milestones, budget_seconds=plan.snap_budget, clients=c, obs=api))
        if "traps" in sections:
            for trap in ("snapshot",):
                _measure(r, f"trap {trap}", lambda: cases.trap_drain(
                    dsn, clients=c, due=plan.trap_due, trap=trap, trap_rows=plan.trap_rows, obs=api))
        if "latency" in sections:
            _measure(r, "latency listen", lambda: cases.wakeup_latency(
                dsn, listen=True, jobs=plan.latency_jobs, mean_gap=plan.latency_gap, poll_interval=plan.poll_interval))
            _measure(r, "latency poll", lambda: cases.wakeup_latency(
                dsn, listen=False, jobs=plan.poll_jobs, mean_gap=plan.poll_gap, poll_interval=plan.poll_interval))
        if "idle" in sections:
            for key, root in (("idle fleet", None), ("idle fleet before", before)):
                if key.endswith("before") and not before:
                    continue
                _measure(r, key, lambda: cases.idle_fleet(dsn, pods=plan.idle_pods, claimers=plan.idle_claimers,
                                                          seconds=plan.idle_seconds, code_root=root))
        if "growth" in sections:
            for due, finished in plan.growth:
                _measure(r, f"growth due {due} finished {finished}", lambda: cases.pgworker_drain(
                    dsn, clients=c, batch=None, jobs=due, finished=finished, obs=sdk))
                _measure(r, f"growth ceiling due {due} finished {finished}", lambda: cases.growth_ceiling(
                    dsn, clients=c, due=due, finished=finished))
        if "scale" in sections:
            for pods in plan.scale_pods:
                _measure(r, f"scale {pods} pods", lambda: cases.scale_out(
                    dsn, pods=pods, claimers=plan.scale_claimers, jobs=plan.scale_jobs, obs=api))
    return r


def checkout(ref: str) -> str:
    """A checkout of ``ref`` under benchmarks/.compare/ (made once, with git worktree)."""
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", ref], capture_output=True, text=True,
                         check=True).stdout.strip()
    path = os.path.join(HERE, ".compare", sha)
    if not os.path.isdir(os.path.join(path, "pgworker")):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "--force", path, sha], check=True,
                       capture_output=True)
    return path


def machine(dsn: str) -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                            "platform": platform.platform()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
        with open("/proc/meminfo") as f:
            info["memory_gib"] = round(int(f.readline().split()[1]) / 1024 / 1024, 1)
        info["load_average"] = list(os.getloadavg())
    except OSError:
        pass
    with connect(dsn) as conn:
        for name in ("server_version", "synchronous_commit", "shared_buffers", "fsync", "wal_level",
                     "max_connections"):
            info[f"pg_{name}"] = conn.execute(f"SHOW {name}").fetchone()[0]
    try:
        info["pgworker_commit"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                                 capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", help="PostgreSQL to measure (default PGWORKER_BENCH_DSN, PGWORKER_DSN, "
                                 "else postgresql://postgres@127.0.0.1:5432/test)")
    p.add_argument("--quick", action="store_true", help="a smoke run: fewer cases, less work, one repetition")
    p.add_argument("--smallest", action="store_true", help="only the smallest case of each section (for tests)")
    p.add_argument("--repeat", type=int, help="repetitions (median reported)")
    p.add_argument("--sections", default=None,
                   help=f"comma-separated sections: of {', '.join(SECTIONS)} (the default run, peers with "
                        f"--peers), and the optional {', '.join(OPTIONAL)}")
    p.add_argument("--peers", action="store_true",
                   help="also Procrastinate and PGQueuer, each in its own virtualenv under benchmarks/.peers/")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="folder for the JSON and Markdown results")
    p.add_argument("--compare-with", metavar="REF",
                   help="also measure the pgworker of this git commit (matrix and idle sections), side by side "
                        "in the same run; checked out under benchmarks/.compare/ (git-ignored)")
    args = p.parse_args(argv)
    plan = SMALLEST if args.smallest else QUICK if args.quick else FULL
    if args.repeat:
        plan.repeat = args.repeat
    if args.sections is None:  # the smoke test runs the optional sections too, so that none rots
        args.sections = ",".join(s for s in SECTIONS + (OPTIONAL if args.smallest else ()) if s != "peers")
    sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = set(sections) - set(SECTIONS) - set(OPTIONAL)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS + OPTIONAL)}")
    if args.peers and "peers" not in sections:
        sections += ("peers",)
    dsn = find_dsn(args.dsn)
    started = dt.datetime.now(dt.timezone.utc)
    info = machine(dsn)
    _log(f"benchmarking {info.get('pg_server_version')} on {info.get('cpus')} CPUs "
         f"({'smallest' if args.smallest else 'quick' if args.quick else 'full'} plan)")
    before = checkout(args.compare_with) if args.compare_with else None
    if before:
        info["compared_with"] = args.compare_with
    results = run(dsn, plan, sections, args.peers, before)
    info["load_average_after"] = list(os.getloadavg())
    info["duration_seconds"] = round((dt.datetime.now(dt.timezone.utc) - started).total_seconds())
    doc = {"started": started.isoformat(timespec="seconds"),
           "plan": "smallest" if args.smallest else "quick" if args.quick else "full",
           "machine": info, "results": results.as_json(), "errors": results.errors}
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, started.strftime("%Y-%m-%dT%H%M%SZ") + ("-" + doc["plan"] if doc["plan"] != "full" else ""))
    with open(stem + ".json", "w") as f:  # first, so a report bug loses no measurement
        json.dump(doc, f, indent=2, default=str)
    doc["targets"] = targets.targets(doc, plan)
    markdown = report.markdown(doc, plan)
    with open(stem + ".json", "w") as f:
        json.dump(doc, f, indent=2, default=str)
    with open(stem + ".md", "w") as f:
        f.write(markdown)
    print(markdown)
    _log(f"wrote {stem}.json and {stem}.md")
    return 1 if results.errors else 0


if __name__ == "__main__":
    sys.exit(main())
