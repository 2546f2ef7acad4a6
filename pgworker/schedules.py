"""Periodic jobs: cron expressions in a time zone, each slot enqueued exactly once.

Declared on a task (``@app.task(schedule="*/5 * * * *", schedule_tz="Europe/Paris")``)
or with :meth:`pgworker.App.periodic`. Slots are computed by ``croniter`` in the
schedule's time zone (so "0 9 * * *" in Europe/Paris is 09:00 local time in summer and
in winter; a slot in a skipped DST hour fires at the end of the gap, an hour repeated
at the fall-back fires twice) and compared with the database clock, never the
worker's.

Every ``pgworker run`` supervisor runs a :class:`Scheduler` (in its scheduler service,
:mod:`pgworker.worker.scheduler`); they need not coordinate. Each schedule has a row in ``schedules`` whose ``last_slot`` only moves
forward by compare-and-set (``schedule_fire``): whichever supervisor gets to a slot
first advances the row and inserts the job in the same statement; the others find the
row advanced and insert nothing. A unique index on (schedule_name, schedule_slot) backs
this up with one key per slot.

Missed slots (every supervisor was down): the due slots older than the latest are never
enqueued; the latest is enqueued once with the policy ``missed="latest"`` (default), and
with ``missed="skip"`` only if it is less than ``misfire_grace`` seconds late. A drain run
(``pgworker run --drain``) fires each schedule's due slot once at start, under the same
policy: in a scale-to-zero deployment the CronJob's own schedule bounds the lateness.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Mapping, Sequence
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import psycopg
from psycopg import sql

from .config import MAX_PAYLOAD_BYTES
from .errors import ConfigError, InvalidJob, PayloadError
from .names import bounded_text, check_new_queue_name, check_task_name
from .jobspec import serialize_payload
from .tasks import check_max_attempts, check_priority

if TYPE_CHECKING:
    from .store import Store
    from .tasks import Task

log = logging.getLogger("pgworker.schedules")

MISSED_POLICIES = ("latest", "skip")
MISFIRE_GRACE_SECONDS = 60.0
# Counting missed slots (for the log and the row's skipped_slots) stops here.
MAX_SLOTS_COUNTED = 10_000
# The scheduler re-registers its schedules and re-reads their rows at least this often.
RESYNC_SECONDS = 60.0
# Wake a little after a slot so that the database clock has passed it too.
WAKE_SLACK_SECONDS = 0.02


#: The five fields of a cron expression, and the values each takes.
CRON_FIELDS = (("minute", "0-59"), ("hour", "0-23"), ("day of month", "1-31"), ("month", "1-12 or jan-dec"),
               ("day of week", "0-7 or sun-sat"))


def _bad_field(cron: object) -> str:
    """': its hour field '25' is not 0-23' for the first field croniter refuses on its own
    (the others set to '*'), '' when no single field is to blame (or not five fields)."""
    if not isinstance(cron, str) or len(cron.split()) != 5:
        return ""
    croniter = _croniter()
    parts = cron.split()
    for i, (name, values) in enumerate(CRON_FIELDS):
        alone = " ".join(parts[i] if j == i else "*" for j in range(5))
        if not croniter.is_valid(alone):
            return f": its {name} field {parts[i]!r} is not {values}"
    return ""


def _croniter() -> Any:
    """croniter's class, imported on first use: its import runs ``file -b`` on the
    interpreter (``platform.architecture()``), a fork and exec that every process paid at
    start (each claimer too) whether or not the app declares a schedule."""
    from croniter import croniter

    return croniter


@dataclass(frozen=True)
class Periodic:
    """One schedule: enqueue a job of ``task`` at every slot of the cron expression.

    ``cron``: five fields (minute hour day month weekday), as croniter reads them.
    ``timezone``: an IANA name (e.g. 'Europe/Paris'); slots are wall-clock times there.
    ``missed``: 'latest' (after downtime, run the latest missed slot once) or 'skip'
    (run it only if less than ``misfire_grace_seconds`` late). ``payload``, ``queue``,
    ``priority`` and ``max_attempts`` are those of every job it enqueues, checked here by
    enqueue's own checks (``serialize_payload`` with ``max_payload_bytes``, the app's
    ``PGWORKER_MAX_PAYLOAD_BYTES``; ``check_priority``; ``check_max_attempts``), so that a
    bad value fails the declaration instead of every slot.
    Raises :class:`ConfigError` naming the schedule and the fix for an invalid
    expression (one that matches no date included, such as '0 0 30 2 *': it would never
    fire), zone, policy, payload, queue, priority or max_attempts.
    """

    name: str
    task: str
    cron: str
    timezone: str = "UTC"
    missed: str = "latest"
    payload: Any = None
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 5
    misfire_grace_seconds: float = MISFIRE_GRACE_SECONDS
    max_payload_bytes: int = field(default=MAX_PAYLOAD_BYTES, compare=False, repr=False)
    # The job options (of queue, priority, max_attempts) not given at declaration, for a
    # task not registered then: they become the task's when it is (App.task).
    task_defaults: tuple[str, ...] = field(default=(), compare=False, repr=False)
    # The payload as enqueue would store it (compact JSON), made once at declaration.
    _payload_json: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_task_name(self.name)
        try:
            check_task_name(self.task)
            check_new_queue_name(self.queue)
            check_priority(self.priority)
            check_max_attempts(self.max_attempts)
            payload_json = serialize_payload(self.payload, self.max_payload_bytes)
        except (ConfigError, InvalidJob, PayloadError) as exc:
            # enqueue's message names the fix; this says which declaration to apply it to
            raise (type(exc) if isinstance(exc, ConfigError) else ConfigError)(
                f"schedule {self.name!r}: {exc}") from exc
        object.__setattr__(self, "_payload_json", payload_json)
        croniter = _croniter()
        from croniter import CroniterBadDateError

        if not isinstance(self.cron, str) or len(self.cron.split()) != 5 or not croniter.is_valid(self.cron):
            raise ConfigError(f"schedule {self.name!r}: {self.cron!r} is not a cron expression{_bad_field(self.cron)}; "
                              "use five fields, minute hour day-of-month month day-of-week, e.g. '*/5 * * * *'")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ConfigError(f"schedule {self.name!r}: unknown time zone {self.timezone!r}; use an IANA "
                              "name such as 'UTC' or 'Europe/Paris'") from None
        try:  # an expression croniter parses may still name no date at all ('0 0 30 2 *')
            now = datetime.now(timezone.utc)
            self.next_after(now)
            self.latest_at_or_before(now)
        except CroniterBadDateError:
            raise ConfigError(f"schedule {self.name!r}: {self.cron!r} matches no date (a day of the month its "
                              "months never have, such as 30 or 31 February or 31 April), so it would never "
                              "fire; fix its day-of-month or month field, e.g. 'L' for the last day of the month "
                              "('0 0 L 2 *')") from None
        if self.missed not in MISSED_POLICIES:
            raise ConfigError(f"schedule {self.name!r}: missed must be 'latest' (run the latest missed "
                              f"slot once) or 'skip', got {self.missed!r}")
        if not self.misfire_grace_seconds > 0:
            raise ConfigError(f"schedule {self.name!r}: misfire_grace must be > 0 seconds")

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def payload_json(self) -> str:
        """The payload as compact JSON text (checked at declaration)."""
        return self._payload_json

    def next_after(self, t: datetime) -> datetime:
        """The first slot strictly after ``t`` (aware, in UTC)."""
        return _croniter()(self.cron, t.astimezone(self.zone)).get_next(datetime).astimezone(timezone.utc)

    def latest_at_or_before(self, t: datetime) -> datetime:
        """The last slot at or before ``t`` (aware, in UTC).

        croniter's backward search can return the slot before the right one inside a
        repeated DST hour (at 02:30 CET on the fall-back night it returns 02:00 CEST, an
        hour too early), so its answer is only a starting point, refined forward with
        get_next, which walks the repeated hour correctly.
        """
        start = t.astimezone(self.zone) + timedelta(microseconds=1)
        croniter = _croniter()
        latest = croniter(self.cron, start).get_prev(datetime).astimezone(timezone.utc)
        it = croniter(self.cron, latest.astimezone(self.zone))
        while (nxt := it.get_next(datetime).astimezone(timezone.utc)) <= t:
            latest = nxt
        return latest

    def count_between(self, after: datetime, until: datetime) -> int:
        """Slots in (after, until], counted up to MAX_SLOTS_COUNTED."""
        it = _croniter()(self.cron, after.astimezone(self.zone))
        n = 0
        while n < MAX_SLOTS_COUNTED and it.get_next(datetime) <= until:
            n += 1
        return n


@dataclass(frozen=True)
class SlotDecision:
    """What a scheduler does about one schedule now: advance to ``slot`` (None: nothing
    is due), enqueue its job or not, how many due slots go unenqueued, the next slot."""

    slot: datetime | None
    enqueue: bool
    missed: int
    next_slot: datetime


def decide(p: Periodic, last_slot: datetime | None, now: datetime) -> SlotDecision:
    """Apply the missed-slot policy to the slots due since ``last_slot`` (database time)."""
    latest = p.latest_at_or_before(now)
    nxt = p.next_after(now)
    if last_slot is not None and latest <= last_slot:
        return SlotDecision(None, False, 0, nxt)
    if last_slot is None:  # no bookkeeping yet: nothing from before is owed
        return SlotDecision(latest, False, 0, nxt)
    due = p.count_between(last_slot, latest)
    late = (now - latest).total_seconds()
    if p.missed == "skip" and late > p.misfire_grace_seconds:
        return SlotDecision(latest, False, due, nxt)
    return SlotDecision(latest, True, max(0, due - 1), nxt)


class UnusableScheduleRow(Exception):
    """A schedule's row holds a value the scheduler cannot work from (set by hand)."""


