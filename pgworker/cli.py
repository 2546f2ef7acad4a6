"""The ``pgworker`` command line.

Settings come from flags, else ``PGWORKER_*`` environment variables, else the App's
own. Output is a readable table on a terminal and JSON with ``--json``. Exit codes: 0
success, 1 error, 2 bad usage, 75 a drain run hit its deadline with due work left.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from datetime import datetime, timedelta
from typing import Any, Sequence

from .errors import ConfigError, PgworkerError
from .names import quantity

EXIT_USAGE = 2
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """'90', '90s', '15m', '12h', '7d', '2w', '250ms' -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; use forms like 30s, 15m, 12h, 7d")
    return float(m.group(1)) * _UNITS[m.group(2)]


#: Flags whose default is an environment variable other than a Settings field's: dest ->
#: (variable, default when it is unset). Resolved after parsing, so that the parser (and
#: the reference generated from it, docs/configuration.md) does not depend on the
#: environment it was built in.
ENV_FLAGS: dict[str, tuple[str, str | None]] = {
    "app": ("PGWORKER_APP", None),
    "log_level": ("PGWORKER_LOG_LEVEL", "INFO"),
    "log_format": ("PGWORKER_LOG_FORMAT", "text"),
}


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection")
    g.add_argument("--dsn", help="PostgreSQL DSN (env PGWORKER_DSN)")
    g.add_argument("--schema", help="pgworker's schema (env PGWORKER_SCHEMA, default pgworker)")
    g.add_argument("--app",
                   help="your App: 'package.module:app' or 'path/file.py:app'; 'package.module:create_app()' "
                        "calls a factory that returns it (env PGWORKER_APP)")
    g.add_argument("--json", action="store_true", help="print JSON instead of a table")


