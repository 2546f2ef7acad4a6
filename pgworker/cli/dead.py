"""`pgworker dead`: list dead jobs, the ordering keys a dead job holds, and replay them
(by id, or a queue's), saying what a replay left as it was and why: not dead, held by
a dedupe key, an effect still uncertain."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from ..jobs import REPLAY_LIMIT
from ..names import bounded_text, quantity, schema_flag
from .output import emit
from .settings import _make_app
from .values import EXIT_USAGE
from .jobs import _note_limit


def cmd_dead(args: argparse.Namespace) -> int:
    app = _make_app(args)
    if getattr(args, "dead_command", None) == "keys":
        with app.connection() as conn:
            rows = app.store.dead_blocked_keys(conn, limit=args.limit)
        emit(args, rows, ["queue", "ordering_key", "dead_job_id", "task", "last_error_code", "finished_at",
                          "waiting"])
        return 0
    if getattr(args, "dead_command", None) == "replay":
        queue = shlex.quote(args.queue) if args.queue else "QUEUE"  # the commands are pasted as printed
        if args.ids and (args.all or args.queue):
            # --all (or --queue) beside ids was ignored without a word: which did they mean?
            ids = " ".join(map(str, args.ids))
            print(f"error: give job ids or --queue QUEUE --all, not both: `pgworker dead replay {ids}` replays "
                  f"those jobs, `pgworker dead replay --queue {queue} --all` every dead job of the "
                  "queue", file=sys.stderr)
            return EXIT_USAGE
        if not args.ids and not (args.queue and args.all):
            # a usage error, as the one above: exit 2, like argparse's
            half = (f"--queue {queue} alone replays nothing" if args.queue else
                    "--all needs --queue QUEUE" if args.all else "nothing to replay")
            print(f"error: {half}: give job ids (`pgworker dead replay 12 13`), or "
                  f"`pgworker dead replay --queue {queue} --all` for every dead job of a queue",
                  file=sys.stderr)
            return EXIT_USAGE
        result = app.replay(args.ids, queue=args.queue if args.all else None, limit=args.limit,
                            clean=args.clean)
        if args.json:
            emit(args, {"replayed": sorted(result), "not_dead": result.not_dead, "requeued": result.requeued,
                        "held": [{"id": i, "held_by": h} for i, h in sorted(result.held_by.items())],
                        "limit_reached": result.limit_reached})
        else:
            print(f"replayed {quantity(len(result), 'job')}"
                  + (f": {', '.join(map(str, sorted(result)[:50]))}" if result else ""))
            if result.requeued:  # the jobs their death cancelled (PARENT_DEAD) wait again
                print(f"{quantity(len(result.requeued), 'child', 'children')} cancelled by their death wait again "
                      "for their parents")
        for line in _held_keys_notes(app, result.held_by):
            print(line, file=sys.stderr)
        if result and not args.clean:
            for line in _uncertain_effects_notes(app, list(result)):
                print(line, file=sys.stderr)
        if result.not_dead:
            print(f"left as they were: {_not_dead_states(app, result.not_dead)}", file=sys.stderr)
        if args.all and not result and not result.held_by:
            _note_unknown_queue(app, args.queue)
        if result.limit_reached:
            # one transaction takes at most --limit jobs; it said "replayed 10,000 jobs" and
            # nothing of the dead jobs it left (a trial)
            print(f"note: a replay takes at most --limit {args.limit:,} dead jobs of a queue (one transaction), "
                  f"and queue {args.queue!r} holds more: run `pgworker dead replay --queue {queue} --all"
                  f"{' --limit ' + str(args.limit) if args.limit != REPLAY_LIMIT else ''}"
                  f"{' --clean' if args.clean else ''}{schema_flag(app.settings.schema)}` again for the rest, "
                  "or raise --limit", file=sys.stderr)
        # by id, every job asked for must be replayed; --all replays what it can
        return 1 if (result.not_dead or result.held_by) and args.ids else 0
    rows = app.list_jobs(queue=args.queue, state="dead", limit=args.limit + 1)
    more, rows = len(rows) > args.limit, rows[:args.limit]
    emit(args, rows, ["id", "queue", "task", "attempts", "last_error_code", "finished_at"])
    _note_limit(args, more)
    return 0


def _uncertain_effects_notes(app: Any, ids: list[int]) -> list[str]:
    """A note per replayed job with an effect an earlier attempt started and never recorded
    done (a trial: `dead replay` of an EFFECT_UNCERTAIN job said "replayed 1 job", and the
    job was dead again seconds later): unless its handler reconciles, it ends the same way;
    the note gives the commands that resolve it."""
    with app.connection() as conn:
        found = app.store.effects_uncertain(conn, ids[:1000])
    flag = schema_flag(app.settings.schema)
    return [f"note: job {job_id}'s effect {name!r} was started by an earlier attempt that never recorded its end: "
            "unless the handler gives a reconcile function, the job goes dead EFFECT_UNCERTAIN again; check the "
            f"destination, then `pgworker effects resolve {job_id} {shlex.quote(name)} --result JSON{flag}` (it "
            f"happened) or `... --retry{flag}` (it did not)" for job_id, name in found]


#: The ids a replay's "left as they were" names with their states (one read by id for all).
NOT_DEAD_SHOWN = 50


def _not_dead_states(app: Any, ids: list[int]) -> str:
    """'1: succeeded, not dead; 9: unknown (no job 9 in schema 's')' for the ids a replay
    found not dead: each one's state as it is now, as `cancel` says it ("not dead (or
    unknown)" said neither which nor why). One primary-key read of the first
    NOT_DEAD_SHOWN; the rest by id."""
    shown = ids[:NOT_DEAD_SHOWN]
    with app.connection() as conn:
        states = {row[0]: row[1] for row in app.store.lease_states(conn, shown)}
    schema = app.settings.schema
    parts = [f"{i}: {states[i]}, not dead" if i in states else f"{i}: unknown (no job {i} in schema {schema!r})"
             for i in shown]
    if len(ids) > len(shown):
        parts.append(f"and {quantity(len(ids) - len(shown), 'more id')} not dead or unknown: "
                     + ", ".join(map(str, ids[len(shown):len(shown) + 50])))
    return "; ".join(parts)


#: The dead jobs left behind a held dedupe key whose holder a replay describes; the rest by id.
HELD_DESCRIBED = 10


def _note_unknown_queue(app: Any, queue: str) -> None:
    """After `dead replay --queue Q --all` found nothing: say so when Q holds no live job
    and has no settings (a mistyped name looked like a queue with nothing dead). The
    check is queues_live's few index descents per queue, on this rare path only."""
    with app.connection() as conn:
        known = queue in app.store.live_queues(conn)
    if not known:
        print(f"note: queue {queue!r} has no pending, running or dead jobs and no settings: check its name "
              f"(`pgworker status{schema_flag(app.settings.schema)}` lists the queues)", file=sys.stderr)