class Scheduler:
    """Fires the due slots of ``periodics``; one per pod (any number may run).

    ``fired`` and ``skipped`` count the slots this scheduler enqueued and skipped
    (``fired_by_queue``: the enqueued ones by queue, for ``pgworker_enqueued_jobs_total``);
    ``errors`` counts, by schedule name, the ticks in which that schedule failed (their
    sum is ``pgworker_schedule_errors_total``).
    """

    def __init__(self, store: "Store", periodics: Sequence[Periodic], tasks: "Mapping[str, Task] | None" = None) -> None:
        self.store = store
        self.periodics = {p.name: p for p in periodics}
        # the app's tasks: a schedule's payload is checked as enqueue checks it, once the
        # app has been imported whole (a break-it trial: a payload its task's handler
        # refuses made one dead job a slot, though enqueue refuses it up front)
        self.tasks = tasks or {}
        self.fired = 0
        self.fired_by_queue: Counter[str] = Counter()
        self.skipped = 0
        self.errors: Counter[str] = Counter()
        # Schedules failing now, with the failures of the current streak: the first
        # failure of a streak is logged, the others only counted.
        self._failing: dict[str, int] = {}
        # The schedules the last register() could not record, with the error: tick() skips
        # them, as failures of theirs, until a registration succeeds.
        self.unregistered: dict[str, Exception] = {}

    def register(self, conn: "psycopg.Connection") -> None:
        """Record the declared schedules (new ones start at their latest past slot).

        Each on its own: one whose slots cannot be computed or whose row cannot be written
        is kept in ``unregistered`` (with its error) and skipped, so that the others are
        recorded; :meth:`tick` then counts and logs it as that schedule's failure. Errors of
        the connection itself (lost, closed) propagate."""
        now = self.store.db_now(conn)
        self.unregistered = {}
        for p in self.periodics.values():
            try:
                task = self.tasks.get(p.task)
                check = task.payload_check if task is not None else None
                if check is not None:
                    check(p._payload_json)  # PayloadError: kept unregistered, said at each streak
                initial, nxt = p.latest_at_or_before(now), p.next_after(now)
                with self._own_statement(conn):
                    self.store.register_schedule(
                        conn, name=p.name, task=p.task, queue=p.queue, cron=p.cron, timezone=p.timezone,
                        missed=p.missed, initial_slot=initial, next_slot=nxt)
            except Exception as exc:  # noqa: BLE001 - one schedule must not stop the others
                if conn.closed or conn.broken:
                    raise
                self.unregistered[p.name] = exc

    def tick(self, conn: "psycopg.Connection") -> float:
        """Fire what is due; returns seconds until the next slot of any schedule (at most
        RESYNC_SECONDS).

        Each schedule fires on its own: one that fails (its registration, the computation
        of its slots, a statement error for it, or a row a manual change made unusable) is
        logged once per failure streak with its name and the fix, counted in ``errors``,
        and tried again at the next tick, while the others still fire. Errors of the
        connection itself (lost, closed) propagate: the caller reconnects.
        """
        state, now, unusable = self.store.schedules_state(conn, list(self.periodics))
        missing = [name for name in self.periodics if name not in state and name not in unusable]
        if missing:  # a row was deleted by hand, or its registration failed: record it again
            self.register(conn)
            state, now, unusable = self.store.schedules_state(conn, list(self.periodics))
        wait = RESYNC_SECONDS
        for p in self.periodics.values():
            if p.name in self.unregistered:
                self._failed(p, self.unregistered[p.name], recording=True)
                continue
            try:
                if p.name in unusable:
                    raise UnusableScheduleRow(unusable[p.name])
                d = decide(p, state.get(p.name), now)
                if d.slot is not None:
                    with self._own_statement(conn):
                        advanced, job_id = self.store.fire_schedule(
                            conn, name=p.name, slot=d.slot, next_slot=d.next_slot, skipped=d.missed,
                            enqueue=d.enqueue, task=p.task, queue=p.queue, payload_json=p.payload_json,
                            priority=p.priority, max_attempts=p.max_attempts)
                    if advanced:
                        self._report(p, d, job_id)
            except Exception as exc:  # noqa: BLE001 - one schedule must not stop the others
                if conn.closed or conn.broken:
                    raise
                self._failed(p, exc)
                continue
            self._succeeded(p)
            wait = min(wait, (d.next_slot - now).total_seconds())
        return max(0.0, wait) + WAKE_SLACK_SECONDS

    @staticmethod
    def _own_statement(conn: "psycopg.Connection") -> contextlib.AbstractContextManager[Any]:
        """On an autocommit connection (the scheduler's own) a failed statement fails
        alone; inside a transaction, a savepoint keeps it from aborting the transaction
        and with it the next schedules' statements."""
        return contextlib.nullcontext() if conn.autocommit else conn.transaction()

    def _failed(self, p: Periodic, exc: Exception, *, recording: bool = False) -> None:
        """Count a failure of ``p``; log the first of a streak with the fix. ``recording``:
        it failed to be recorded (register), not to fire."""
        self.errors[p.name] += 1
        streak = self._failing.get(p.name, 0) + 1
        self._failing[p.name] = streak
        if streak > 1:
            log.debug("schedule %r failed again (%s failures in a row): %s", p.name, streak, type(exc).__name__)
            return
        # The statements of the fix, quoted, ready to paste into psql.
        table, name = sql.Identifier(self.store.schema), sql.Literal(p.name)
        row = sql.SQL("{}.schedules WHERE name = {}").format(table, name).as_string(None)
        if isinstance(exc, UnusableScheduleRow):
            what = f"its row's last_slot is {exc}, which no slot can follow (a manual change?)"
            reset = sql.SQL("UPDATE {}.schedules SET last_slot = NULL WHERE name = {}").format(table, name)
            fix = f"run `{reset.as_string(None)}`: the schedule then starts afresh at its next slot"
        else:
            what = f"{type(exc).__name__}: {bounded_text(' '.join(str(exc).split()), 500)}"
            if isinstance(exc, PayloadError):
                fix = (f"give the schedule a payload its task {p.task!r} takes (payload= of app.periodic, or none "
                       "for @app.task(schedule=...)), or change the handler's payload annotation")
            elif not isinstance(exc, psycopg.Error):  # from the declaration, not the database
                fix = (f"correct its declaration in the app's code (cron {p.cron!r} in {p.timezone!r}): "
                       "its slots could not be computed")
            elif getattr(exc, "sqlstate", None) == "42501":
                fix = "grant this role what `pgworker sql grants --worker ROLE` lists"
            elif recording:
                fix = (f"the database refused to record it in {table.as_string(None)}.schedules (a trigger, "
                       "constraint or rule added there?): lift what refuses it, or remove the schedule "
                       "from the app's code")
            else:
                fix = (f"if a manual change to its row caused it (`SELECT * FROM {row}`), run "
                       f"`DELETE FROM {row}`: the scheduler records it again from the code and "
                       "starts at its next slot")
        log.error("schedule %r could not %s: %s; the other schedules go on and this one is tried "
                  "again at every tick; fix: %s", p.name, "be recorded" if recording else "fire", what, fix,
                  extra={"action": "schedule_error", "queue": p.queue, "task": p.task})

    def _succeeded(self, p: Periodic) -> None:
        streak = self._failing.pop(p.name, 0)
        if streak:
            log.info("schedule %r fires again after %s failed tick(s)", p.name, streak,
                     extra={"action": "schedule_recovered", "queue": p.queue, "task": p.task})

    def _report(self, p: Periodic, d: SlotDecision, job_id: int | None) -> None:
        extra = {"action": "schedule", "queue": p.queue}
        if d.enqueue:
            self.fired += 1
            self.fired_by_queue[p.queue] += 1
            log.info("schedule %r: enqueued job %s for the %s slot", p.name, job_id, d.slot.isoformat(),
                     extra={**extra, "job_id": job_id})
        else:
            self.skipped += 1
        if d.missed:
            more = "+" if d.missed >= MAX_SLOTS_COUNTED else ""
            log.warning("schedule %r: %s%s slot(s) fell due while no supervisor ran and were not enqueued "
                        "(missed=%r): %s", p.name, d.missed, more, p.missed,
                        "the latest ran once" if d.enqueue else f"skipped up to {d.slot.isoformat()}",
                        extra=extra)


