"""Commands on jobs: enqueue, jobs list/show/retry, dead list/keys/replay, cancel, prune."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from ..errors import AlreadyEnqueued, ConfigError
from ..names import quantity, schema_flag, visible
from .output import emit
from .settings import _make_app


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
    from .. import tracing

    provider = tracing.setup_process(app.settings.tracing, console_out=sys.stderr)
    deduplicated = False
    try:
        # 'raise' so a held dedupe key is told from a new job: the id printed is the same
        job_id = app.enqueue(args.task, payload, queue=args.queue, priority=args.priority, delay=args.delay,
                             max_attempts=args.max_attempts, dedupe_key=args.dedupe_key,
                             ordering_key=args.ordering_key, dedupe_window=args.dedupe_window,
                             ordering_on_dead=args.ordering_on_dead, any_task=args.any_task,
                             depends_on=args.depends_on, on_parent_failure=args.on_parent_failure,
                             on_conflict="raise")
    except AlreadyEnqueued as held:
        job_id, deduplicated = held.job_id, True
    finally:
        tracing.flush(provider)  # a one-shot process: export before exit, not at the next batch
    if deduplicated:
        print(f"note: job {job_id} already holds dedupe key {args.dedupe_key!r}: nothing new was enqueued "
              f"(the id is that job's; this command's payload and options were not applied)", file=sys.stderr)
    elif args.task not in app.tasks:
        _note_enqueue_defaults(args)
    emit(args, {"id": job_id, "deduplicated": deduplicated}) if args.json else print(job_id)
    return 0


def _note_enqueue_defaults(args: argparse.Namespace) -> None:
    """Say on stderr what a job of a task unknown here went without: with no --app its
    name was checked against nothing (a typo enqueues a job that later dies UNKNOWN_TASK),
    and the task's own queue and attempts are declared in code this process did not load,
    so pgworker's defaults were used (a job in the wrong queue waits for a worker that
    never claims it)."""
    from ..config import DEFAULT_QUEUE
    from ..tasks import DEFAULT_MAX_ATTEMPTS

    used = [f"{name}={value!r} ({flag})" for name, flag, given, value in (
        ("queue", "--queue", args.queue, DEFAULT_QUEUE),
        ("max_attempts", "--max-attempts", args.max_attempts, DEFAULT_MAX_ATTEMPTS)) if given is None]
    defaults = f"used the defaults {', '.join(used)}" if used else ""
    if not args.app:
        # said even when every setting was given: the name is the part nothing checked
        unchecked = (f"note: no --app, so the task name {args.task!r} was not checked against any "
                     "registered task (name --app to check it)")
        print(unchecked + (f"; its own settings are unknown here too: {defaults}" if used else ""),
              file=sys.stderr)
    elif used:
        print(f"note: --app does not register {args.task!r}, so the task's own settings are unknown "
              f"here; {defaults}", file=sys.stderr)


def cmd_jobs(args: argparse.Namespace) -> int:
    app = _make_app(args)
    if getattr(args, "jobs_command", None) == "retry":
        return _retry(args, app)
    if getattr(args, "jobs_command", None) == "show":
        job = app.get_job(args.id)
        if job is None:
            print(f"error: no job {args.id}", file=sys.stderr)
            return 1
        if job.get("ordering_key") is None and not args.json:
            # what a dead job does to its ordering key: meaningless without one (JSON keeps
            # every column, for scripts)
            job.pop("dead_blocks_key", None)
        if not args.json:
            # free text printed as is could write lines of its own (a progress message of
            # "...\r\nFAKE LOG LINE"); lists and dicts are printed as JSON, escaped already
            job = {k: visible(v) if isinstance(v, str) else v for k, v in job.items()}
        if not args.json:  # one line per parent and child: id (task): state
            if job["state"] == "succeeded" and job.get("last_error_code"):
                job["last_error_code"] = f"earlier attempt failed: {job['last_error_code']} (the job succeeded)"
            for side in ("parents", "children"):
                if side in job:
                    job[side] = [f"{r['id']} ({r['task']}): {r['state']}"
                                 + (f" {error_shown(r)}" if r.get("last_error_code") else "")
                                 + (f", waiting for {r['waiting_parents']}" if r.get("waiting_parents") else "")
                                 for r in job[side]]
            if isinstance(job.get("progress"), (int, float)):
                job["progress"] = percent(job["progress"])
        tracebacks = [] if args.json else _tracebacks_apart(job)
        emit(args, job)
        for attempt, lines in tracebacks:
            print(f"\ntraceback of attempt {attempt} (innermost frame last):")
            for line in lines:
                print(f"  {line}")
        return 0
    if args.graph is not None and args.queue is not None:
        raise ConfigError("--graph lists one graph's jobs whatever their queue: give --graph or --queue")
    # one row past the limit says whether more exist (the note below), and is not shown
    rows = app.list_jobs(queue=args.queue, state=args.state, limit=args.limit + 1, graph_id=args.graph,
                         task=args.task)
    more, rows = len(rows) > args.limit, rows[:args.limit]
    if not args.json:  # --json keeps the columns as stored: they are data
        rows = [{**r, "state": state_shown(r), "last_error_code": error_shown(r)} for r in rows]
    emit(args, rows, ["id", "queue", "task", "state", "priority", "attempts", "max_attempts",
                      "run_at", "last_error_code"])
    _note_limit(args, more)
    if not rows and (args.task is not None or args.queue is not None):
        _note_close_names(app, args)
    if not rows and args.graph is not None:
        _note_unknown_graph(app, args.graph)
    return 0


def _note_unknown_graph(app: Any, graph_id: int) -> None:
    """After a `jobs list --graph ID` that listed nothing: when no job carries that graph
    id at all, say so, as `graphs cancel|replay` do (a trial: "(none)" alone, for a
    mistyped id and for a job id that is no graph's alike)."""
    from .. import graphs  # as cli/graphs.py: psycopg after the fork server starts

    if not graphs.graph_states(app.core, graph_id):
        print(f"note: there is no graph {graph_id} in schema {app.settings.schema!r}: no job carries that graph "
              "id (a graph's id is its first job's id; `pgworker jobs show ID` prints a job's graph)", file=sys.stderr)


def state_shown(row: dict[str, Any]) -> str:
    """A pending job that cannot be claimed yet says why (its run_at reads as due):
    'pending (waits for 2 parents)', 'pending (behind its ordering key)'."""
    if row["state"] != "pending":
        return str(row["state"])
    waiting = row.get("waiting_parents") or 0
    if waiting:
        return f"pending (waits for {waiting} parent{'' if waiting == 1 else 's'})"
    return "pending (behind its ordering key)" if row.get("blocked") else "pending"


def _note_close_names(app: Any, args: argparse.Namespace) -> None:
    """After a `jobs list --task/--queue` that matched no job: name the close name on
    stderr (`--task ad`: did you mean 'add'?), when the name given is not one of them.
    The names: the live queues and those with settings (queues_live: a few index descents
    per queue), the --app's tasks, and both among the newest jobs (recent_known_names)."""
    from ..jobfilter import closest_name, recent_known_names

    with app.connection() as conn:
        queues, tasks = recent_known_names(app, conn)
        if args.queue is not None:
            queues += app.store.live_queues(conn)
    for flag, given, known in (("--task", args.task, tasks), ("--queue", args.queue, queues)):
        close = closest_name(given, known) if given is not None else None
        if close:
            print(f"note: no job matched {flag} {given!r}; did you mean {flag} {close!r}?", file=sys.stderr)


def _note_limit(args: argparse.Namespace, more: bool) -> None:
    """Say on stderr that a list stopped at --limit with more jobs left: a full page looked
    like every job there is. Not with --json (its output is data alone)."""
    if more and not args.json:
        print(f"(showing the first {args.limit}, newest first; --limit N for more)", file=sys.stderr)


def _tracebacks_apart(job: dict[str, Any]) -> list[tuple[Any, list[str]]]:
    """Take each stored traceback out of the job's error history, to be printed after the
    record as lines (inside the history's JSON it would be one escaped line); returns
    (attempt, lines), each line made visible (a source line cannot print escapes)."""
    out: list[tuple[Any, list[str]]] = []
    errors = job.get("errors")
    if not isinstance(errors, list):
        return out
    for entry in errors:
        if isinstance(entry, dict) and isinstance(entry.get("traceback"), str):
            trace = entry.pop("traceback")
            out.append((entry.get("attempt", "?"), [visible(line) for line in trace.splitlines()]))
            entry["traceback"] = f"(printed below, attempt {entry.get('attempt', '?')})"
    return out


def error_shown(row: dict[str, Any]) -> str | None:
    """A job's last error code as a table shows it: what ended a dead (or cancelled) job;
    any other job's is an earlier attempt's, "(earlier: RuntimeError)" ("succeeded
    RuntimeError" read as a failure, and a replayed job, pending with its attempts at 0,
    read as failing now: a trial)."""
    code = row.get("last_error_code")
    return f"(earlier: {code})" if code and row.get("state") not in ("dead", "cancelled") else code


def percent(fraction: float) -> str:
    """A progress fraction (0..1) as a percentage with up to one decimal, rounded down so
    that only a finished job shows 100 % (0.975 -> "97.5 %", 0.9999 -> "99.9 %", 0.25 ->
    "25 %"); the general float format's one decimal showed 0.975 as "1.0"."""
    tenths = math.floor(fraction * 1000 + 1e-6)  # the epsilon: 0.29 * 1000 is 289.99999999999994
    return f"{tenths // 10} %" if tenths % 10 == 0 else f"{tenths / 10:.1f} %"


def _retry(args: argparse.Namespace, app: Any) -> int:
    moved = app.retry(args.id)
    if moved is None:
        job = app.get_job(args.id)
        flag = schema_flag(app.settings.schema)
        why = "unknown" if job is None else (
            f"{job['state']}, not pending" if job["state"] != "pending" else
            "pending and due already" + _still_waits(job, flag))
        # a dead job runs again by a replay: the command that does what was meant
        fix = (f"; to run a dead job again, replay it: `pgworker dead replay {args.id}{flag}`"
               if job is not None and job["state"] == "dead" else "")
        print(f"error: job {args.id} is {why}: only a pending job scheduled later can be retried now "
              f"(`pgworker jobs show {args.id}{flag}`){fix}", file=sys.stderr)
        return 1
    job = app.get_job(args.id)
    waits = _still_waits(job, schema_flag(app.settings.schema)) if job is not None else ""
    if args.json:
        emit(args, {"id": args.id, "previous_run_at": moved["previous_run_at"].isoformat(),
                    "waits_for": waits[len(", but it still waits "):] or None})
    else:
        print(f"job {args.id}: due now (it was due {moved['previous_run_at'].isoformat(timespec='seconds')})"
              + waits)
    return 0


def _still_waits(job: dict[str, Any], flag: str = "") -> str:
    """', but it still waits ...' for a pending job that due alone does not make run (a
    break-it trial: `jobs retry` said "due now" of a job behind its ordering key's head or
    waiting for its parents, and nothing ran): its parents, or its key's earlier job."""
    waiting = job.get("waiting_parents") or 0
    if waiting:
        return (f", but it still waits for {quantity(waiting, 'parent')} to succeed (`pgworker jobs show "
                f"{job['id']}{flag}` lists them)")
    if job.get("blocked"):
        return (f", but it still waits behind an earlier job of its ordering key {visible(job['ordering_key'])!r}: "
                f"it runs when that one finishes (`pgworker dead keys{flag}` lists keys a dead job holds)")
    return ""


def cmd_cancel(args: argparse.Namespace) -> int:
    app = _make_app(args)
    before = app.get_job(args.id)  # a dead job's cancel is its discard: the message says which it was
    state = app.cancel(args.id, reason=args.reason)
    if state is None:
        job = app.get_job(args.id)  # which of the two it is: "unknown or already finished" said neither
        if job is not None:
            why = f"job {args.id} has already finished ({job['state']}): there is nothing to cancel"
        else:
            why = f"there is no job {args.id} in schema {app.settings.schema!r} (--schema, PGWORKER_SCHEMA)"
        print(f"error: {why}", file=sys.stderr)
        return 1
    discarded = state == "cancelled" and before is not None and before["state"] == "dead"
    msg = ("discarded (it was dead: now cancelled, it will not be replayed)" if discarded
           else "cancelled") if state == "cancelled" else (
        "cancellation requested (the job is running): its handler sees it at its next ctx.progress "
        "write or with the next lease renewal, within a third of the lease, and stops when it calls "
        "ctx.check() (an async handler is cancelled for it); a handler that returns first ends "
        "succeeded; see `pgworker jobs show "
        f"{args.id}{schema_flag(app.settings.schema)}`")
    emit(args, {"id": args.id, "state": state}) if args.json else print(f"job {args.id}: {msg}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    app = _make_app(args)
    n = app.prune(args.older_than, batch=args.batch)
    emit(args, {"deleted": n}) if args.json else print(f"deleted {quantity(n, 'finished job')}")
    return 0
