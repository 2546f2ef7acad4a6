"""The command line's arguments: every command and its flags, the value types they take,
and the tables saying which flags set a Settings field or default to another
environment variable (docs/configuration.md is generated from them)."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import Any, NoReturn

from ..jobs import REPLAY_LIMIT
from ..names import CANCEL_REASON_MAX_CHARS, bounded_text, one_line_text, redact
from .values import (_cancel_reason, _duration_or_none, _float_or_none, _int_or_none, _job_id,  # noqa: F401
                     _job_state, _positive_int, _replay_limit, parse_duration, retention_duration)

#: Flags whose default is an environment variable other than a Settings field's: dest ->
#: (variable, default when it is unset). Resolved after parsing, so that the parser (and
#: the reference generated from it, docs/configuration.md) does not depend on the
#: environment it was built in.
ENV_FLAGS: dict[str, tuple[str, str | None]] = {
    "app": ("PGWORKER_APP", None),
    "log_level": ("PGWORKER_LOG_LEVEL", "INFO"),
    "log_format": ("PGWORKER_LOG_FORMAT", "text"),
}


def _common(p: argparse.ArgumentParser, *, json: bool = True) -> None:
    """The connection flags every command takes; ``json=False`` for a command that prints
    no result (`web` serves pages: a --json it ignored was listed in its help)."""
    g = p.add_argument_group("connection")
    g.add_argument("--dsn", help="PostgreSQL DSN (env PGWORKER_DSN)")
    g.add_argument("--schema", help="pgworker's schema (env PGWORKER_SCHEMA, default pgworker)")
    g.add_argument("--app",
                   help="your App: 'package.module:app' or 'path/file.py:app'; 'package.module:create_app()' "
                        "calls a factory that returns it (env PGWORKER_APP)")
    if json:
        g.add_argument("--json", action="store_true", help="print JSON instead of a table")


class _Parser(argparse.ArgumentParser):
    """argparse without abbreviations: with them, a typo such as ``--queue`` for ``--queues``
    or ``--prio`` for ``--priority`` silently picks whichever flag it prefixes (or fails as
    "ambiguous"), and adding a flag later can change what an old command line means.
    Subparsers are made with the parser's own class, so every command inherits this."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._given: list[str] = []

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._given = [str(a) for a in (sys.argv[1:] if args is None else args)]
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        """argparse's error, and when it is about a required argument, the misspelt option
        that was probably meant as it (a trial: `effects resolve 7 charge --retyr` said
        only "one of the arguments --result --retry is required": argparse checks the
        required ones before it reports an unrecognized one). Only option names are
        echoed, never values."""
        if "required" in message:
            known = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
            for option in dict.fromkeys(a.split("=", 1)[0] for a in self._given if a.startswith("--")):
                close = difflib.get_close_matches(option, known, n=1, cutoff=0.6)
                if option not in known and close:
                    message += f"; unrecognized {one_line_text(option, 40)!r}: did you mean {close[0]}?"
        super().error(message)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """argparse's "invalid choice" with the closest choice named: `pgworker job list`
        said only "invalid choice: 'job' (choose from ...)" (Python 3.11 has no
        suggest_on_error). The value is shown bounded, with any password masked: a DSN
        typed where a command goes would otherwise be echoed whole."""
        choices = action.choices
        if choices is None or not isinstance(value, str) or value in choices:
            return super()._check_value(action, value)
        names = [str(c) for c in choices]
        close = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
        meant = f"; did you mean {close[0]!r}?" if close else ""
        shown = bounded_text(redact(value), 80)
        raise argparse.ArgumentError(action, f"invalid choice: {shown!r}{meant} (choose from "
                                             f"{', '.join(map(repr, names))})")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pgworker", description="PostgreSQL-backed job queue and worker.")
    parser.add_argument("--version", action="version", version=f"pgworker {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("migrate", help="create or upgrade pgworker's schema")
    _common(p)

    p = sub.add_parser("run", help="run the worker: a supervisor and a pool of claimer processes")
    _common(p)
    p.add_argument("--queues", help="comma-separated queues (default: \"default\" and the queues of the app's tasks)")
    p.add_argument("--concurrency", type=int, help="claimer processes (default: CPU count)")
    p.add_argument("--drain", action="store_true",
                   help="claim until nothing is due and nothing runs, then exit 0 (no LISTEN; between runs "
                        "nothing touches the database); a signal stops it gracefully and exits 128 + its "
                        "number: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP")
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
    p.add_argument("--depends-on", type=_job_id, action="append", metavar="ID",
                   help="run only after job ID succeeded (repeat it for more parents); the job joins "
                        "their graph (docs/graphs.md)")
    p.add_argument("--on-parent-failure", choices=("hold", "cancel"),
                   help="with --depends-on, if a parent ends dead or cancelled: wait for it to be "
                        "replayed (hold, the default) or be cancelled too")
    p.add_argument("--any-task", action="store_true",
                   help="enqueue a task name the --app does not register (one another service's "
                        "worker handles); without it, such a name is refused as a likely typo")

    p = sub.add_parser("jobs", help="list jobs, or show one with its error history")
    _common(p)
    jsub = p.add_subparsers(dest="jobs_command", metavar="list|show|retry")
    jl = jsub.add_parser("list", help="list jobs (default)")
    _common(jl)
    for q in (p, jl):
        q.add_argument("--queue", help="only this queue's jobs")
        q.add_argument("--task", help="only this task's jobs (its exact name, as the console's filter)")
        q.add_argument("--state", type=_job_state, choices=("pending", "running", "succeeded", "dead", "cancelled"),
                       help="only jobs in this state")
        q.add_argument("--limit", type=_positive_int, default=50, metavar="N", help="at most N jobs, newest first")
        q.add_argument("--graph", type=_job_id, metavar="ID", help="only the jobs of this graph (docs/graphs.md)")
    js = jsub.add_parser("show", help="one job in full")
    _common(js)
    js.add_argument("id", type=_job_id, help="the job's id")
    jr = jsub.add_parser("retry", help="retry now: a pending job scheduled later becomes due at once (audited)")
    _common(jr)
    jr.add_argument("id", type=_job_id, help="the job's id")

    p = sub.add_parser("dead", help="dead jobs: list or replay")
    _common(p)
    dsub = p.add_subparsers(dest="dead_command", metavar="list|replay|keys")
    dl = dsub.add_parser("list", help="dead jobs with their last error code (default)")
    _common(dl)
    for q in (p, dl):  # bare `pgworker dead` is `pgworker dead list`
        q.add_argument("--queue", help="only this queue's dead jobs")
        q.add_argument("--limit", type=_positive_int, default=50, metavar="N", help="at most N jobs, newest first")
    dk = dsub.add_parser("keys", help="ordering keys held by a dead job, with the jobs waiting behind each")
    _common(dk)
    dk.add_argument("--limit", type=_positive_int, default=100, metavar="N", help="at most N keys, oldest first")
    dr = dsub.add_parser("replay", help="replay dead jobs by id, or --queue Q --all")
    _common(dr)
    dr.add_argument("ids", nargs="*", type=_job_id, metavar="ID", help="dead jobs to put back to pending")
    dr.add_argument("--queue", help="with --all: the queue whose dead jobs to replay")
    dr.add_argument("--all", action="store_true", help="every dead job of --queue")
    dr.add_argument("--limit", type=_replay_limit, default=REPLAY_LIMIT, metavar="N",
                    help="with --all: at most N jobs, lowest ids first (run again for the rest)")
    dr.add_argument("--clean", action="store_true",
                    help="forget the jobs' recorded steps and effects: they all run again (default: kept)")

    p = sub.add_parser("graphs", help="graphs of jobs (docs/graphs.md): cancel or replay one as a whole")
    _common(p)
    gsub = p.add_subparsers(dest="graphs_command", metavar="cancel|replay", required=True)
    gc = gsub.add_parser("cancel", help="cancel every unfinished job of a graph (running ones are asked to stop)")
    _common(gc)
    gc.add_argument("graph_id", type=_job_id, metavar="GRAPH_ID", help="the graph's id (its first job's)")
    gc.add_argument("--reason", metavar="TEXT", type=_cancel_reason,
                    help=f"why, kept in each cancelled job's audit trail (at most {CANCEL_REASON_MAX_CHARS} "
                         "characters; a longer one is refused)")
    gr = gsub.add_parser("replay", help="replay a graph's dead jobs; what their death cancelled waits again")
    _common(gr)
    gr.add_argument("graph_id", type=_job_id, metavar="GRAPH_ID", help="the graph's id (its first job's)")

    p = sub.add_parser("effects", help="resolve an external effect left uncertain (EFFECT_UNCERTAIN)")
    _common(p)
    esub = p.add_subparsers(dest="effects_command", metavar="resolve")
    er = esub.add_parser("resolve", help="mark an uncertain effect done with its result, or --retry it")
    _common(er)
    er.add_argument("id", type=_job_id, help="the job's id")
    er.add_argument("name", help="the effect's name (see `pgworker jobs show ID`)")
    how = er.add_mutually_exclusive_group(required=True)
    how.add_argument("--result", metavar="JSON", help="the destination says it happened: record this result")
    how.add_argument("--retry", action="store_true",
                     help="the destination says it did not: the next attempt calls again, same idempotency key")
    er.add_argument("--replay", action="store_true", help="then replay the job if it is dead")

    p = sub.add_parser("cancel", help="cancel a job (a running one is asked to stop)")
    _common(p)
    p.add_argument("id", type=_job_id, help="the job's id")
    p.add_argument("--reason", metavar="TEXT", type=_cancel_reason,
                   help=f"why, kept in the job's audit trail (at most {CANCEL_REASON_MAX_CHARS} characters; a longer "
                        "one is refused)")

    p = sub.add_parser("prune", help="delete succeeded and cancelled jobs older than a retention")
    _common(p)
    p.add_argument("--older-than", type=retention_duration, required=True, metavar="DURATION",
                   help="finished longer ago than this, with its unit, e.g. 7d (a bare number is refused: "
                        "elsewhere it means seconds, here it would delete at once)")
    p.add_argument("--batch", type=_positive_int, default=10_000, metavar="N", help="rows deleted per statement")

    p = sub.add_parser("status", help="live jobs by queue and state (due, scheduled, blocked, waiting_on_parents, running, dead), "
                                      "oldest due job's age, expired leases; finished jobs of all queues "
                                      "(counted up to 10,000 a state, then estimated); paused queues, "
                                      "ordering keys held by a dead job")
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
    qe.add_argument("--limit", type=_positive_int, default=50, metavar="N", help="at most N events, newest first")

    p = sub.add_parser("schedules", help="periodic jobs with their next run (--app adds the declared ones)")
    _common(p)

    p = sub.add_parser("sql", help="SQL for operators: least-privilege grants")
    ssub = p.add_subparsers(dest="sql_command", metavar="grants", required=True)
    sg = ssub.add_parser("grants", help="GRANTs for a producer, a worker and a read-only console role "
                                        "(print, or --apply)")
    _common(sg)
    sg.add_argument("--producer", help="role that may only enqueue and read job state")
    sg.add_argument("--worker", help="role that may claim, record outcomes and run the reaper")
    sg.add_argument("--viewer", help="role for the read-only web console (`pgworker web --read-only`): "
                                     "reads every page, writes nothing")
    sg.add_argument("--apply", action="store_true", help="run the statements with --dsn (the schema's owner)")

    p = sub.add_parser("web", help="the web console: jobs, queues, dead jobs, schedules, workers, bulk operations "
                                   "(needs pip install 'pgworker[web]')")
    _common(p, json=False)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; beyond loopback it needs PGWORKER_WEB_USERS "
                        "or PGWORKER_WEB_TOKENS)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--read-only", action="store_true",
                   help="offer and accept no action (env PGWORKER_WEB_READ_ONLY; pair it with the viewer role "
                        "of `pgworker sql grants`)")
    p.add_argument("--root-path", default="", metavar="PATH",
                   help="the path prefix a reverse proxy serves the console under, e.g. /pgworker")
    p.add_argument("--trace-url", metavar="TEMPLATE",
                   help="link a job's trace id: a URL with {trace_id} (env PGWORKER_WEB_TRACE_URL)")
    p.add_argument("--log-level", metavar="LEVEL", help="DEBUG, INFO, WARNING or ERROR (default INFO)")

    parser.commands = sub.choices  # type: ignore[attr-defined]  # name -> parser, for usage errors of one command
    p = sub.add_parser("demo", help="run a realistic workload end to end (embedded PostgreSQL without --dsn)",
                       description="Enqueue a realistic workload (images rendered to files, webhooks to a local "
                                   "endpoint, reports; some fail on purpose, some are enqueued twice, a small graph), "
                                   "run a worker over it with a progress display and print a summary.")
    # not _common's: the demo loads no --app and prints no JSON (a trial: both were accepted
    # and ignored), and its schema is its own, dropped and refilled on every run
    g = p.add_argument_group("connection")
    g.add_argument("--dsn", help="PostgreSQL DSN (env PGWORKER_DSN); without one, an embedded PostgreSQL is "
                                 "started and deleted at exit").doc_default = "`PGWORKER_DSN`, else embedded"
    g.add_argument("--schema", help="the schema the demo fills (default pgworker_demo on your database, never "
                                    "PGWORKER_SCHEMA's; pgworker in the embedded one); it refuses one that "
                                    "holds jobs already").doc_default = "pgworker_demo (embedded: pgworker)"
    p.add_argument("--jobs", type=int, default=400, metavar="N",
                   help="jobs in all, at least 6: a graph of 5 and an invoice, the rest a mixed workload "
                        "(duplicate enqueues, refused by their dedupe key, are not jobs)")
    p.add_argument("--concurrency", type=int, default=4, metavar="N", help="claimer processes of its worker")
    p.add_argument("--keep", action="store_true",
                   help="keep the outputs and, without --dsn, the embedded PostgreSQL running (to inspect "
                        "the jobs)")
    return parser


def attach_negative_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`--delay -5s` as `--delay=-5s`: argparse reads a value that starts with '-' and is
    not a plain number as an option, and said only "expected one argument"; attached, the
    option's own type names what is wrong with it."""
    takes_value: set[str] = set()

    def walk(p: argparse.ArgumentParser) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
            elif action.option_strings and action.nargs is None and not isinstance(
                    action, (argparse._StoreConstAction, argparse._HelpAction, argparse._VersionAction)):
                takes_value.update(o for o in action.option_strings if o.startswith("--"))

    walk(parser)
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in takes_value and re.match(r"-\d", arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


_ABSENT: Any = object()


def _version() -> str:
    from .._version import __version__

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
