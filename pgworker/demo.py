"""``pgworker demo``: the main job on real input, end to end.

Starts an embedded throwaway PostgreSQL (the ``pgserver`` package) when no DSN is
configured, migrates, enqueues a mixed workload (tile rendering to files, webhook
deliveries to a local HTTP endpoint, text reports; some failing transiently, some
permanently, some enqueued twice), runs ``pgworker run`` with a pool of claimers while
showing progress, and ends with a summary table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from .app import App
from .config import MAX_CONCURRENCY, Settings
from .demo_services import EmbeddedPostgres, WebhookEndpoint, embedded_postgres
from .errors import ConfigError
from .names import quantity, redact_dsn
from .jobspec import JobSpec

DEMO_SCHEMA = "pgworker_demo"
DEMO_TIMEOUT_SECONDS = 300.0
#: The graph's jobs (four tile_stats, then mosaic) and the invoice: part of every run, and
#: of the ``--jobs N`` it makes (N jobs in all; the mixed workload is the rest).
GRAPH_TILES = 4
FIXED_JOBS = GRAPH_TILES + 1 + 1


def build_workload(n: int, rng: random.Random) -> tuple[list[JobSpec], int]:
    """The mixed workload of ``n`` jobs, the invoice included: (specs, how many of them are
    duplicate enqueues, which are extra requests, not jobs). It once made n + 1 (the
    invoice after n others: `--jobs 100` said "101 jobs")."""
    specs: list[JobSpec] = []
    duplicates = 0
    for i in range(1, n):
        kind = i % 5
        if kind in (0, 1):
            specs.append(JobSpec("render_tile", {"x": rng.uniform(-2.0, 0.5), "y": rng.uniform(-1.2, 1.2),
                                                 "zoom": rng.choice([1, 2, 4]), "size": 40},
                                 priority=rng.choice([0, 0, 1])))
        elif kind in (2, 3):
            event = {"event_id": i, "type": "order.paid", "amount_cents": rng.randint(100, 99_000)}
            spec = JobSpec("deliver_webhook", event, dedupe_key=f"event-{i}")
            specs.append(spec)
            if i % 10 == 2:  # the producer retried its request: the dedupe key refuses the copy
                specs.append(spec)
                duplicates += 1
        else:
            payload: Any = {"doc": f"doc-{i}", "words": rng.randint(200, 3000)}
            if i % 15 == 4:
                payload = {"document": f"doc-{i}"}  # wrong shape: dead with PAYLOAD_INVALID
            specs.append(JobSpec("summarize_text", payload))
    # a durable step and an external effect whose first reply is lost, then reconciled
    specs.append(JobSpec("charge_invoice", {"invoice": "INV-1", "lines": [{"cents": 1250, "qty": 2},
                                                                         {"cents": 499}]}))
    return specs, duplicates


def _counts(app: App) -> dict[str, int]:
    from .status import status_reads

    with app.connection() as conn:
        out = status_reads(app, conn).totals()
    out["pending"] = sum(out.get(state, 0) for state in ("due", "scheduled", "blocked"))
    return out


def _progress(counts: dict[str, int], total: int, elapsed: float, tty: bool) -> None:
    done = counts.get("succeeded", 0) + counts.get("dead", 0) + counts.get("cancelled", 0)
    width = 30
    filled = int(width * done / max(total, 1))
    # 'claimed': the jobs in state running, which includes those a claimer holds in its
    # batch before their handler starts; "running" would overstate what runs
    line = (f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} finished  "
            f"claimed {counts.get('running', 0):3d}  pending {counts.get('pending', 0):4d}  "
            f"dead {counts.get('dead', 0):3d}  {elapsed:5.1f}s")
    if tty:
        print("\r" + line, end="", flush=True)
    else:
        print(line, flush=True)


def main(args: argparse.Namespace) -> int:
    if args.jobs < FIXED_JOBS:  # a usage error, before any database is started
        print(f"error: --jobs {args.jobs}: the demo makes at least {FIXED_JOBS} jobs (a graph of {GRAPH_TILES + 1} "
              f"and an invoice are part of every run): give --jobs {FIXED_JOBS} or more", file=sys.stderr)
        return 2
    if not 1 <= args.concurrency <= MAX_CONCURRENCY:  # so is this one (it failed once the worker started)
        print(f"error: --concurrency {args.concurrency}: give 1 to {MAX_CONCURRENCY} claimer processes",
              file=sys.stderr)
        return 2
    dsn = args.dsn or os.environ.get("PGWORKER_DSN")
    embedded: EmbeddedPostgres | None = None
    with contextlib.ExitStack() as stack:
        if not dsn:
            print("No PGWORKER_DSN set: starting an embedded PostgreSQL (pgserver)...", flush=True)
            embedded = stack.enter_context(embedded_postgres(keep=args.keep))
            dsn = embedded.dsn
            schema = args.schema or "pgworker"
        else:
            schema = args.schema or DEMO_SCHEMA
        print(f"database: {redact_dsn(dsn)}  schema: {schema}", flush=True)
        if not args.schema and os.environ.get("PGWORKER_SCHEMA", schema) != schema:
            # the demo drops and refills its schema: it never writes into the one your worker uses
            print(f"(PGWORKER_SCHEMA={os.environ['PGWORKER_SCHEMA']!r} is not used by the demo, which keeps to "
                  f"its own schema; --schema NAME chooses another)", flush=True)
        app = App(settings=Settings.from_env(dsn=dsn, schema=schema))
        stack.callback(app.close)
        if schema == DEMO_SCHEMA:
            from .migrate import drop_schema

            with contextlib.closing(app.connect()) as conn:
                drop_schema(conn, schema)  # the demo's own schema: start clean
        if schema != DEMO_SCHEMA and _holds_jobs(app, schema):
            # its progress and summary count every job of the schema: an earlier run's
            # (or your app's) would be counted as this run's, and their dedupe keys refuse
            # its. Checked before migrating: a schema of yours is left as it was.
            print(f"error: schema {schema!r} already holds jobs (an earlier demo's, or your app's), which the demo "
                  f"would count as its own: name a new schema (--schema), or drop this one if it is a demo's "
                  f"({drop_statement(schema)}) and run again; without --schema the demo uses "
                  f"{DEMO_SCHEMA!r}, which it empties itself", file=sys.stderr)
            return 1
        report = app.migrate()
        print(f"migrated to schema version {report.version_after}", flush=True)

        out_dir = tempfile.mkdtemp(prefix="pgworker-demo-out-")
        endpoint = WebhookEndpoint()
        stack.callback(endpoint.close)
        specs, duplicates = build_workload(args.jobs - (GRAPH_TILES + 1), random.Random(7))
        t0 = time.time()
        ids = app.enqueue_many(specs[: len(specs) // 2])
        ids += [app.enqueue(s.task, s.payload, priority=s.priority, dedupe_key=s.dedupe_key)
                for s in specs[len(specs) // 2:]]
        distinct = len(set(ids))
        print(f"enqueued {quantity(len(specs), 'request')} in {time.time() - t0:.2f}s: {quantity(distinct, 'job')}, "
              f"{quantity(len(specs) - distinct, 'duplicate')} refused by their dedupe key", flush=True)
        # a small graph (docs/graphs.md): four tiles' statistics, then a mosaic from their results
        graph = app.group([JobSpec("tile_stats", {"name": f"t{k}", "x": -0.75 + 0.25 * k, "y": 0.1})
                           for k in range(GRAPH_TILES)], callback=JobSpec("mosaic", {}))
        distinct += len(graph.ids)
        specs += [JobSpec("tile_stats")] * len(graph.ids)  # counted as requests too (no duplicates)
        print(f"enqueued graph {graph.graph_id}: {GRAPH_TILES} tile_stats jobs, then mosaic (job {graph.ids[-1]}) "
              f"when all have succeeded; {quantity(distinct, 'job')} in all", flush=True)

        env = dict(os.environ, PGWORKER_DSN=dsn, PGWORKER_SCHEMA=schema, PGWORKER_DEMO_DIR=out_dir,
                   PGWORKER_DEMO_URL=endpoint.url, PGWORKER_LOG_LEVEL=os.environ.get("PGWORKER_LOG_LEVEL", "WARNING"))
        # -P: not the current directory first on sys.path (a folder holding a clone named
        # pgworker would be imported in place of the package: see worker/forkserver.py)
        cmd = [sys.executable, "-P", "-m", "pgworker.cli", "run", "--app", "pgworker.demo_app:app",
               "--concurrency", str(args.concurrency), "--metrics-port", "0", "--poll-interval", "0.5",
               "--shutdown-grace", "10"]
        print(f"starting `pgworker run` with {quantity(args.concurrency, 'claimer')}...", flush=True)
        started = time.time()
        # The worker's log (every failed attempt, every dead job: some fail on purpose) goes
        # to a file, so that it does not scroll the progress display away.
        fd, log_path = tempfile.mkstemp(prefix="pgworker-demo-worker-", suffix=".log")
        log_file = os.fdopen(fd, "w")
        worker = subprocess.Popen(cmd, env=env, stderr=log_file)
        tty = sys.stdout.isatty()
        last_print = 0.0
        failure: str | None = None
        try:
            while True:
                time.sleep(0.25)
                counts = _counts(app)
                finished = counts.get("succeeded", 0) + counts.get("dead", 0) + counts.get("cancelled", 0)
                now = time.time()
                if tty or now - last_print >= 2.0 or finished >= distinct:
                    _progress(counts, distinct, now - started, tty)
                    last_print = now
                if finished >= distinct:
                    break
                if worker.poll() is not None:
                    failure = (f"the worker exited early with code {worker.returncode}; its log ({log_path}) "
                               f"ends with:\n{_tail(log_path)}")
                    break
                if now - started > DEMO_TIMEOUT_SECONDS:
                    failure = f"the demo did not finish in time; the worker's log: {log_path}"
                    break
        finally:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                try:
                    worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    worker.kill()
            log_file.close()
        if failure is not None:
            # the worker has stopped (nothing writes to the outputs any more). Say what a
            # kept embedded PostgreSQL needs to be stopped (--keep; it ran on unnoticed),
            # and leave no empty outputs folder behind
            print(f"\nerror: {failure}", file=sys.stderr)
            if not args.keep:
                shutil.rmtree(out_dir, ignore_errors=True)
            print(closing_hint(embedded, schema, keep=args.keep, leftovers=(out_dir, log_path)), file=sys.stderr)
            return 1
        elapsed = time.time() - started
        if tty:
            print()
        summary = _summary(app, distinct, len(specs) - distinct, elapsed, out_dir, endpoint)
        _print_summary(summary)
        try:
            print(f"graph {graph.graph_id}: mosaic (job {graph.ids[-1]}) returned {app.result(graph.ids[-1])}")
        except Exception as exc:  # noqa: BLE001 - the demo reports, it does not fail on the graph
            print(f"graph {graph.graph_id}: no result ({type(exc).__name__}: {exc})")
        print(f"worker log (failed attempts and dead jobs, as a real worker logs them): {log_path}")
        if not args.keep:
            shutil.rmtree(out_dir, ignore_errors=True)
        else:
            print(f"outputs kept in {out_dir}")
        dead = app.list_jobs(state="dead", limit=1)
        console = start_console(dsn, schema, log_dir=out_dir) if args.keep else None
        print(closing_hint(embedded, schema, keep=args.keep, example=dead[0]["id"] if dead else None,
                           console=console, leftovers=(out_dir, log_path)))
        ok = summary["lost"] == 0 and summary["stuck"] == 0
        return 0 if ok else 1
    return 0


def pgworker_command() -> str:
    """How to run this pgworker from the current directory: ``pgworker`` when that name
    on PATH is this installation's, else the path of its script (``.venv/bin/pgworker``
    after the README's set-up, whose virtualenv is not activated)."""
    script = os.path.join(os.path.dirname(sys.executable), "pgworker")
    if not os.path.exists(script):
        return f"{sys.executable} -m pgworker.cli"
    on_path = shutil.which("pgworker")
    if on_path and os.path.realpath(on_path) == os.path.realpath(script):
        return "pgworker"
    return script  # absolute: it works from any directory, as the stop command does


