"""Chaos soak: thousands of jobs, several `pgworker run` processes, faults drawn from a
seed, and invariants checked at the end.

    python benchmarks/chaos.py --jobs 20000 --faults 110 --duration 720 --seed 7

What it builds (all on this machine, all torn down at the end):

- a THROWAWAY PostgreSQL cluster (initdb/pg_ctl as ``postgres`` via runuser, a free port;
  the shared server on 5432 is never stopped), holding the jobs; a trigger the harness
  installs logs every state or fencing-token change of every job to ``transitions``;
- a TCP proxy on loopback (``tests/proxy.py``) between the workers and that cluster;
- an external ledger: a schema in the shared server (``LEDGER_DSN``) where every
  execution of the chaos task records (job, fencing token, attempt, idempotency key);
- ``--workers`` `pgworker run` processes (``tests/apps/chaos_app.py``), each with its own
  metrics port and multiprocess directory;
- a producer that enqueues the jobs in batches throughout the run (a batch whose commit
  reply was lost is confirmed by reading the batch back, never enqueued twice).

Faults (one every ``duration / faults`` seconds on average, each kind at least once):
kill -9 of a claimer; kill -9 of a dispatcher (its claimers must exit on their own; a new
worker replaces it); SIGSTOP/SIGCONT of a claimer or of a whole worker past the lease;
pg_terminate_backend on random ``pgworker:*`` sessions (listeners included); a restart
(fast or immediate) of the cluster; dropped traffic (every proxied connection reset and
new ones refused for a few seconds).

Invariants: every job enqueued exists once and ends succeeded or dead (none lost, none
stuck); no job has two succeeded transitions; every succeeded job's effect exists under
the succeeding token; every other execution (a duplicate side effect) belongs to an
attempt that ended by losing its lease (reaped, LEASE_EXPIRED) or by its worker dying
(WORKER_DIED, TIMEOUT), and is counted by cause; no two executions share a token; the
workers' /metrics (scraped before each is stopped; a killed worker's counters read from
its multiprocess files) agree with the table; a killed dispatcher's claimers exit.

Exit status 0 when every invariant held, 1 otherwise. ``--json FILE`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "tests")
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from pgcluster import Cluster, free_port  # noqa: E402
from proxy import TcpProxy  # noqa: E402
from worker import Worker  # noqa: E402

CHAOS_APP = os.path.join(TESTS, "apps", "chaos_app.py") + ":app"
SCHEMA = "chaos"
QUEUE = "chaos"
LEDGER_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"

FAULT_KINDS = {  # kind: weight in the random part of the schedule
    "kill9_claimer": 3, "kill9_dispatcher": 1, "sigstop_claimer": 2, "sigstop_worker": 1,
    "terminate_backend": 3, "pg_restart": 1, "proxy_drop": 2,
}

TRANSITIONS_DDL = """
CREATE TABLE {s}.transitions (
    id bigserial PRIMARY KEY, job_id bigint NOT NULL, old_state text, new_state text,
    old_token bigint, new_token bigint, old_attempts int, new_attempts int, error_code text,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION {s}.log_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state IS DISTINCT FROM OLD.state OR NEW.lease_token IS DISTINCT FROM OLD.lease_token THEN
        INSERT INTO {s}.transitions (job_id, old_state, new_state, old_token, new_token,
                                     old_attempts, new_attempts, error_code)
        VALUES (NEW.id, OLD.state, NEW.state, OLD.lease_token, NEW.lease_token,
                OLD.attempts, NEW.attempts, NEW.last_error_code);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_log_transition AFTER UPDATE ON {s}.jobs
    FOR EACH ROW EXECUTE FUNCTION {s}.log_transition();
"""

LEDGER_DDL = """
CREATE SCHEMA {s};
CREATE TABLE {s}.effects (
    job_id bigint NOT NULL, n int NOT NULL, idempotency_key text NOT NULL, attempt int NOT NULL,
    lease_token bigint NOT NULL, pid int NOT NULL, times int NOT NULL DEFAULT 1,
    at timestamptz NOT NULL DEFAULT clock_timestamp(), PRIMARY KEY (job_id, lease_token));
"""


@dataclass
class SoakConfig:
    jobs: int = 3000
    faults: int = 30
    duration: float = 120.0
    """Seconds over which faults are spread and jobs enqueued."""
    workers: int = 3
    concurrency: int = 2
    seed: int = 1
    lease: float = 4.0
    reap_interval: float = 2.0
    settle_timeout: float = 300.0
    ledger_dsn: str = LEDGER_DEFAULT
    log_dir: str | None = None
    quiet: bool = False


@dataclass
class WorkerSlot:
    name: str
    worker: Worker
    metrics_port: int
    metrics_dir: str
    started: float = field(default_factory=time.time)
    killed: bool = False
    stopped_until: float = 0.0
    final_scrape: str | None = None
    exit_code: int | None = None


@dataclass
class Report:
    config: dict[str, Any]
    seed: int
    jobs_expected: int = 0
    jobs_in_table: int = 0
    succeeded: int = 0
    dead: int = 0
    dead_poison: int = 0
    dead_other: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    stuck: int = 0
    duplicated_jobs: int = 0
    enqueue_batches_confirmed_after_error: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    executions: int = 0
    duplicates: int = 0
    duplicates_by_cause: dict[str, int] = field(default_factory=dict)
    double_succeeded: int = 0
    same_token_reruns: int = 0
    succeeded_without_effect: int = 0
    released_but_ran: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    orphans: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    worker_exit_codes: list[int | None] = field(default_factory=list)
    duration_seconds: float = 0.0
    settle_seconds: float = 0.0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


class Soak:
    def __init__(self, config: SoakConfig) -> None:
        self.c = config
        self.rng = random.Random(config.seed)
        self.report = Report(config=asdict(config), seed=config.seed)
        self.slots: list[WorkerSlot] = []
        self.lock = threading.Lock()
        self.timers: list[threading.Thread] = []
        self.cluster: Cluster | None = None
        self.proxy: TcpProxy | None = None
        self.ledger_schema = f"chaos_ledger_{os.getpid()}_{config.seed}"
        self.log_dir = config.log_dir or os.path.join("/tmp", f"pgworker-chaos-{os.getpid()}")
        os.makedirs(self.log_dir, exist_ok=True)
        self.enqueued_batches: dict[int, int] = {}
        self.producer_done = threading.Event()
        self.worker_seq = 0

    def say(self, msg: str) -> None:
        if not self.c.quiet:
            print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    # -- set-up -----------------------------------------------------------------------

    def setup(self) -> None:
        self.cluster = Cluster(settings={"max_connections": "300"})
        self.cluster.start()
        self.direct_dsn = self.cluster.dsn()
        self.proxy = TcpProxy("127.0.0.1", self.cluster.port)
        self.worker_dsn = self.proxy.dsn_for(self.direct_dsn)
        from pgworker import App

        app = App(self.direct_dsn, schema=SCHEMA)
        app.migrate()
        app.close()
        with psycopg.connect(self.direct_dsn, autocommit=True) as c:
            c.execute(sql.SQL(TRANSITIONS_DDL).format(s=sql.Identifier(SCHEMA)))
        with psycopg.connect(self.c.ledger_dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.ledger_schema)))
            c.execute(sql.SQL(LEDGER_DDL).format(s=sql.Identifier(self.ledger_schema)))
        self.say(f"cluster on port {self.cluster.port}, proxy on {self.proxy.port}, ledger schema "
                 f"{self.ledger_schema}, logs in {self.log_dir}")

    def start_worker(self) -> WorkerSlot:
        self.worker_seq += 1
        name = f"w{self.worker_seq}"
        port = free_port()
        mdir = os.path.join(self.log_dir, f"metrics-{name}")
        c = self.c
        w = Worker(self.worker_dsn, SCHEMA, "--concurrency", str(c.concurrency), "--lease", f"{c.lease}s",
                   "--reap-interval", f"{c.reap_interval}s", "--poll-interval", "1s",
                   "--shutdown-grace", "10s", "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
                   "--metrics-dir", mdir, "--no-tracing",
                   app=CHAOS_APP, log_dir=self.log_dir, name=name,
                   env={"LEDGER_DSN": c.ledger_dsn, "LEDGER_SCHEMA": self.ledger_schema})
        slot = WorkerSlot(name, w, port, mdir)
        with self.lock:
            self.slots.append(slot)
        return slot

    def live_slots(self) -> list[WorkerSlot]:
        with self.lock:
            return [s for s in self.slots if not s.killed and s.worker.proc.poll() is None]

    # -- the producer -------------------------------------------------------------------

    def job_payloads(self) -> list[dict[str, Any]]:
        out = []
        for n in range(self.c.jobs):
            r = self.rng.random()
            kind = "poison" if r < 0.02 else "fail_first" if r < 0.07 else "ok"
            r = self.rng.random()
            sleep = 0.0 if r < 0.90 else self.rng.uniform(0, 0.05) if r < 0.97 else self.rng.uniform(0.5, 3.0)
            out.append({"n": n, "kind": kind, "sleep": round(sleep, 3)})
        return out

    def enqueue_batch(self, b: int, payloads: list[dict[str, Any]]) -> None:
        """Enqueue one batch in one transaction, surviving faults: after an error, the
        batch is read back; enqueued again only if it is absent (never twice)."""
        from pgworker import App
        from pgworker.loader import load_app

        for p in payloads:
            p["b"] = b
        app = App(self.direct_dsn, schema=SCHEMA)
        app.tasks.update(load_app(CHAOS_APP).tasks)  # the task's queue and max_attempts
        delay = 0.2
        try:
            while True:
                try:
                    with psycopg.connect(self.direct_dsn, application_name="chaos-producer",
                                         connect_timeout=5) as conn:
                        if b in self.enqueued_batches:  # an earlier try failed mid-commit
                            found = conn.execute(sql.SQL("SELECT count(*) FROM {}.jobs WHERE payload->>'b' = %s")
                                                 .format(sql.Identifier(SCHEMA)), [str(b)]).fetchone()[0]
                            conn.rollback()
                            if found == len(payloads):
                                self.report.enqueue_batches_confirmed_after_error += 1
                                return
                            if found:
                                raise AssertionError(f"batch {b} is half there: {found}/{len(payloads)}")
                        self.enqueued_batches[b] = len(payloads)
                        with conn.transaction():
                            app.enqueue_many([("effect", p) for p in payloads], conn=conn)
                    return
                except psycopg.Error:
                    time.sleep(delay)
                    delay = min(2.0, delay * 2)
                except Exception as exc:  # DatabaseUnavailable and friends from pgworker
                    if type(exc).__name__ not in ("DatabaseUnavailable",):
                        raise
                    time.sleep(delay)
                    delay = min(2.0, delay * 2)
        finally:
            app.close()

    def producer(self, payloads: list[dict[str, Any]], start_index: int, batch: int, spread: float) -> None:
        try:
            chunks = [payloads[i:i + batch] for i in range(start_index, len(payloads), batch)]
            t0 = time.monotonic()
            for i, chunk in enumerate(chunks):
                due = t0 + spread * i / max(1, len(chunks))
                time.sleep(max(0.0, due - time.monotonic()))
                self.enqueue_batch(1000 + i, chunk)
        finally:
            self.producer_done.set()

    # -- faults ---------------------------------------------------------------------------

    def schedule(self) -> list[tuple[float, str]]:
        kinds = list(FAULT_KINDS)
        self.rng.shuffle(kinds)
        n = self.c.faults
        chosen = kinds[:n] + self.rng.choices(list(FAULT_KINDS), weights=list(FAULT_KINDS.values()),
                                              k=max(0, n - len(kinds)))
        start = min(5.0, self.c.duration * 0.1)
        times = sorted(self.rng.uniform(start, self.c.duration * 0.9) for _ in range(n))
        return list(zip(times, chosen))

    def record_fault(self, kind: str, **detail: Any) -> None:
        self.report.faults[kind] = self.report.faults.get(kind, 0) + 1
        self.report.fault_log.append({"at": round(time.time() - self.t0, 2), "kind": kind, **detail})
        self.say(f"fault {kind} {detail}")

    def later(self, seconds: float, fn: Any) -> None:
        t = threading.Timer(seconds, fn)
        t.daemon = True
        t.start()
        self.timers.append(t)

    def pick(self, running_only: bool = True) -> WorkerSlot | None:
        now = time.time()
        cands = [s for s in self.live_slots() if not running_only or s.stopped_until < now]
        return self.rng.choice(cands) if cands else None

    def inject(self, kind: str) -> None:
        c = self.c
        stop_for = c.lease + c.reap_interval + 2.0
        if kind in ("kill9_claimer", "sigstop_claimer"):
            slot = self.pick()
            pids = slot.worker.claimer_pids() if slot else []
            if not pids:
                return self.inject("terminate_backend")
            pid = self.rng.choice(pids)
            if kind == "kill9_claimer":
                os.kill(pid, signal.SIGKILL)
                self.record_fault(kind, worker=slot.name, pid=pid)
            else:
                os.kill(pid, signal.SIGSTOP)
                self.later(stop_for, lambda: _signal(pid, signal.SIGCONT))
                self.record_fault(kind, worker=slot.name, pid=pid, seconds=stop_for)
        elif kind == "sigstop_worker":
            slot = self.pick()
            if slot is None:
                return self.inject("terminate_backend")
            slot.stopped_until = time.time() + stop_for
            slot.worker.signal_group(signal.SIGSTOP)
            self.later(stop_for, lambda: _signal_group(slot.worker.pid, signal.SIGCONT))
            self.record_fault(kind, worker=slot.name, seconds=stop_for)
        elif kind == "kill9_dispatcher":
            slot = self.pick()
            if slot is None:
                return self.inject("terminate_backend")
            claimers = slot.worker.claimer_pids()
            slot.killed = True
            slot.worker.signal(signal.SIGKILL)
            slot.worker.proc.wait()
            killed_at = time.monotonic()
            self.record_fault(kind, worker=slot.name, pid=slot.worker.pid, claimers=claimers)
            threading.Thread(target=self.watch_orphans, args=(slot.name, claimers, killed_at), daemon=True).start()
            self.start_worker()
        elif kind == "terminate_backend":
            rows = self.cluster.execute(
                "SELECT pid, application_name FROM pg_stat_activity WHERE application_name LIKE 'pgworker:%%'")
            if not rows:
                return
            listeners = [r for r in rows if r[1] == "pgworker:listener"]
            targets = self.rng.sample(rows, k=min(len(rows), self.rng.randint(1, 3)))
            if listeners and self.rng.random() < 0.4:
                targets.append(self.rng.choice(listeners))
            for pid, _ in targets:
                self.cluster.execute("SELECT pg_terminate_backend(%s)", [pid])
            self.record_fault(kind, sessions=sorted({r[1] for r in targets}))
        elif kind == "pg_restart":
            mode = self.rng.choice(["fast", "immediate"])
            down_for = round(self.rng.uniform(1.0, 6.0), 1)
            down, up = self.cluster.restart(mode, down_for)
            self.record_fault(kind, mode=mode, down_seconds=round(up - down, 1))
            entry = {"mode": mode, "down_at": down, "up_at": up, "down_seconds": round(up - down, 2)}
            self.report.restarts.append(entry)
            threading.Thread(target=self.watch_ready, args=(entry,), daemon=True).start()
        elif kind == "proxy_drop":
            seconds = round(self.rng.uniform(0.5, 4.0), 1)
            cut = self.proxy.drop(seconds)
            self.record_fault(kind, seconds=seconds, connections_reset=cut)

    def watch_orphans(self, name: str, pids: list[int], killed_at: float) -> None:
        """A killed dispatcher's claimers must notice and exit on their own."""
        deadline = killed_at + max(60.0, self.c.lease * 10)
        alive = set(pids)
        while alive and time.monotonic() < deadline:
            alive = {p for p in alive if _alive(p)}
            time.sleep(0.2)
        entry = {"worker": name, "claimers": len(pids), "left_alive": sorted(alive),
                 "exited_within_seconds": round(time.monotonic() - killed_at, 1)}
        self.report.orphans.append(entry)
        for p in alive:  # do not leave them behind
            _signal(p, signal.SIGKILL)

    def watch_ready(self, entry: dict[str, Any]) -> None:
        """Seconds from the cluster being back until every running worker says ready."""
        deadline = time.time() + 180
        while time.time() < deadline:
            now = time.time()
            slots = [s for s in self.live_slots() if s.stopped_until < now]
            if slots and all(_http(s.metrics_port, "/readyz")[0] == 200 for s in slots):
                entry["all_ready_after_seconds"] = round(time.time() - entry["up_at"], 2)
                return
            time.sleep(0.25)
        entry["all_ready_after_seconds"] = None

    # -- the run --------------------------------------------------------------------------

    def run(self) -> Report:
        self.t0 = time.time()
        try:
            self.setup()
            payloads = self.job_payloads()
            first = max(1, len(payloads) // 10)
            for i in range(0, first, 500):
                self.enqueue_batch(i // 500, payloads[i:min(first, i + 500)])
            for _ in range(self.c.workers):
                self.start_worker()
            producer = threading.Thread(target=self.producer,
                                        args=(payloads, first, 50, self.c.duration * 0.8), daemon=True)
            producer.start()
            t_start = time.monotonic()
            for at, kind in self.schedule():
                time.sleep(max(0.0, t_start + at - time.monotonic()))
                try:
                    self.inject(kind)
                except Exception as exc:
                    self.report.violations.append(f"harness: injecting {kind} failed: {exc!r}")
            time.sleep(max(0.0, t_start + self.c.duration - time.monotonic()))
            producer.join()
            for t in self.timers:
                t.join()
            self.say("faults over; waiting for every job to finish")
            settle0 = time.monotonic()
            self.wait_settled()
            self.report.settle_seconds = round(time.monotonic() - settle0, 1)
            time.sleep(1.0)
            self.stop_workers()
            self.check()
        finally:
            self.report.duration_seconds = round(time.time() - self.t0, 1)
            self.teardown()
        return self.report

    def wait_settled(self) -> None:
        deadline = time.monotonic() + self.c.settle_timeout
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.direct_dsn) as c:
                    left = c.execute(sql.SQL("SELECT count(*) FROM {}.jobs WHERE state IN ('pending', 'running')")
                                     .format(sql.Identifier(SCHEMA))).fetchone()[0]
                if left == 0:
                    return
            except psycopg.Error:
                pass
            time.sleep(0.5)

    def stop_workers(self) -> None:
        for s in list(self.slots):
            if s.killed:
                continue
            for _ in range(5):  # a loaded machine can be slow to answer: retry, generously
                status, s.final_scrape = _http(s.metrics_port, "/metrics", timeout=15.0)
                if status == 200:
                    break
                s.final_scrape = None
                time.sleep(1.0)
            s.exit_code = s.worker.stop(timeout=60)
        self.report.worker_exit_codes = [s.exit_code for s in self.slots if not s.killed]

    def teardown(self) -> None:
        for s in self.slots:
            try:
                _signal_group(s.worker.pid, signal.SIGCONT)
                s.worker.kill()
                s.worker.log.close()
            except Exception:
                pass
        if self.proxy:
            self.proxy.close()
        if self.cluster:
            self.cluster.destroy()
        try:
            with psycopg.connect(self.c.ledger_dsn, autocommit=True) as c:
                c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.ledger_schema)))
        except psycopg.Error:
            pass

    # -- invariants -----------------------------------------------------------------------

    def check(self) -> None:
        r = self.report
        v = r.violations
        ident = sql.Identifier(SCHEMA)
        with psycopg.connect(self.direct_dsn) as c:
            jobs = c.execute(sql.SQL("SELECT id, (payload->>'n')::int, payload->>'kind', state::text, "
                                     "last_error_code, lease_token FROM {}.jobs").format(ident)).fetchall()
            trans = c.execute(sql.SQL("SELECT job_id, old_state, new_state, old_token, new_token, old_attempts, "
                                      "new_attempts, error_code, extract(epoch FROM at)::float8 FROM {}.transitions "
                                      "ORDER BY id").format(ident)).fetchall()
        with psycopg.connect(self.c.ledger_dsn) as c:
            effects = c.execute(sql.SQL("SELECT job_id, n, lease_token, times FROM {}.effects")
                                .format(sql.Identifier(self.ledger_schema))).fetchall()

        expected = self.c.jobs
        r.jobs_expected = expected
        r.jobs_in_table = len(jobs)
        by_n: dict[int, list[tuple]] = defaultdict(list)
        for j in jobs:
            by_n[j[1]].append(j)
        r.lost = sum(1 for n in range(expected) if n not in by_n)
        r.duplicated_jobs = sum(len(js) - 1 for js in by_n.values() if len(js) > 1)
        states = Counter(j[3] for j in jobs)
        r.succeeded, r.dead = states.get("succeeded", 0), states.get("dead", 0)
        r.stuck = sum(n for s, n in states.items() if s not in ("succeeded", "dead"))
        r.dead_poison = sum(1 for j in jobs if j[3] == "dead" and j[2] == "poison")
        r.dead_other = dict(Counter(j[4] for j in jobs if j[3] == "dead" and j[2] != "poison"))
        if r.lost:
            v.append(f"{r.lost} job(s) enqueued but absent from the table (lost)")
        if r.duplicated_jobs:
            v.append(f"{r.duplicated_jobs} job(s) enqueued twice")
        if r.stuck:
            v.append(f"{r.stuck} job(s) neither succeeded nor dead after {self.c.settle_timeout} s: {dict(states)}")
        poison_succeeded = sum(1 for j in jobs if j[2] == "poison" and j[3] == "succeeded")
        if poison_succeeded:
            v.append(f"{poison_succeeded} poison job(s) succeeded")

        # how each attempt (job, token) ended
        ended: dict[tuple[int, int], tuple] = {}
        succeeded_tokens: dict[int, list[int]] = defaultdict(list)
        for job_id, old, new, old_tok, new_tok, old_att, new_att, code, at in trans:
            if old == "running" and new != "running":
                ended[(job_id, old_tok)] = (new, code, old_att, new_att)
            if new == "succeeded" and old != "succeeded":
                succeeded_tokens[job_id].append(old_tok)
        r.double_succeeded = sum(1 for toks in succeeded_tokens.values() if len(toks) > 1)
        if r.double_succeeded:
            v.append(f"{r.double_succeeded} job(s) have two succeeded transitions")

        executions: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for job_id, n, token, times in effects:
            executions[job_id].append((token, times))
        r.executions = sum(len(e) for e in executions.values())
        r.same_token_reruns = sum(times - 1 for e in executions.values() for _, times in e if times > 1)
        if r.same_token_reruns:
            v.append(f"{r.same_token_reruns} execution(s) repeated under one fencing token")
        causes: Counter = Counter()
        job_state = {j[0]: j for j in jobs}
        for job_id, execs in executions.items():
            final = succeeded_tokens.get(job_id, [])
            for token, _ in execs:
                if token in final:
                    continue
                end = ended.get((job_id, token))
                if end is None:
                    causes["unexplained (attempt never ended)"] += 1
                    continue
                new_state, code, old_att, new_att = end
                if new_state == "pending" and new_att == old_att - 1:
                    causes["released after running (bug)"] += 1
                elif code == "LEASE_EXPIRED":
                    causes["lease lost (reaped)"] += 1
                elif code in ("WORKER_DIED", "TIMEOUT"):
                    causes["worker died after the effect"] += 1
                else:
                    causes[f"unexplained ({new_state}, {code})"] += 1
        r.duplicates = sum(causes.values())
        r.duplicates_by_cause = dict(causes)
        for cause, n in causes.items():
            if cause.startswith("unexplained") or "bug" in cause:
                v.append(f"{n} duplicate side effect(s): {cause}")
        for job_id, toks in succeeded_tokens.items():
            if toks and toks[-1] not in {t for t, _ in executions.get(job_id, [])}:
                r.succeeded_without_effect += 1
        if r.succeeded_without_effect:
            v.append(f"{r.succeeded_without_effect} job(s) succeeded without their effect under that token")
        final_mismatch = sum(1 for job_id, toks in succeeded_tokens.items()
                             if job_state.get(job_id, (None,) * 4)[3] != "succeeded")
        if final_mismatch:
            v.append(f"{final_mismatch} job(s) succeeded once and left that state afterwards")

        self.check_metrics(succeeded=r.succeeded, dead=r.dead)
        for o in r.orphans:
            if o["left_alive"]:
                v.append(f"claimers {o['left_alive']} of killed dispatcher {o['worker']} did not exit")
        bad_exits = [code for code in r.worker_exit_codes if code != 0]
        if bad_exits:
            v.append(f"workers exited with {bad_exits} at the final SIGTERM")
        with_trans = [x for x in trans if x[2] == "succeeded"]
        for entry in r.restarts:
            after = [x[8] for x in with_trans if x[8] > entry["up_at"]]
            entry["first_completion_after_seconds"] = round(min(after) - entry["up_at"], 2) if after else None

    def check_metrics(self, *, succeeded: int, dead: int) -> None:
        """Counters summed over every worker incarnation: the last HTTP scrape of each
        worker stopped cleanly, and the multiprocess files of each killed one."""
        totals: Counter = Counter()
        overrun_sum = 0.0
        overrun_buckets: dict[str, list[tuple[float, float]]] = {}
        for s in self.slots:
            text = s.final_scrape if not s.killed else _read_metrics_dir(s.metrics_dir)
            if text is None and s.killed and not os.path.isdir(s.metrics_dir):
                continue  # killed while starting, before it made its metrics directory: it ran nothing
            if text is None:
                self.report.violations.append(f"no metrics from worker {s.name}")
                continue
            for name, labels, value in _samples(text):
                if name == "pgworker_jobs_finished_total":
                    totals[f"finished_{labels.get('outcome')}"] += value
                elif name == "pgworker_lease_expirations_total":
                    totals[f"expired_{labels.get('action')}"] += value
                elif name == "pgworker_fenced_writes_total":
                    totals["fenced_writes"] += value
                    totals[f"fenced_{labels.get('operation')}"] += value
                elif name == "pgworker_listener_reconnects_total":
                    totals["listener_reconnects"] += value
                elif name == "pgworker_lease_overrun_seconds_count":
                    totals["overrun_count"] += value
                elif name == "pgworker_lease_overrun_seconds_sum":
                    overrun_sum += value
                elif name == "pgworker_lease_overrun_seconds_bucket" and value:
                    # buckets are cumulative: the smallest bound holding every observation of
                    # this worker bounds its largest window
                    overrun_buckets.setdefault(s.name, []).append((float(labels["le"]), value))
        m = {k: int(v) for k, v in sorted(totals.items())}
        # the duplicate-execution window: how long attempts whose writes were refused ran past
        # their lease (pgworker_lease_overrun_seconds); the largest is bounded by a bucket
        worst = 0.0
        for buckets in overrun_buckets.values():
            top = max(v for _, v in buckets)
            worst = max(worst, min(le for le, v in buckets if v >= top))
        m["overrun_max_bucket_seconds"] = worst
        m["overrun_mean_seconds"] = round(overrun_sum / totals["overrun_count"], 2) if totals["overrun_count"] else 0
        m["table_succeeded"] = succeeded
        m["table_dead"] = dead
        m["metrics_succeeded"] = int(totals["finished_succeeded"])
        m["metrics_dead"] = int(totals["finished_dead"] + totals["expired_dead"])
        self.report.metrics = m
        # A claimer killed between its write's commit and its counter's increment takes
        # that increment with it: the only permitted gap, bounded by the kills' batches.
        kills = self.report.faults.get("kill9_claimer", 0) + self.report.faults.get("kill9_dispatcher", 0)
        slack = kills * 100
        for what, got, want in (("succeeded", m["metrics_succeeded"], succeeded),
                                ("dead", m["metrics_dead"], dead)):
            if got > want or want - got > slack:
                self.report.violations.append(f"metrics count {got} {what} jobs, the table {want}")


