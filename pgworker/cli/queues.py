"""Commands on queues: status (jobs by queue and state) and queue list/pause/resume/set/
delete/events."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from ..errors import ConfigError
from .output import _fmt, emit
from .parser import _ABSENT
from .settings import _make_app


def cmd_status(args: argparse.Namespace) -> int:
    from ..status import FINISHED_COUNT_LIMIT, status_reads

    app = _make_app(args)
    with app.connection() as conn:
        report = status_reads(app, conn)
    rows = report.state_rows()
    paused = [q for q in report.queues if q["paused_at"] is not None]
    if args.json:  # the state rows, each saying whether its queue is paused (`dead keys` lists the keys)
        emit(args, rows)
        return 0
    live = [r for r in rows if r["queue"] is not None]
    emit(args, live, ["queue", "state", "jobs", "oldest_due_age_seconds", "expired_leases"])
    done = [{"state": r["state"], "jobs": _finished_jobs(r)} for r in rows if r["queue"] is None]
    if done:
        print(f"\nfinished jobs, all queues (counted up to {FINISHED_COUNT_LIMIT:,} a state, past that ~ the "
              "planner's estimate; by queue: pgworker_jobs_finished_total):")
        emit(args, done, ["state", "jobs"])
    if paused:
        print("\npaused queues (enqueues go on; nothing is claimed):")
        emit(args, paused, ["name", "paused_at", "paused_by", "running"])
    for u in report.unclaimed:  # a misspelt queue= waits forever otherwise
        print(f"\nqueue {u['queue']!r} has {u['due']:,} due job(s) and no live worker claims from it "
              f"(the live workers claim: {', '.join(u['claimed'])}): check the queue name given at enqueue, "
              f"or start a worker with --queues {shlex.quote(u['queue'])} (PGWORKER_QUEUES)")
    if report.blocked:
        print("\nordering keys held by a dead job (replay it with `pgworker dead replay ID`, "
              "or discard it with `pgworker cancel ID`):")
        emit(args, report.blocked, ["queue", "ordering_key", "dead_job_id", "task", "last_error_code", "finished_at",
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
        rows = app.queue_settings()
        if not rows and not args.json:  # "(none)" read as "no queues" while queues held jobs
            print("(no queue has settings or a pause; queues need none to work: `pgworker status` lists "
                  "the queues that hold jobs)")
            return 0
        emit(args, rows, ["name", "paused_at", "paused_by", "concurrency_limit", "running",
                          "rate_per_second", "rate_burst", "aging_seconds"])
    if warning:
        print(warning, file=sys.stderr)
    return 0


def _unused_queue_warning(app: Any, args: argparse.Namespace) -> str | None:
    """The warning for pausing or configuring a queue nothing uses, or None: no claimable,
    running or dead job, none among the last finished ones, no schedule, no settings row
    or audit event yet, and not a queue of the --app's tasks (or 'default'). The name is
    then likely a typo, and the command would make a row nobody uses. Only a warning:
    limiting a queue ahead of its first job is fine. Asked before the command runs (the
    command makes the row)."""
    usage = app.queue_usage(args.name)
    if any(usage.values()):
        return None
    name = shlex.quote(args.name)  # the commands are pasted into a shell as printed
    tasks = "no task of the --app uses it" if args.app else "no --app was given to check its tasks' queues"
    undo = (f"`pgworker queue resume {name}` then `pgworker queue delete {name}`"
            if args.queue_command == "pause" else f"`pgworker queue delete {name}`")
    return (f"warning: queue {args.name!r} has no pending, running or dead jobs, none among the jobs that "
            f"finished last, no schedule and no history of settings, and {tasks}: a typo? Undo with {undo}")


def _finished_jobs(row: dict[str, Any]) -> str:
    """A finished state's count as `status` prints it: exact, ~estimated, or only a lower
    bound when the table was never analyzed (autovacuum off: docs/deploy.md)."""
    if row.get("more_than"):
        return f">{row['jobs']:,} (not estimated: ANALYZE has not run on the jobs table)"
    return f"~{row['jobs']:,}" if row["estimated"] else f"{row['jobs']:,}"