def drop_statement(schema: str) -> str:
    """The SQL that drops ``schema``, its name quoted as PostgreSQL reads it."""
    from psycopg import sql

    return f"DROP SCHEMA {sql.Identifier(schema).as_string(None)} CASCADE"


def _holds_jobs(app: App, schema: str) -> bool:
    """Whether ``schema`` has a jobs table with a row in it, read without migrating (a
    schema at an older version is not touched)."""
    from psycopg import sql

    with app.connection() as conn:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                           [sql.Identifier(schema, "jobs").as_string(None)]).fetchone()
        if not row or not row[0]:
            return False
        found = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(sql.Identifier(schema, "jobs")))
        return bool(found.fetchone()[0])  # type: ignore[index]


def closing_hint(embedded: EmbeddedPostgres | None, schema: str, *, keep: bool, example: int | None = None,
                 console: tuple[str, int] | None = None, leftovers: tuple[str, ...] = ()) -> str:
    """How to look at the demo's jobs afterwards (the worker log names their ids; ``example``
    is one dead job's), for a database that is still there: the embedded one is deleted
    at exit unless ``keep``. ``console``: (URL, pid) of a web console left running.
    ``leftovers``: the kept outputs and logs, which the stop command deletes too."""
    command = pgworker_command()
    job = str(example) if example is not None else "ID"
    web = (f"\nthe web console keeps running too: {console[0]} (the demo's jobs{f', job {job}' if example else ''})"
           if console else "")
    if embedded is None:
        until = ("until the next demo" if schema == DEMO_SCHEMA else
                 f"until you drop it ({drop_statement(schema)}; a demo refuses a schema that holds jobs)")
        return (f"its jobs stay in schema {schema!r} of your database {until}: "
                f"`{command} jobs show {job} --schema {shlex.quote(schema)}` (same DSN) shows one"
                + (f"{web}\nstop it with\n  kill {console[1]}" if console else _log_note(leftovers)))
    if not keep:
        return ("the embedded PostgreSQL was deleted at exit, and the jobs in that log with it; "
                f"`{command} demo --keep` leaves it running so that they can be inspected" + _log_note(leftovers))
    return ("the embedded PostgreSQL keeps running (--keep); inspect a job of that log with\n"
            f"  PGWORKER_DSN='{embedded.dsn}' {command} jobs show {job}{web}\n"
            f"stop {'them' if console else 'it'} and delete the database with\n"
            f"  {f'kill {console[1]}; ' if console else ''}{embedded.stop_command}"
            + "".join(f"; rm -rf {shlex.quote(p)}" for p in leftovers))


