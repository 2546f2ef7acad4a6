"""Claim + complete throughput of no-op jobs under each scheduling policy, in one run.

    python benchmarks/claim_policies.py [--dsn DSN] [--jobs 20000] [--claimers 4] [--batch 10]

For each configuration a fresh schema is migrated and filled with ``--jobs`` no-op jobs;
then ``--claimers`` processes (each with its own connection) claim batches with the
store's claim (``Store.claim_batch``, the statement ``pgworker run`` uses) and complete
them (``Store.complete``), until the queue is empty. Reported: jobs per second from the
first claim to the last completion, the ratio to the plain claim, and the mean claim
latency. Configurations:

  plain                  no policy (the queue has no row)
  aging                  priority aging on (bound 1 s; mixed priorities, so the aged arm
                         takes over as the backlog ages)
  keys, many             ordering keys, jobs/10 keys of 10 jobs each
  keys, few              ordering keys, 8 keys (at most 8 jobs of the queue can run at once)
  concurrency (loose)    a global concurrency limit far above what runs (the cost of the
                         queue lock and the running count)
  concurrency 8          a global concurrency limit of 8 running jobs (binding)
  rate (loose)           a rate limit far above the throughput (the cost of the bucket)
  rate 500/s             a binding rate limit of 500 jobs/s, burst 50

Self-contained: it needs only pgworker and a PostgreSQL it may create schemas in (they
are dropped at the end). The numbers are noisy on a shared machine; --repeat N runs each
configuration N times (interleaved rounds) and reports the median throughput, and the
median of the per-round ratios to the plain claim (each ratio taken under one load).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgworker import App, JobSpec
from pgworker.migrate import drop_schema

DEFAULT_DSN = os.environ.get("PGWORKER_TEST_DSN") or os.environ.get("PGWORKER_DSN") or \
    "postgresql://postgres@127.0.0.1:5432/test"


@dataclass(frozen=True)
class Config:
    name: str
    keys: int | None = None          # ordering keys (None: no key)
    aging: float | None = None
    concurrency: int | None = None
    rate: float | None = None
    burst: float | None = None
    priorities: bool = False


def configs(jobs: int) -> list[Config]:
    return [
        Config("plain"),
        Config("aging", aging=1.0, priorities=True),
        Config("keys, many", keys=max(1, jobs // 10)),
        Config("keys, few", keys=8),
        Config("concurrency (loose)", concurrency=1_000_000),
        Config("concurrency 8", concurrency=8),
        Config("rate (loose)", rate=1e9, burst=1e9),
        Config("rate 500/s", rate=500.0, burst=50.0),
    ]


@dataclass
class Result:
    config: str
    seconds: list[float] = field(default_factory=list)
    claim_ms: list[float] = field(default_factory=list)

    def rate(self, jobs: int) -> float:
        return jobs / statistics.median(self.seconds)


def prepare(dsn: str, schema: str, cfg: Config, jobs: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        drop_schema(conn, schema)
    app = App(dsn, schema=schema)
    app.migrate()
    if cfg.aging or cfg.concurrency or cfg.rate:
        app.configure_queue("default", **({"aging": cfg.aging} if cfg.aging else {}),
                            **({"concurrency_limit": cfg.concurrency} if cfg.concurrency else {}),
                            **({"rate_limit": cfg.rate, "burst": cfg.burst} if cfg.rate else {}))
    specs = [JobSpec("noop", None, priority=(i % 5) * 10 if cfg.priorities else 0,
                     ordering_key=f"k{i % cfg.keys}" if cfg.keys else None) for i in range(jobs)]
    for start in range(0, jobs, 5000):
        app.enqueue_many(specs[start:start + 5000])
    with app.connection() as conn:
        conn.execute(psycopg.sql.SQL("ANALYZE {}.jobs").format(psycopg.sql.Identifier(schema)))
    app.close()


def claimer(dsn: str, schema: str, batch: int, start: Any, left: Any, out: Any) -> None:
    app = App(dsn, schema=schema)
    store = app.store
    claims = 0
    claim_seconds = 0.0
    with psycopg.connect(dsn, autocommit=True) as conn:
        start.wait()
        limited = False
        while True:
            t0 = time.perf_counter()
            result = store.claim_batch(conn, queue="default", limit=batch, owner=f"bench:{os.getpid()}",
                                       lease_seconds=60, limited=limited)
            claim_seconds += time.perf_counter() - t0
            claims += 1
            limited = result.limited
            if not result.jobs:
                with left.get_lock():
                    if left.value <= 0:
                        break
                time.sleep(result.retry_after_seconds or 0.001)
                continue
            report = store.complete(conn, [j.lease for j in result.jobs], [j.ordering_key for j in result.jobs])
            with left.get_lock():
                left.value -= len(report.accepted)
    out.put((time.perf_counter(), claims, claim_seconds))


def run_once(dsn: str, schema: str, cfg: Config, jobs: int, claimers: int, batch: int) -> tuple[float, float]:
    prepare(dsn, schema, cfg, jobs)
    ctx = multiprocessing.get_context("spawn")
    start, left, out = ctx.Barrier(claimers + 1), ctx.Value("q", jobs), ctx.Queue()
    procs = [ctx.Process(target=claimer, args=(dsn, schema, batch, start, left, out)) for _ in range(claimers)]
    for p in procs:
        p.start()
    start.wait()
    t0 = time.perf_counter()
    ends = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    elapsed = max(e[0] for e in ends) - t0
    claim_ms = 1000 * sum(e[2] for e in ends) / max(1, sum(e[1] for e in ends))
    with psycopg.connect(dsn) as conn:
        done = conn.execute(psycopg.sql.SQL("SELECT count(*) FROM {}.jobs WHERE state = 'succeeded'")
                            .format(psycopg.sql.Identifier(schema))).fetchone()[0]
    if done != jobs:
        raise SystemExit(f"{cfg.name}: {done} of {jobs} jobs succeeded")
    return elapsed, claim_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--claimers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", help="comma-separated configuration names")
    args = parser.parse_args(argv)
    chosen = configs(args.jobs)
    if args.only:
        names = {n.strip() for n in args.only.split(",")}
        chosen = [c for c in chosen if c.name in names]
    schema = f"bench_claim_{os.getpid()}"
    results = {c.name: Result(c.name) for c in chosen}
    print(f"claim+complete of {args.jobs} no-op jobs, {args.claimers} claimer processes, batch {args.batch}, "
          f"{os.cpu_count()} CPUs, repeat {args.repeat}", file=sys.stderr)
    try:
        for _ in range(args.repeat):
            for cfg in chosen:
                seconds, claim_ms = run_once(args.dsn, schema, cfg, args.jobs, args.claimers, args.batch)
                results[cfg.name].seconds.append(seconds)
                results[cfg.name].claim_ms.append(claim_ms)
                print(f"  {cfg.name}: {args.jobs / seconds:,.0f} jobs/s", file=sys.stderr)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            drop_schema(conn, schema)
    plain = results.get("plain")
    print(f"{'configuration':<22} {'jobs/s':>9} {'vs plain':>9} {'claim ms':>9}")
    for r in results.values():
        # the ratio is taken within each round (same load on the machine), then the median
        ratio = (f"{statistics.median(p / s for p, s in zip(plain.seconds, r.seconds)):.2f}"
                 if plain else "-")
        print(f"{r.config:<22} {r.rate(args.jobs):>9,.0f} {ratio:>9} {statistics.median(r.claim_ms):>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