def describe(declared: dict[str, Periodic], rows: list[dict[str, Any]], now: datetime, *,
             app_known: bool) -> list[dict[str, Any]]:
    """Rows for `pgworker schedules`: the recorded schedules merged with the declared ones,
    with the next run computed from the expression (in the schedule's zone). A last slot no
    datetime holds ('infinity') is shown as the database's text for it. ``app_known``:
    whether ``declared`` comes from the user's App (then a recorded schedule it lacks is
    "no", not declared any more), or from a bare one (then "unknown")."""
    out = []
    seen = set()
    for r in rows:
        p = declared.get(r["name"])
        seen.add(r["name"])
        expr, tz = (p.cron, p.timezone) if p else (r["cron"], r["timezone"])
        try:
            nxt = Periodic(r["name"], r["task"], expr, tz).next_after(now)
        except ConfigError:
            nxt = None
        out.append({"name": r["name"], "task": r["task"], "queue": r["queue"], "cron": expr, "timezone": tz,
                    "missed": r["missed"], "next_run": nxt,
                    "last_slot": r["last_slot"] if r["last_slot"] is not None else r["unusable_last_slot"],
                    "last_job_id": r["last_job_id"], "last_job_state": r["last_job_state"],
                    "skipped_slots": r["skipped_slots"],
                    "declared": "yes" if p else ("no" if app_known else "unknown")})
    for name, p in declared.items():
        if name not in seen:
            out.append({"name": name, "task": p.task, "queue": p.queue, "cron": p.cron, "timezone": p.timezone,
                        "missed": p.missed, "next_run": p.next_after(now), "last_slot": None,
                        "last_job_id": None, "last_job_state": None, "skipped_slots": 0,
                        "declared": "not yet registered"})
    return out