class _Parser(argparse.ArgumentParser):
    """argparse without abbreviations: with them, a typo such as ``--queue`` for ``--queues``
    or ``--prio`` for ``--priority`` silently picks whichever flag it prefixes (or fails as
    "ambiguous"), and adding a flag later can change what an old command line means.
    Subparsers are made with the parser's own class, so every command inherits this."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pgworker", description="PostgreSQL-backed job queue and worker.")
    parser.add_argument("--version", action="version", version=f"pgworker {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("migrate", help="create or upgrade pgworker's schema")
    _common(p)

    p = sub.add_parser("run", help="run the worker: a dispatcher and a pool of claimer processes")
    _common(p)
    p.add_argument("--queues", help="comma-separated queues (default: the queues of the app's tasks)")
    p.add_argument("--concurrency", type=int, help="claimer processes (default: CPU count)")
    p.add_argument("--drain", action="store_true",
                   help="claim until nothing is due and nothing runs, then exit (no LISTEN, no polling)")
    p.add_argument("--max-duration", type=parse_duration,
                   help="drain mode: stop at this deadline; exit 75 if due work is left")
    p.add_argument("--listen-dsn", help="direct connection for LISTEN (not a transaction pooler)")
    p.add_argument("--no-listen", action="store_true", help="no LISTEN: rely on the fallback poll")
    p.add_argument("--poll-interval", type=parse_duration, help="fallback poll interval (default 2s)")
    p.add_argument("--lease", type=parse_duration, help="lease length (default 60s)")
    p.add_argument("--max-runtime", type=parse_duration, help="stop attempts running longer (default 1h)")
    p.add_argument("--reap-interval", type=parse_duration, help="reaper interval (default 15s)")
    p.add_argument("--shutdown-grace", type=parse_duration, help="time running jobs get at shutdown (default 30s)")
    p.add_argument("--batch-size", type=int, help="jobs per claim (default: sized from run times)")
    p.add_argument("--metrics-port", type=int, help="port of /metrics, /healthz, /readyz; 0 = off (default 9186)")
    p.add_argument("--metrics-host", help="address to bind the metrics server to (default 0.0.0.0)")
    p.add_argument("--metrics-dir", help="prometheus multiprocess directory (default: a fresh temporary one)")
    p.add_argument("--no-stats", action="store_true", help="no queue statistics queries at scrape time")
    p.add_argument("--no-tracing", action="store_true", help="turn OpenTelemetry spans off")
    p.add_argument("--trace-sql", action="store_true", help="SQL child spans (opentelemetry-instrumentation-psycopg)")
    p.add_argument("--pushgateway-url", help="drain mode: push the run's summary to this Pushgateway")
    p.add_argument("--max-jobs-per-child", type=int, help="recycle a claimer after this many jobs")
    p.add_argument("--max-memory-per-child", type=int, help="recycle a claimer above this RSS (bytes)")
    p.add_argument("--no-prepared-statements", action="store_true",
                   help="behind pgbouncer < 1.21 in transaction mode")
    p.add_argument("--queue-concurrency", help="per-pod limits, e.g. 'emails=2,reports=1' (jobs held at once)")
    p.add_argument("--priority-aging", type=parse_duration,
                   help="claim a job due for longer than this before higher-priority work (default off)")
    p.add_argument("--no-schedules", action="store_true", help="do not enqueue the app's periodic jobs")
    p.add_argument("--log-format", choices=("text", "json"),
                   help="log lines as text, or one JSON object a line (env PGWORKER_LOG_FORMAT, default text)")
    p.add_argument("--log-level", metavar="LEVEL",
                   help="DEBUG, INFO, WARNING or ERROR (env PGWORKER_LOG_LEVEL, default INFO)")

    p = sub.add_parser("enqueue", help="enqueue one job by task name")
    _common(p)
    p.add_argument("task", help="the task's name, as registered with @app.task(name=...)")
    p.add_argument("--payload", default="null", help="JSON payload (default null)")
    p.add_argument("--queue", help="queue (default: the task's, with --app; else 'default')")
    p.add_argument("--priority", type=int, metavar="N",
                   help="higher runs first, -32768 to 32767 (default: the task's, else 0)")
    p.add_argument("--delay", type=parse_duration, metavar="DURATION",
                   help="run no sooner than this from now, e.g. 90s, 15m (default: now)")
    p.add_argument("--max-attempts", type=int, metavar="N",
                   help="attempts before the job is dead (default: the task's, else 5)")
    p.add_argument("--dedupe-key", metavar="KEY",
                   help="while a job with this key is pending or running, return its id instead")
    p.add_argument("--dedupe-window", type=parse_duration, metavar="DURATION",
                   help="keep the dedupe key held this long after the job succeeded")
    p.add_argument("--ordering-key", metavar="KEY",
                   help="jobs sharing this key run one at a time, in enqueue order")
    p.add_argument("--ordering-on-dead", choices=("block", "skip"),
                   help="if this job dies: block its key's later jobs until replayed or discarded, "
                        "or skip it (default: the task's, else block)")
    p.add_argument("--any-task", action="store_true",
                   help="enqueue a task name the --app does not register (one another service's "
                        "worker handles); without it, such a name is refused as a likely typo")

    p = sub.add_parser("jobs", help="list jobs, or show one with its error history")
    _common(p)
    jsub = p.add_subparsers(dest="jobs_command", metavar="list|show")
    jl = jsub.add_parser("list", help="list jobs (default)")
    _common(jl)
    for q in (p, jl):
        q.add_argument("--queue", help="only this queue's jobs")
        q.add_argument("--state", choices=("pending", "running", "succeeded", "dead", "cancelled"),
                       help="only jobs in this state")
        q.add_argument("--limit", type=int, default=50, metavar="N", help="at most N jobs, newest first")
    js = jsub.add_parser("show", help="one job in full")
    _common(js)
    js.add_argument("id", type=int, help="the job's id")

    p = sub.add_parser("dead", help="dead jobs: list or replay")
    _common(p)
    dsub = p.add_subparsers(dest="dead_command", metavar="list|replay|keys")
    dl = dsub.add_parser("list", help="dead jobs with their last error code (default)")
    _common(dl)
    dl.add_argument("--queue", help="only this queue's dead jobs")
    dl.add_argument("--limit", type=int, default=50, metavar="N", help="at most N jobs, newest first")
    dk = dsub.add_parser("keys", help="ordering keys held by a dead job, with the jobs waiting behind each")
    _common(dk)
    dk.add_argument("--limit", type=int, default=100, metavar="N", help="at most N keys, oldest first")
    dr = dsub.add_parser("replay", help="replay dead jobs by id, or --queue Q --all")
    _common(dr)
    dr.add_argument("ids", nargs="*", type=int, metavar="ID", help="dead jobs to put back to pending")
    dr.add_argument("--queue", help="with --all: the queue whose dead jobs to replay")
    dr.add_argument("--all", action="store_true", help="every dead job of --queue")
    dr.add_argument("--limit", type=int, default=10_000, metavar="N", help="with --all: at most N jobs")

    p = sub.add_parser("cancel", help="cancel a job (a running one is asked to stop)")
    _common(p)
    p.add_argument("id", type=int, help="the job's id")

    p = sub.add_parser("prune", help="delete succeeded and cancelled jobs older than a retention")
    _common(p)
    p.add_argument("--older-than", type=parse_duration, required=True, metavar="DURATION",
                   help="finished longer ago than this, e.g. 7d")
    p.add_argument("--batch", type=int, default=10_000, metavar="N", help="rows deleted per statement")

    p = sub.add_parser("status", help="jobs by queue and state, oldest due job's age, running leases, "
                                      "paused queues, ordering keys held by a dead job")
    _common(p)

    p = sub.add_parser("queue", help="queue policies: list, pause, resume, set limits, events")
    _common(p)
    qsub = p.add_subparsers(dest="queue_command", metavar="list|pause|resume|set|delete|events")
    ql = qsub.add_parser("list", help="configured queues (default)")
    _common(ql)
    for verb, text in (("pause", "stop every pod claiming from a queue (enqueues go on)"),
                       ("resume", "resume a paused queue"),
                       ("delete", "delete a queue's settings (limits, aging; one made by a typo, say); "
                                  "jobs are untouched; a paused queue must be resumed first")):
        qp = qsub.add_parser(verb, help=text)
        _common(qp)
        qp.add_argument("name", help="the queue's name")
    qs = qsub.add_parser("set", help="set a queue's global concurrency limit, rate limit or aging bound")
    _common(qs)
    qs.add_argument("name", help="the queue's name")
    # absent (left as it is) and 'none' (removed) differ: absent options keep the default _ABSENT
    # (dest names apart from the settings' own: --concurrency of `run` is another thing; the
    # metavars keep those internal names out of --help)
    qs.add_argument("--concurrency", dest="limit_concurrency", type=_int_or_none, default=_ABSENT, metavar="N",
                    help="most running jobs across all pods ('none' removes)")
    qs.add_argument("--rate", dest="limit_rate", type=_float_or_none, default=_ABSENT, metavar="JOBS_PER_SECOND",
                    help="jobs per second ('none' removes)")
    qs.add_argument("--burst", dest="limit_burst", type=float, metavar="JOBS",
                    help="token bucket size in jobs (default max(1, rate))")
    qs.add_argument("--aging", dest="limit_aging", type=_duration_or_none, default=_ABSENT, metavar="DURATION",
                    help="priority-aging bound, e.g. 5m ('none' removes)")
    qe = qsub.add_parser("events", help="who paused, resumed, reconfigured or deleted a queue")
    _common(qe)
    qe.add_argument("name", help="the queue's name")
    qe.add_argument("--limit", type=int, default=50, metavar="N", help="at most N events, newest first")

    p = sub.add_parser("schedules", help="periodic jobs with their next run (--app adds the declared ones)")
    _common(p)

    p = sub.add_parser("sql", help="SQL for operators: least-privilege grants")
    ssub = p.add_subparsers(dest="sql_command", metavar="grants")
    sg = ssub.add_parser("grants", help="GRANTs for a producer role and a worker role (print, or --apply)")
    _common(sg)
    sg.add_argument("--producer", help="role that may only enqueue and read job state")
    sg.add_argument("--worker", help="role that may claim, record outcomes and run the reaper")
    sg.add_argument("--apply", action="store_true", help="run the statements with --dsn (the schema's owner)")

    p = sub.add_parser("demo", help="run a realistic workload end to end (embedded PostgreSQL without --dsn)")
    _common(p)
    p.add_argument("--jobs", type=int, default=400, metavar="N", help="jobs in the workload")
    p.add_argument("--concurrency", type=int, default=4, metavar="N", help="claimer processes of its worker")
    p.add_argument("--keep", action="store_true",
                   help="keep the outputs and, without --dsn, the embedded PostgreSQL running (to inspect "
                        "the jobs)")
    return parser


_NONE = ("none", "off", "null", "-")
_ABSENT: Any = object()


def _int_or_none(text: str) -> int | None:
    if text.strip().lower() in _NONE:
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (or 'none')") from None


def _float_or_none(text: str) -> float | None:
    if text.strip().lower() in _NONE:
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (or 'none')") from None


def _duration_or_none(text: str) -> float | None:
    return None if text.strip().lower() in _NONE else parse_duration(text)


def _version() -> str:
    from . import __version__

    return __version__


#: Flags that set a Settings field (dest -> field); unset, the field's PGWORKER_* variable
#: applies. `pgworker run` has them all; --dsn and --schema are on every command. The
#: reference (docs/configuration.md) is generated from this table and the parser.
SETTING_FLAGS: dict[str, str] = {
    "dsn": "dsn", "schema": "schema", "queues": "queues", "concurrency": "concurrency",
    "listen_dsn": "listen_dsn", "poll_interval": "poll_interval_seconds", "lease": "lease_seconds",
    "max_runtime": "max_runtime_seconds", "reap_interval": "reap_interval_seconds",
    "shutdown_grace": "shutdown_grace_seconds", "batch_size": "batch_size", "metrics_port": "metrics_port",
    "metrics_host": "metrics_host", "max_jobs_per_child": "max_jobs_per_child",
    "max_memory_per_child": "max_memory_per_child_bytes", "priority_aging": "priority_aging_seconds",
    "queue_concurrency": "queue_concurrency",
}
#: Switches that set a boolean Settings field: dest -> (field, the value they set).
SETTING_SWITCHES: dict[str, tuple[str, bool]] = {
    "no_listen": ("listen", False), "no_stats": ("stats", False), "no_tracing": ("tracing", False),
    "trace_sql": ("trace_sql", True), "no_prepared_statements": ("prepared_statements", False),
    "no_schedules": ("schedules", False),
}

def _settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    from .config import _queue_counts, _queues

    o: dict[str, Any] = {}
    for dest, name in SETTING_FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            o[name] = value
    for dest, (name, value) in SETTING_SWITCHES.items():
        if getattr(args, dest, False):
            o[name] = value
    if o.get("queues") is not None:
        o["queues"] = _queues(o["queues"])
    if o.get("queue_concurrency"):
        try:
            o["queue_concurrency"] = _queue_counts(o["queue_concurrency"])
        except ValueError as exc:
            raise ConfigError(f"--queue-concurrency: {exc}; example: --queue-concurrency emails=2,reports=1") from None
    else:
        o.pop("queue_concurrency", None)
    if o.get("queues") == ():
        del o["queues"]  # `--queues ''`: as if not given
    return o


def _make_app(args: argparse.Namespace, *, need_app: bool = False) -> Any:
    from .app import App
    from .config import Settings
    from .loader import load_app

    if args.app:
        app = load_app(args.app)
        app.configure(app.settings.replace(**_settings_overrides(args)))
        return app
    if need_app:
        raise ConfigError("pgworker run needs your App: --app package.module:app (or PGWORKER_APP); "
                          "try `pgworker demo` for a self-contained example")
    return App(settings=Settings.from_env(**_settings_overrides(args)))


def _prepare_metrics_dir(args: argparse.Namespace) -> str | None:
    """Give this run a fresh prometheus multiprocess directory, before any import of
    prometheus_client (the library reads the variable at import time)."""
    path = args.metrics_dir or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):
            if name.endswith(".db"):
                os.unlink(os.path.join(path, name))
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
        return None
    path = tempfile.mkdtemp(prefix="pgworker-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    return path


# -- output -------------------------------------------------------------------------


def _jsonable(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, timedelta):
        return v.total_seconds()
    return v


def emit(args: argparse.Namespace, rows: Any, columns: Sequence[str] | None = None) -> None:
    if getattr(args, "json", False):
        print(json.dumps(rows, default=_jsonable, indent=None if isinstance(rows, list) else 2))
        return
    if isinstance(rows, dict):
        width = max((len(k) for k in rows), default=0)
        for k, v in rows.items():
            if isinstance(v, (list, dict)):
                # continuation lines start under the value's first line, not at column 0
                v = json.dumps(v, default=_jsonable, indent=2).replace("\n", "\n" + " " * (width + 2))
            print(f"{k.rjust(width)}  {_fmt(v)}")
        return
    if not rows:
        print("(none)")
        return
    columns = list(columns or rows[0].keys())
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, datetime):
        return v.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


# -- commands -----------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    app = _make_app(args)
    report = app.migrate()
    if args.json:
        emit(args, {"schema": report.schema, "version_before": report.version_before,
                    "version_after": report.version_after, "applied": list(report.applied)})
    elif report.applied:
        print(f"schema {report.schema!r}: applied {', '.join(report.applied)} "
              f"(version {report.version_before} -> {report.version_after})")
    else:
        print(f"schema {report.schema!r} is up to date (version {report.version_after})")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    created = _prepare_metrics_dir(args)
    try:
        from .worker import Supervisor
        from .logs import setup_logging

        setup_logging(args.log_level, args.log_format)
        if args.max_duration is not None and not args.drain:
            raise ConfigError("--max-duration applies to --drain runs")
        app = _make_app(args, need_app=True)
        return Supervisor(app, args.app, drain=args.drain, max_duration=args.max_duration,
                          pushgateway_url=args.pushgateway_url, log_level=args.log_level.upper(),
                          log_format=args.log_format).run()
    finally:
        if created:
            shutil.rmtree(created, ignore_errors=True)


def cmd_enqueue(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--payload is not valid JSON: {exc}; example: --payload '{{\"user_id\": 42}}'") from None
    except RecursionError:
        raise ConfigError("--payload is nested too deeply for Python's JSON decoder; flatten it") from None
    app = _make_app(args)
    # A traced producer like the library: the SDK from the OTEL_* variables, as `pgworker
    # run` sets it up, so the job carries the send span's context to its attempts. The
    # console exporter writes to stderr: stdout is the job id, which scripts capture.
    from . import tracing

    provider = tracing.setup_process(app.settings.tracing, console_out=sys.stderr)
    try:
        job_id = app.enqueue(args.task, payload, queue=args.queue, priority=args.priority, delay=args.delay,
                             max_attempts=args.max_attempts, dedupe_key=args.dedupe_key,
                             ordering_key=args.ordering_key, dedupe_window=args.dedupe_window,
                             ordering_on_dead=args.ordering_on_dead, any_task=args.any_task)
    finally:
        tracing.flush(provider)  # a one-shot process: export before exit, not at the next batch
    if args.task not in app.tasks:
        _note_enqueue_defaults(args)
    emit(args, {"id": job_id}) if args.json else print(job_id)
    return 0


def _note_enqueue_defaults(args: argparse.Namespace) -> None:
    """Say on stderr which of pgworker's defaults a job of a task unknown here took: the
    task's own queue and attempts are declared in code this process did not load, and a
    job in the wrong queue waits for a worker that never claims it."""
    from .config import DEFAULT_QUEUE
    from .tasks import DEFAULT_MAX_ATTEMPTS

    used = [f"{name}={value!r} ({flag})" for name, flag, given, value in (
        ("queue", "--queue", args.queue, DEFAULT_QUEUE),
        ("max_attempts", "--max-attempts", args.max_attempts, DEFAULT_MAX_ATTEMPTS)) if given is None]
    if used:
        why = "no --app" if not args.app else f"--app does not register {args.task!r}"
        print(f"note: {why}, so the task's own settings are unknown here; used the defaults "
              f"{', '.join(used)}", file=sys.stderr)


def cmd_jobs(args: argparse.Namespace) -> int:
    app = _make_app(args)
    if getattr(args, "jobs_command", None) == "show":
        job = app.get_job(args.id)
        if job is None:
            print(f"error: no job {args.id}", file=sys.stderr)
            return 1
        if job.get("ordering_key") is None and not args.json:
            # what a dead job does to its ordering key: meaningless without one (JSON keeps
            # every column, for scripts)
            job.pop("dead_blocks_key", None)
        emit(args, job)
        return 0
    rows = app.list_jobs(queue=args.queue, state=args.state, limit=args.limit)
    emit(args, rows, ["id", "queue", "task", "state", "priority", "attempts", "max_attempts",
                      "run_at", "last_error_code"])
    return 0


def cmd_dead(args: argparse.Namespace) -> int:
    app = _make_app(args)
    if getattr(args, "dead_command", None) == "keys":
        with app.connection() as conn:
            rows = app.store.dead_blocked_keys(conn, limit=args.limit)
        emit(args, rows, ["queue", "ordering_key", "dead_job_id", "task", "last_error_code", "finished_at",
                          "waiting"])
        return 0
    if getattr(args, "dead_command", None) == "replay":
        if not args.ids and not (args.queue and args.all):
            raise ConfigError("give job ids, or --queue QUEUE --all")
        ids = app.replay(args.ids, queue=args.queue if args.all else None, limit=args.limit)
        if args.json:
            emit(args, {"replayed": ids})
        else:
            print(f"replayed {quantity(len(ids), 'job')}" + (f": {', '.join(map(str, ids[:50]))}" if ids else ""))
        missing = sorted(set(args.ids) - set(ids))
        if missing:
            print(f"not dead (or unknown), left as they were: {', '.join(map(str, missing))}", file=sys.stderr)
            return 1
        return 0
    rows = app.list_jobs(queue=args.queue, state="dead", limit=args.limit)
    emit(args, rows, ["id", "queue", "task", "attempts", "last_error_code", "finished_at"])
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    app = _make_app(args)
    state = app.cancel(args.id)
    if state is None:
        print(f"error: job {args.id} is unknown or already finished", file=sys.stderr)
        return 1
    msg = "cancelled" if state == "cancelled" else "cancellation requested (the job is running)"
    emit(args, {"id": args.id, "state": state}) if args.json else print(f"job {args.id}: {msg}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    app = _make_app(args)
    n = app.prune(args.older_than, batch=args.batch)
    emit(args, {"deleted": n}) if args.json else print(f"deleted {quantity(n, 'finished job')}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    app = _make_app(args)
    with app.connection() as conn:
        rows = app.store.queue_status(conn)
        queues = app.store.list_queues(conn)
        blocked = app.store.dead_blocked_keys(conn)
    paused = [q for q in queues if q["paused_at"] is not None]
    if args.json:  # the state rows, each saying whether its queue is paused (`dead keys` lists the keys)
        names = {q["name"] for q in paused}
        emit(args, [{**r, "paused": r["queue"] in names} for r in rows])
        return 0
    emit(args, rows, ["queue", "state", "jobs", "oldest_due_age_seconds", "expired_leases"])
    if paused:
        print("\npaused queues (enqueues go on; nothing is claimed):")
        emit(args, paused, ["name", "paused_at", "paused_by", "running"])
    if blocked:
        print("\nordering keys held by a dead job (replay it with `pgworker dead replay ID`, "
              "or discard it with `pgworker cancel ID`):")
        emit(args, blocked, ["queue", "ordering_key", "dead_job_id", "task", "last_error_code", "finished_at",
                             "waiting"])
    return 0


def cmd_queue(args: argparse.Namespace) -> int:
    app = _make_app(args)
    verb = getattr(args, "queue_command", None) or "list"
    warning = _unused_queue_warning(app, args) if verb in ("pause", "set") else None
    if verb == "pause":
        row = app.pause_queue(args.name)
        emit(args, row) if args.json else print(
            f"queue {args.name!r} paused at {_fmt(row['paused_at'])} by {row['paused_by']}: no pod claims "
            "from it any more; running jobs finish; enqueues go on")
    elif verb == "delete":
        removed = app.delete_queue(args.name)
        if args.json:
            emit(args, {"queue": args.name, "deleted": removed is not None, "settings": removed})
        elif removed is None:
            print(f"queue {args.name!r} has no settings: nothing to delete")
        else:
            had = ", ".join(f"{k} {v:g}" for k, v in removed.items() if v is not None)
            print(f"queue {args.name!r} deleted" + (f" (it had {had})" if had else "")
                  + "; its jobs, if any, are untouched and run without its limits")
    elif verb == "resume":
        resumed = app.resume_queue(args.name)
        if args.json:
            emit(args, {"queue": args.name, "resumed": resumed})
        else:
            print(f"queue {args.name!r} resumed" if resumed else f"queue {args.name!r} was not paused")
    elif verb == "set":
        options: dict[str, Any] = {}
        for flag, key in (("limit_concurrency", "concurrency_limit"), ("limit_rate", "rate_limit"),
                          ("limit_aging", "aging")):
            if getattr(args, flag) is not _ABSENT:
                options[key] = getattr(args, flag)
        if args.limit_burst is not None:
            options["burst"] = args.limit_burst
        if not options:
            raise ConfigError("nothing to set: give --concurrency, --rate (with --burst) or --aging")
        row = app.configure_queue(args.name, **options)
        emit(args, row)
    elif verb == "events":
        emit(args, app.queue_events(args.name, limit=args.limit), ["at", "kind", "actor", "detail"])
    else:
        emit(args, app.queue_settings(), ["name", "paused_at", "paused_by", "concurrency_limit", "running",
                                          "rate_per_second", "rate_burst", "aging_seconds"])
    if warning:
        print(warning, file=sys.stderr)
    return 0


def _unused_queue_warning(app: Any, args: argparse.Namespace) -> str | None:
    """The warning for pausing or configuring a queue nothing uses, or None: no claimable,
    running or dead job, no schedule, no settings row yet, and not a queue of the --app's
    tasks (or 'default'). The name is then likely a typo, and the command would make a
    row nobody uses. Only a warning: limiting a queue ahead of its first job is fine.
    Asked before the command runs (the command makes the row)."""
    usage = app.queue_usage(args.name)
    if any(usage.values()):
        return None
    name = args.name
    tasks = "no task of the --app uses it" if args.app else "no --app was given to check its tasks' queues"
    undo = (f"`pgworker queue resume {name}` then `pgworker queue delete {name}`"
            if args.queue_command == "pause" else f"`pgworker queue delete {name}`")
    return (f"warning: queue {name!r} has no pending, running or dead jobs and no schedule, and {tasks}: "
            f"a typo? Undo with {undo}")


def cmd_schedules(args: argparse.Namespace) -> int:
    app = _make_app(args)
    emit(args, app.list_schedules(), ["name", "task", "cron", "timezone", "missed", "next_run", "last_slot",
                                      "last_job_id", "last_job_state", "declared"])
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    from . import grants
    from .config import DEFAULT_SCHEMA

    if getattr(args, "sql_command", None) != "grants":
        raise ConfigError("use: pgworker sql grants --producer ROLE --worker ROLE [--schema S] [--apply]")
    schema = args.schema or os.environ.get("PGWORKER_SCHEMA") or DEFAULT_SCHEMA
    statements = grants.grant_statements(schema, producer=args.producer, worker=args.worker)
    if not args.apply:
        print(grants.render(statements))
        return 0
    app = _make_app(args)
    with app.connection() as conn:
        grants.apply(conn, statements)
    print(f"granted on schema {schema!r}: " + ", ".join(
        f"{kind} {role!r}" for kind, role in (("producer", args.producer), ("worker", args.worker)) if role))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    return demo_main(args)


COMMANDS = {"migrate": cmd_migrate, "run": cmd_run, "enqueue": cmd_enqueue, "jobs": cmd_jobs,
            "dead": cmd_dead, "cancel": cmd_cancel, "prune": cmd_prune, "status": cmd_status,
            "queue": cmd_queue, "schedules": cmd_schedules, "sql": cmd_sql, "demo": cmd_demo}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for dest, (variable, default) in ENV_FLAGS.items():
        if hasattr(args, dest) and getattr(args, dest) is None:
            setattr(args, dest, os.environ.get(variable) or default)
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    if args.command != "run":
        # Only `pgworker run` aggregates metrics across processes; a one-shot command
        # (say, in a container whose image sets the variable) keeps them in memory.
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    try:
        return COMMANDS[args.command](args)
    except PgworkerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the reader went away (`pgworker jobs list | head`): exit quietly, as a shell tool
        # does; stdout goes to devnull so the interpreter's final flush cannot raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # a statement the server refused (privileges, constraints): no traceback, no secrets
        import psycopg

        if not isinstance(exc, psycopg.Error):
            raise
        from .names import dsn_password, redact

        dsn = getattr(args, "dsn", None) or os.environ.get("PGWORKER_DSN")
        text = redact(" ".join(str(exc).split()), dsn_password(dsn), dsn)
        hint = ("; this role lacks the privilege: see `pgworker sql grants`"
                if getattr(exc, "sqlstate", None) == "42501" else "")
        print(f"error: PostgreSQL refused the statement ({type(exc).__name__}): {text}{hint}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
