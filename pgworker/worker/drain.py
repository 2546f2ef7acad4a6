"""Drain mode (``pgworker run --drain``): what a run does before it claims, and its report.

A drain run is what a Kubernetes CronJob runs against a compute that must be allowed to
suspend: no LISTEN, no timers, no statistics queries, no HTTP server, and it exits once
every claimer's last round found nothing and no retry it wrote falls due within one poll
interval (claimer/due_later.py; nor one the supervisor wrote for a stopped or dead
claimer's job: supervisor/retry_hold.py; while it runs, the fallback poll wakes idle claimers, so
a retry that becomes due while another job runs is not left waiting for it). So the maintenance that an always-on worker does on timers happens once, before
claiming:
reap expired leases (their jobs are due at once: the gap between runs is their
backoff), enqueue the due slots of the app's periodic jobs, and prune finished jobs
past their retention. At exit it prints one JSON summary line and can push it to a
Pushgateway.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import psycopg

from ..schedules import Scheduler
from .pruner import Retention, prune_pass, refused_hint
from .reaper import ReaperConfig, reap_pass
from .shm.layout import OUTCOME_FIELDS

log = logging.getLogger("pgworker.worker")


@dataclass
class RunSummary:
    """What a run did, for the drain-mode JSON line and the Pushgateway."""

    counts: dict[str, int] = field(default_factory=lambda: {f: 0 for f in OUTCOME_FIELDS})
    left: int = 0
    left_paused: int = 0  # due jobs of paused queues, which no claim takes (not in left)
    next_due_seconds: float | None = None  # until the earliest job not due yet (None: none)
    # time.monotonic() at the start: a duration must not follow the wall clock, which an
    # NTP step or a resumed VM moves back (a run once reported -3593 s)
    started: float = field(default_factory=time.monotonic)
    result: str = "succeeded"
    # the maintenance before claiming that failed ("scheduler: ..."): the run then fails
    # (a scale-to-zero CronJob would otherwise look healthy while a schedule never fires)
    maintenance_failed: list[str] = field(default_factory=list)

    @property
    def duration_seconds(self) -> float:
        """Seconds since the run started (monotonic clock)."""
        return time.monotonic() - self.started

    def add(self, counts: dict[str, int]) -> None:
        for k, v in counts.items():
            self.counts[k] = self.counts.get(k, 0) + v

    def as_json(self) -> str:
        c = self.counts
        return json.dumps({
            "event": "drain_summary", "result": self.result,
            "processed": sum(c.values()), "succeeded": c["succeeded"], "retried": c["retried"],
            "dead": c["dead"], "cancelled": c["cancelled"], "released": c["released"],
            "snoozed": c["snoozed"], "lost": c["lost"], "left": self.left, "left_paused": self.left_paused,
            "next_due_seconds": None if self.next_due_seconds is None else round(self.next_due_seconds, 3),
            "duration_seconds": round(self.duration_seconds, 3),
            "maintenance_failed": self.maintenance_failed}, sort_keys=False)


def before_claiming(app: Any, connect: Callable[[str], psycopg.Connection], metrics: Any, *,
                    schedules: bool, prune: bool) -> list[str]:
    """The maintenance of a drain run, once: reap, fire due schedules, prune. A failure
    of one step is logged and the run goes on (claiming is what it is for); returns what
    failed, one line a step ("scheduler: ..."; a schedule that could not be recorded or
    fired counts), for the summary, which then fails the run."""
    failed: list[str] = []
    settings = app.settings
    steps: list[tuple[str, Callable[[psycopg.Connection], str | None]]] = [
        ("reaper", lambda c: _reaped(reap_pass(app.store, c, ReaperConfig(), metrics)))]
    if schedules:
        steps.append(("scheduler", lambda c: _fired(app, c, metrics)))
    if prune:
        steps.append(("pruner", lambda c: _pruned(prune_pass(app.store, c, Retention.from_settings(settings),
                                                              metrics))))
    for name, step in steps:
        try:
            with connect(f"pgworker:{name}") as conn:
                said = step(conn)
            if said:
                log.info("drain: %s before claiming", said)
        except psycopg.errors.InsufficientPrivilege as exc:
            hint = refused_hint(app.store.schema, exc) if name == "pruner" else exc.diag.message_primary
            log.error("drain: %s failed before claiming: %s", name, hint)
            failed.append(f"{name}: {hint}")
        except ScheduleFailed as exc:
            failed.append(f"{name}: {exc}")  # each schedule's failure is logged with its fix
        except Exception as exc:  # noqa: BLE001 - the run goes on
            log.error("drain: %s failed before claiming: %s", name, type(exc).__name__)
            failed.append(f"{name}: {type(exc).__name__}")
    return failed


class ScheduleFailed(Exception):
    """Schedules of a drain run that could not be recorded or fired (each logged, with its fix)."""


def _reaped(n: int) -> str | None:
    return f"reaped {n} expired lease(s)" if n else None


def _fired(app: Any, conn: psycopg.Connection, metrics: Any) -> str | None:
    from .scheduler import tick

    scheduler = Scheduler(app.store, list(app.schedules.values()), app.tasks)
    scheduler.register(conn)
    tick(scheduler, conn, metrics)
    if scheduler.errors:
        raise ScheduleFailed(f"schedule(s) {', '.join(sorted(scheduler.errors))} could not be recorded or fired "
                             f"(the log says why and the fix); enqueued {scheduler.fired} periodic job(s)")
    return f"enqueued {scheduler.fired} periodic job(s)" if scheduler.fired else None


def _pruned(counts: dict[str, int]) -> str | None:
    n = sum(counts.values())
    return f"pruned {n} finished row(s)" if n else None


def report(summary: RunSummary, pushgateway_url: str | None, schema: str) -> None:
    """Print the JSON summary line; push it to the Pushgateway when one is configured."""
    try:
        print(summary.as_json(), flush=True)
    except OSError as exc:  # a closed terminal (EIO after SIGHUP): the push and the exit code stand
        log.warning("could not print the drain summary (%s); the exit code and the push still say how it "
                    "ended", type(exc).__name__)
    if pushgateway_url:
        from ..metrics_push import push_drain_summary

        try:
            push_drain_summary(pushgateway_url, summary, schema)
        except Exception as exc:  # noqa: BLE001 - the run's outcome stands
            log.error("pushing the drain summary to %s failed: %s", pushgateway_url, exc)
