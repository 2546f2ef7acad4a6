"""What dependencies cost (issue 21): a completion that unblocks children against one that
does not, a completion that stores a result, and fan-out / fan-in throughput.

    python -m benchmarks.graphs [--dsn DSN] [--jobs 5000] [--batch 100] [--fan 10000] [--repeat 3]
        [--json FILE]

Statement level, on one connection, each batch its own transaction (as a claimer writes
its outcomes): the time of the batched success statement (``job_complete``, with the
trigger that unblocks children) per job, for parents without children, parents with one
child each, parents with one child that is the last parent of nothing (a fan-in's early
parents: a decrement, no unblock), and successes that store a result. Then a fan-out (one
parent, ``--fan`` children: the enqueue, and the one completion that makes them all due)
and a fan-in (``--fan`` parents, one child: the enqueue, and the completions). Each figure
is the median of ``--repeat`` runs on fresh schemas.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

from pgworker import JobSpec
from pgworker.app import App
from pgworker.config import Settings

from .common import BenchSchema, find_dsn


def _app(dsn: str, schema: str) -> App:
    return App(settings=Settings(dsn=dsn, schema=schema))


def _complete_all(app: App, ids: list[int], batch: int, results: bool = False) -> float:
    """Claim the jobs ``ids`` (all due) and complete them in batches; seconds spent in the
    success statements only."""
    spent = 0.0
    with app.connect() as conn:
        remaining = set(ids)
        while remaining:
            jobs = [j for j in app.store.claim(conn, queue="bench", limit=batch, owner="bench", lease_seconds=600)
                    if j.id in remaining]
            if not jobs:
                break
            t0 = time.perf_counter()
            app.store.complete(conn, [j.lease for j in jobs], [None] * len(jobs),
                               ['{"rows":42,"path":"/tmp/x"}'] * len(jobs) if results else None)
            spent += time.perf_counter() - t0
            remaining -= {j.id for j in jobs}
    return spent


def completion_case(dsn: str, kind: str, n: int, batch: int) -> float:
    """Microseconds per job of the batched success, for ``kind`` of parent."""
    with BenchSchema(dsn, "g") as s:
        app = _app(dsn, s.name)
        try:
            if kind == "no children" or kind == "with a result":
                ids = app.enqueue_many([JobSpec("noop", None, queue="bench") for _ in range(n)])
            elif kind == "one child each, unblocked":
                specs = []
                for k in range(n):
                    specs += [JobSpec("noop", None, queue="bench", ref=f"p{k}"),
                              JobSpec("noop", None, queue="children", depends_on=[f"p{k}"])]
                ids = app.enqueue_many(specs)[0::2]
            else:  # one child each, which waits for another parent too: a decrement only
                specs = [JobSpec("noop", None, queue="other", ref="other")]
                for k in range(n):
                    specs += [JobSpec("noop", None, queue="bench", ref=f"p{k}"),
                              JobSpec("noop", None, queue="children", depends_on=[f"p{k}", "other"])]
                ids = app.enqueue_many(specs)[1::2]
            s.q(app.connect(), "VACUUM ANALYZE {s}.jobs")
            seconds = _complete_all(app, ids, batch, results=kind == "with a result")
        finally:
            app.close()
    return seconds / n * 1e6


def fan_out(dsn: str, fan: int) -> dict[str, float]:
    with BenchSchema(dsn, "fo") as s:
        app = _app(dsn, s.name)
        try:
            t0 = time.perf_counter()
            ids = app.enqueue_many([JobSpec("noop", None, queue="bench", ref="root")] +
                                   [JobSpec("noop", None, queue="children", depends_on=["root"]) for _ in range(fan)])
            enqueue = time.perf_counter() - t0
            complete = _complete_all(app, ids[:1], 1)
            with app.connect() as conn:
                due = s.q(conn, "SELECT count(*) FROM {s}.jobs WHERE queue = 'children' AND NOT blocked")[0][0]
            assert due == fan, due
        finally:
            app.close()
    return {"enqueue_jobs_per_s": (fan + 1) / enqueue, "unblock_children_per_s": fan / complete,
            "completion_ms": complete * 1e3}


def fan_in(dsn: str, fan: int, batch: int) -> dict[str, float]:
    with BenchSchema(dsn, "fi") as s:
        app = _app(dsn, s.name)
        try:
            t0 = time.perf_counter()
            parents = app.enqueue_many([JobSpec("noop", None, queue="bench") for _ in range(fan)])
            child = app.enqueue("noop", None, queue="children", depends_on=parents)
            enqueue = time.perf_counter() - t0
            complete = _complete_all(app, parents, batch)
            with app.connect() as conn:
                assert s.q(conn, "SELECT waiting_parents, blocked FROM {s}.jobs WHERE id = %s", [child])[0] == (0, False)
        finally:
            app.close()
    return {"enqueue_jobs_per_s": (fan + 1) / enqueue, "completions_per_s": fan / complete}


def _median(repeat: int, measure: Callable[[], Any]) -> Any:
    runs = [measure() for _ in range(repeat)]
    if isinstance(runs[0], dict):
        return {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn")
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--fan", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args(argv)
    dsn = find_dsn(args.dsn)
    out: dict[str, Any] = {"jobs": args.jobs, "batch": args.batch, "fan": args.fan, "repeat": args.repeat,
                           "completion_us_per_job": {}}
    for kind in ("no children", "with a result", "one child each, unblocked", "one child each, decremented"):
        out["completion_us_per_job"][kind] = _median(args.repeat, lambda: completion_case(dsn, kind, args.jobs,
                                                                                           args.batch))
    out["fan_out"] = _median(args.repeat, lambda: fan_out(dsn, args.fan))
    out["fan_in"] = _median(args.repeat, lambda: fan_in(dsn, min(args.fan, 1000), args.batch))
    print(f"batched success ({args.batch} a statement, {args.jobs} jobs), microseconds per job:")
    for kind, us in out["completion_us_per_job"].items():
        print(f"  {kind:32s} {us:8.1f}")
    fo, fi = out["fan_out"], out["fan_in"]
    print(f"fan-out 1 -> {args.fan}: enqueue {fo['enqueue_jobs_per_s']:,.0f} jobs/s; the completion that unblocks "
          f"them {fo['completion_ms']:.0f} ms ({fo['unblock_children_per_s']:,.0f} children/s)")
    print(f"fan-in {min(args.fan, 1000)} -> 1: enqueue {fi['enqueue_jobs_per_s']:,.0f} jobs/s; "
          f"completions {fi['completions_per_s']:,.0f} parents/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