def _held_keys_notes(app: Any, held_by: dict[int, int]) -> list[str]:
    """What to do about each dead job a replay left dead because another job holds its dedupe
    key: that job does the key's work, so discard the dead one, or cancel the holder first.
    The holder's state (one read each, for the first HELD_DESCRIBED) says which applies."""
    flag = schema_flag(app.settings.schema)
    notes = []
    for n, (dead, holder) in enumerate(sorted(held_by.items())):
        if n == HELD_DESCRIBED:
            rest = sorted(held_by)[n:]
            notes.append(f"{quantity(len(rest), 'more job')} stayed dead, their dedupe keys held by other jobs: "
                         + ", ".join(f"{d} (by {held_by[d]})" for d in rest[:50]))
            break
        job = app.get_job(holder) or {}
        key = bounded_text(repr(job.get("dedupe_key")), 80)
        if job.get("state") == "succeeded":
            until = job["dedupe_until"].isoformat(timespec="seconds") if job.get("dedupe_until") else "?"
            notes.append(f"job {dead} stayed dead: its dedupe key {key} is held by job {holder}, which succeeded "
                         f"and keeps the key until {until} (its dedupe window): the work was done; discard job "
                         f"{dead} with `pgworker cancel {dead}{flag}`, or replay it after then")
        else:
            state = f" ({job['state']})" if job.get("state") else ""
            notes.append(f"job {dead} stayed dead: its dedupe key {key} is held by job {holder}{state}, which does "
                         f"that key's work; discard job {dead} with `pgworker cancel {dead}{flag}`, or, to run job "
                         f"{dead} instead, cancel job {holder} (`pgworker cancel {holder}{flag}`) and replay again")
    return notes