def _log_note(leftovers: tuple[str, ...]) -> str:
    """'; the log stays until you delete it: rm PATH' for the worker's log a demo leaves for
    reading (a new user found it left in /tmp without a word), or ''."""
    logs = [p for p in leftovers if p.endswith(".log") and os.path.exists(p)]
    return f"; the log stays until you delete it: rm {' '.join(map(shlex.quote, logs))}" if logs else ""


def start_console(dsn: str, schema: str, *, log_dir: str | None = None) -> tuple[str, int] | None:
    """`pgworker web` on 127.0.0.1 (port 8080 when free), detached, for a kept demo:
    (its URL, its pid), or None when the 'web' extra is not installed or it did not start.
    Its log goes to ``log_dir`` (the demo's kept outputs), else to a temporary file."""
    import socket

    from .web import require_extra

    try:
        require_extra()
    except ConfigError:
        return None
    with socket.socket() as s:
        port = 8080 if s.connect_ex(("127.0.0.1", 8080)) != 0 else 0
    if not port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    fd, log_path = tempfile.mkstemp(prefix="pgworker-demo-web-", suffix=".log", dir=log_dir)
    proc = subprocess.Popen([sys.executable, "-P", "-m", "pgworker.cli", "web", "--port", str(port)],  # -P: as run's
                            env=dict(os.environ, PGWORKER_DSN=dsn, PGWORKER_SCHEMA=schema), stdin=subprocess.DEVNULL,
                            stdout=fd, stderr=fd, start_new_session=True)
    os.close(fd)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return f"http://127.0.0.1:{port}/", proc.pid
        time.sleep(0.1)
    print(f"(the web console did not start; its log: {log_path})", flush=True)
    return None


