"""The console's server time per page on a big table (issue 24).

    python -m benchmarks.web_pages [--finished 1000000] [--pending 100000] [--dead 10000]

Fills a fresh schema with ``--finished`` succeeded jobs spread over the last day,
``--pending`` pending ones (a quarter scheduled later) and ``--dead`` dead ones in five
queues, analyses it, starts a real ``pgworker web`` on it, and asks each page
``--repeat`` times. The time is the console's own (its ``Server-Timing: app;dur=``
header: the request as the server handled it, database included, network excluded).
Prints a Markdown table with the first request (the overview's chart is computed then,
later refreshed in the background) and the median of the others (which the targets are read against), and
writes it with the JSON under ``benchmarks/results/web-<UTC time>``. Targets: every page under 100 ms, the jobs list
with a payload filter under 500 ms. Never asserted by a test (tests/web runs the
smallest size to keep the harness working).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import requests  # noqa: E402
from psycopg import sql  # noqa: E402

from benchmarks.common import BenchSchema, connect, find_dsn  # noqa: E402
from pgworker.web.config import WEB_VARIABLES  # noqa: E402

TARGET_MS = 100.0
WEB_VARIABLE_NAMES = {v[0] for v in WEB_VARIABLES}
PAYLOAD_TARGET_MS = 500.0


def fill(dsn: str, schema: BenchSchema, finished: int, pending: int, dead: int) -> dict[str, int]:
    """The jobs, by generate_series (the console reads them; how they got there is not measured)."""
    with connect(dsn) as c:
        c.execute(_sql(schema,
            "INSERT INTO {s}.jobs (queue, task, payload, state, attempts, started_at, finished_at, created_at) "
            "SELECT 'q' || (i %% 5), 'task_' || (i %% 20), jsonb_build_object('user', i %% 10000, 'order', i), "
            "'succeeded', 1, now() - (i %% 86400) * interval '1 second', now() - (i %% 86400) * interval '1 second', "
            "now() - (i %% 86400) * interval '1 second' - interval '1 second' FROM generate_series(1, %s) AS i"),
            (finished,))
        c.execute(_sql(schema,
            "INSERT INTO {s}.jobs (queue, task, payload, run_at) "
            "SELECT 'q' || (i %% 5), 'task_' || (i %% 20), jsonb_build_object('user', i %% 10000, 'order', i), "
            "now() + (CASE WHEN i %% 4 = 0 THEN 3600 ELSE -(i %% 900) END) * interval '1 second' "
            "FROM generate_series(1, %s) AS i"), (pending,))
        c.execute(_sql(schema,
            "INSERT INTO {s}.jobs (queue, task, payload, state, attempts, finished_at, last_error_code, errors) "
            "SELECT 'q' || (i %% 5), 'task_' || (i %% 7), jsonb_build_object('user', i %% 10000, 'order', i), 'dead', 5, "
            "now() - (i %% 7200) * interval '1 second', 'E_' || (i %% 6), "
            "jsonb_build_array(jsonb_build_object('attempt', 5, 'code', 'E_' || (i %% 6), 'message', 'upstream said no', "
            "'at', now())) FROM generate_series(1, %s) AS i"), (dead,))
        c.execute(_sql(schema,
            "INSERT INTO {s}.jobs (queue, task, payload, state, attempts, lease_owner, lease_token, "
            "lease_expires_at, started_at, heartbeat_at) SELECT 'q' || (i %% 5), 'task_1', '{{}}', 'running', 1, "
            "'bench:1:c0', 1, now() + interval '60 seconds', now(), now() FROM generate_series(1, 50) AS i"), ())
        c.execute(_sql(schema, "VACUUM ANALYZE {s}.jobs"))
        dead_id = c.execute(_sql(schema, "SELECT max(id) FROM {s}.jobs WHERE state = 'dead'")).fetchone()[0]
        running_id = c.execute(_sql(schema, "SELECT max(id) FROM {s}.jobs WHERE state = 'running'")).fetchone()[0]
    return {"dead_id": dead_id, "running_id": running_id}


def pages(ids: dict[str, int]) -> list[tuple[str, str]]:
    return [
        ("overview", "/"),
        ("jobs, newest first", "/jobs"),
        ("jobs, payload filter user=42", "/jobs?payload=user%3D42"),
        ("jobs, payload filter, no match (full window)", "/jobs?payload=%7B%22user%22%3A-1%7D"),
        ("jobs, task filter", "/jobs?task=task_3"),
        ("jobs, state dead", "/jobs?state=dead"),
        ("jobs, pending of a queue in due order", "/jobs?queue=q1&state=pending&sort=due"),
        ("jobs, running by lease expiry", "/jobs?state=running&sort=lease"),
        ("jobs, succeeded by finish time", "/jobs?state=succeeded&sort=finished"),
        ("job (dead)", f"/jobs/{ids['dead_id']}"),
        ("job (running, lease)", f"/jobs/{ids['running_id']}"),
        ("dead jobs, groups", "/dead"),
        ("dead jobs, one group", "/dead?task=task_3&error_code=E_3"),
        ("bulk replay confirmation (count of a group)", "/bulk/new?kind=replay&state=dead&task=task_3&error_code=E_3"),
        ("schedules", "/schedules"),
        ("workers", "/workers"),
        ("bulk operations", "/bulk"),
        ("API: overview", "/api/overview"),
        ("API: jobs, payload filter", "/api/jobs?payload=user%3D42"),
    ]


def server_ms(response: requests.Response) -> float:
    m = re.search(r"app;dur=([\d.]+)", response.headers.get("server-timing", ""))
    if response.status_code != 200 or not m:
        raise SystemExit(f"{response.url}: HTTP {response.status_code}: {response.text[:300]}")
    return float(m.group(1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn")
    p.add_argument("--finished", type=int, default=1_000_000)
    p.add_argument("--pending", type=int, default=100_000)
    p.add_argument("--dead", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    dsn = find_dsn(args.dsn)
    with BenchSchema(dsn, "web") as schema:
        started = time.monotonic()
        ids = fill(dsn, schema, args.finished, args.pending, args.dead)
        filled = time.monotonic() - started
        port = free_port()
        env = dict(os.environ, PGWORKER_DSN=dsn, PGWORKER_SCHEMA=schema.name, PGWORKER_LOG_LEVEL="WARNING")
        env = {k: v for k, v in env.items() if k not in WEB_VARIABLE_NAMES}  # no credentials: loopback
        proc = subprocess.Popen([sys.executable, "-m", "pgworker.cli", "web", "--port", str(port)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    requests.get(base + "/static/console.css", timeout=2)
                    break
                except requests.ConnectionError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise SystemExit(f"pgworker web did not start: {proc.stderr.read() if proc.stderr else ''}")
                    time.sleep(0.2)
            rows = []
            with requests.Session() as session:
                for name, path in pages(ids):
                    times = [server_ms(session.get(base + path, timeout=120)) for _ in range(max(2, args.repeat))]
                    target = PAYLOAD_TARGET_MS if "payload" in name else TARGET_MS
                    rows.append({"page": name, "path": path, "first_ms": times[0],
                                 "median_ms": statistics.median(times[1:]), "max_ms": max(times[1:]),
                                 "target_ms": target, "met": statistics.median(times[1:]) <= target})
            rows.append(_chart_statement(dsn, schema.name))
        finally:
            proc.terminate()
            proc.wait(15)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    head = (f"{args.finished:,} finished, {args.pending:,} pending and {args.dead:,} dead jobs (filled in "
            f"{filled:.0f} s); server time from Server-Timing, {args.repeat} requests a page; load average "
            f"{load} at the end ({os.cpu_count()} CPUs: other work on the machine slows every figure)")
    lines = [f"# Console pages, {stamp}", "", head, "",
             "| page | first (ms) | median (ms) | max (ms) | target (ms) | met |", "|---|---:|---:|---:|---:|:---:|"]
    for r in rows:
        lines.append(f"| {r['page']} | {r['first_ms']:.1f} | {r['median_ms']:.1f} | {r['max_ms']:.1f} | "
                     f"{r['target_ms']:.0f} | {'yes' if r['met'] else '**no**'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"web-{stamp}.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, f"web-{stamp}.json"), "w") as f:
        json.dump({"finished": args.finished, "pending": args.pending, "dead": args.dead, "rows": rows}, f, indent=1)
    return 0


def _chart_statement(dsn: str, schema: str) -> dict[str, object]:
    """The overview's chart read uncached (the page refreshes it in the background, so its
    median hides it): console_throughput through the store, timed in this process."""
    from pgworker.store import Store

    store = Store(schema)
    times = []
    with connect(dsn) as c:
        for _ in range(6):
            t0 = time.perf_counter()
            store.console_throughput(c, limit=50_000)
            times.append((time.perf_counter() - t0) * 1000)
    return {"page": "overview's chart statement, uncached (console_throughput)", "path": "-", "first_ms": times[0],
            "median_ms": statistics.median(times[1:]), "max_ms": max(times[1:]), "target_ms": TARGET_MS,
            "met": statistics.median(times[1:]) <= TARGET_MS}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sql(schema: BenchSchema, text: str) -> sql.Composed:
    return sql.SQL(text).format(s=schema.ident)


if __name__ == "__main__":
    raise SystemExit(main())
