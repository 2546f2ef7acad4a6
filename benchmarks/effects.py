"""Effects benchmark (issue 20): completion inside the handler's transaction against the
batched completer, and the cost of one durable step record.

    python -m benchmarks.effects [--dsn DSN] [--jobs 2000] [--concurrency 2] [--repeat 3]

Each case runs on a fresh schema: N jobs enqueued with COPY, then `pgworker run --drain`
(real claimer processes) runs them; the rate is N over the time from the first attempt's
start to the last one's finish (database clock), so process start-up is not counted.

- ``insert, batched completer``: the handler inserts a row (one autocommit statement on
  the handler connection); its success is written by the completer, in batches.
- ``insert, ctx.transaction()``: the same insert, and the success written in the same
  transaction (BEGIN, INSERT, job_complete, COMMIT): one commit per job instead of a
  share of a batched one.
- ``steps K``: a handler recording K steps outside a transaction (each a lookup and a
  fenced insert); the per-step cost is (time per job with K steps - time per job with 0) / K.

Prints a Markdown table; nothing is asserted (timings on a shared machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import psycopg
from psycopg import sql

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.common import find_dsn  # noqa: E402

import pgworker  # noqa: E402
from pgworker.config import Settings  # noqa: E402
from pgworker.migrate import drop_schema  # noqa: E402

APP = os.path.join(HERE, "effects_app.py") + ":app"


def run_case(dsn: str, task: str, payload: dict, jobs: int, concurrency: int, tag: str) -> float:
    """Jobs per second of one case (see the module)."""
    schema = f"bench_effects_{tag}_{os.getpid()}"
    app = pgworker.App(settings=Settings(dsn=dsn, schema=schema))
    try:
        app.migrate()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql.SQL("CREATE TABLE {}.bench_orders (id bigserial PRIMARY KEY, job_id bigint)")
                      .format(sql.Identifier(schema)))
        app.enqueue_many([pgworker.JobSpec(task, payload) for _ in range(jobs)], any_task=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PGWORKER_", "OTEL_", "PROMETHEUS_"))}
        env.update(PGWORKER_DSN=dsn, PGWORKER_SCHEMA=schema, PGWORKER_LOG_LEVEL="WARNING")
        subprocess.run([sys.executable, "-m", "pgworker.cli", "run", "--app", APP, "--drain", "--concurrency",
                        str(concurrency), "--metrics-port", "0"], env=env, check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL, timeout=1800)
        with psycopg.connect(dsn, autocommit=True) as c:
            done, seconds = c.execute(sql.SQL(
                "SELECT count(*) FILTER (WHERE state = 'succeeded'), "
                "extract(epoch FROM max(finished_at) - min(started_at)) FROM {}.jobs")
                .format(sql.Identifier(schema))).fetchone()
        if done != jobs:
            raise RuntimeError(f"{task}: {done} of {jobs} jobs succeeded")
        return jobs / float(seconds)
    finally:
        app.close()
        with psycopg.connect(dsn, autocommit=True) as c:
            drop_schema(c, schema)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn")
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args(argv)
    dsn = find_dsn(args.dsn)
    cases = [("insert, batched completer", "insert_batched", {}),
             ("insert, ctx.transaction()", "insert_in_transaction", {}),
             ("steps 0", "steps", {"steps": 0}),
             (f"steps {args.steps}", "steps", {"steps": args.steps})]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    for r in range(args.repeat):  # each repetition runs every case in turn: a noisy neighbour hurts all alike
        for i, (name, task, payload) in enumerate(cases):
            rates[name].append(run_case(dsn, task, payload, args.jobs, args.concurrency, f"{r}_{i}"))
    med = {name: statistics.median(v) for name, v in rates.items()}
    print(f"\n{args.jobs} jobs per case, --concurrency {args.concurrency}, median of {args.repeat}\n")
    print("| case | jobs/s | ms per job (per claimer) |")
    print("|---|---|---|")
    for name, rate in med.items():
        print(f"| {name} | {rate:,.0f} | {1000 * args.concurrency / rate:.3f} |")
    per_step = (args.concurrency / med[f"steps {args.steps}"] - args.concurrency / med["steps 0"]) / args.steps
    ratio = med["insert, ctx.transaction()"] / med["insert, batched completer"]
    print(f"\nctx.transaction() runs at {ratio:.2f}x the batched completer's rate; "
          f"one step record costs {1000 * per_step:.3f} ms of a claimer's time")
    return 0


if __name__ == "__main__":
    t0 = time.monotonic()
    code = main()
    print(f"({time.monotonic() - t0:.0f} s)")
    sys.exit(code)