# -- helpers -------------------------------------------------------------------------------


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat[stat.rfind(")") + 2] not in "ZX"
    except OSError:
        return False


def _http(port: int, path: str, timeout: float = 2.0) -> tuple[int, str | None]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except Exception:
        return 0, None


def _read_metrics_dir(path: str) -> str | None:
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    if not os.path.isdir(path):
        return None
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=path)
    return generate_latest(registry).decode()


def _samples(text: str):
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            yield s.name, s.labels, s.value


def _window_bound(c: dict[str, Any]) -> str:
    """What the settings promise: a handler is told its lease is lost within the lease of
    its last renewal plus the supervisor's tick; a cooperative handler (it checks
    ctx.lease_lost) then stops, so the window is about that tick; one that does not stop
    runs on until its hard limit, and its write is refused."""
    return (f"told within {c['lease']:g} s + 0.2 s of the last renewal; a handler that ignores it "
            "runs until its own end or its hard limit")


def format_table(r: Report) -> str:
    c = r.config
    lines = [
        f"pgworker chaos soak: seed {r.seed}, {c['workers']} workers x {c['concurrency']} claimers, "
        f"lease {c['lease']:g} s, reap every {c['reap_interval']:g} s, faults over {c['duration']:g} s, "
        f"total {r.duration_seconds:g} s (then {r.settle_seconds:g} s until every job had finished)",
        "",
        "| figure | value |", "|---|---|",
        f"| jobs enqueued | {r.jobs_expected} |",
        f"| jobs succeeded | {r.succeeded} |",
        f"| jobs dead (poison, by design) | {r.dead_poison} |",
        f"| jobs dead (other) | {sum(r.dead_other.values())} {r.dead_other or ''} |",
        f"| lost | {r.lost} |",
        f"| stuck (not succeeded or dead) | {r.stuck} |",
        f"| enqueued twice | {r.duplicated_jobs} |",
        f"| faults injected | {sum(r.faults.values())} |",
    ]
    for kind in FAULT_KINDS:
        lines.append(f"| &nbsp;&nbsp;{kind} | {r.faults.get(kind, 0)} |")
    lines += [
        f"| handler executions (ledger rows) | {r.executions} |",
        f"| duplicate side effects | {r.duplicates} |",
    ]
    for cause, n in sorted(r.duplicates_by_cause.items()):
        lines.append(f"| &nbsp;&nbsp;{cause} | {n} |")
    m = r.metrics
    lines += [
        f"| jobs with two succeeded transitions | {r.double_succeeded} |",
        f"| executions repeated under one token | {r.same_token_reruns} |",
        f"| fenced writes (metrics) | {m.get('fenced_writes', 0)} |",
        f"| duplicate-execution window of refused writes: count, mean, max (bucket bound) | "
        f"{m.get('overrun_count', 0)}, {m.get('overrun_mean_seconds', 0)} s, <= {m.get('overrun_max_bucket_seconds', 0):g} s "
        f"(bound from the settings: {_window_bound(c)}) |",
        f"| lease expirations reaped (metrics) | {m.get('expired_requeued', 0) + m.get('expired_dead', 0)} |",
        f"| succeeded: metrics / table | {m.get('metrics_succeeded')} / {m.get('table_succeeded')} |",
        f"| dead: metrics / table | {m.get('metrics_dead')} / {m.get('table_dead')} |",
        f"| enqueue batches confirmed after a lost reply | {r.enqueue_batches_confirmed_after_error} |",
    ]
    if r.orphans:
        worst = max(o["exited_within_seconds"] for o in r.orphans)
        lines.append(f"| killed dispatchers: claimers exited on their own within | {worst:g} s (max) |")
    lines += ["", "| PostgreSQL restart | mode | down (s) | first completion after (s) | all workers ready after (s) |",
              "|---|---|---|---|---|"]
    for i, e in enumerate(r.restarts, 1):
        lines.append(f"| {i} | {e['mode']} | {e['down_seconds']} | {e.get('first_completion_after_seconds')} | "
                     f"{e.get('all_ready_after_seconds')} |")
    lines += ["", "verdict: " + ("PASS: every invariant held" if r.ok else "FAIL:\n  - " + "\n  - ".join(r.violations))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--faults", type=int, default=30)
    p.add_argument("--duration", type=float, default=120.0, help="seconds of faults and enqueueing")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lease", type=float, default=4.0)
    p.add_argument("--reap-interval", type=float, default=2.0)
    p.add_argument("--settle-timeout", type=float, default=300.0)
    p.add_argument("--ledger-dsn", default=os.environ.get("LEDGER_DSN", LEDGER_DEFAULT),
                   help="a server that is NOT restarted, for the external ledger")
    p.add_argument("--log-dir")
    p.add_argument("--json", help="write the report as JSON to this file")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    cfg = SoakConfig(jobs=a.jobs, faults=a.faults, duration=a.duration, workers=a.workers,
                     concurrency=a.concurrency, seed=a.seed, lease=a.lease, reap_interval=a.reap_interval,
                     settle_timeout=a.settle_timeout, ledger_dsn=a.ledger_dsn, log_dir=a.log_dir, quiet=a.quiet)
    report = Soak(cfg).run()
    print(format_table(report))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(asdict(report), f, indent=2, default=str)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