def _summary(app: App, jobs: int, duplicates: int, elapsed: float, out_dir: str,
             endpoint: WebhookEndpoint) -> dict[str, Any]:
    with app.connection() as conn:
        row = conn.execute(app.store.queries["demo_summary"]).fetchone()
        dead_codes = conn.execute(app.store.queries["demo_dead_codes"]).fetchall()
    succeeded, dead, stuck, failed_attempts = row
    tiles = len(os.listdir(os.path.join(out_dir, "tiles"))) if os.path.isdir(os.path.join(out_dir, "tiles")) else 0
    reports = len(os.listdir(os.path.join(out_dir, "reports"))) if os.path.isdir(os.path.join(out_dir, "reports")) else 0
    return {
        "jobs": jobs, "duplicates prevented": duplicates, "succeeded": succeeded,
        "retried attempts": failed_attempts - dead, "dead": dead,
        "dead by code": ", ".join(f"{c} {n}" for c, n in dead_codes) or "-",
        "lost": jobs - succeeded - dead - stuck, "stuck": stuck,
        "throughput (jobs/s)": round(jobs / elapsed, 1) if elapsed else 0.0,
        "tiles written": tiles, "reports written": reports,
        "webhooks delivered": len(endpoint.delivered),
        "webhook requests (incl. retries)": endpoint.requests,
        "duplicate deliveries": endpoint.duplicates,
        "invoices charged (ctx.effect)": len(endpoint.charges),
        "charge requests / reconciliations": f"{endpoint.charge_requests} / {endpoint.reconciliations}",
        "wall time (s)": round(elapsed, 2),
    }


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def _print_summary(summary: dict[str, Any]) -> None:
    width = max(len(k) for k in summary)
    print("\nsummary")
    print("-" * (width + 12))
    for k, v in summary.items():
        print(f"{k.ljust(width)}  {v}")
    print("-" * (width + 12))
