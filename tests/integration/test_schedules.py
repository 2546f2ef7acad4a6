"""Periodic jobs: slot arithmetic in a time zone, the missed-slot policies, and each slot
enqueued once however many schedulers fire at the same moment."""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from pgworker import App, ConfigError, Settings
from pgworker.schedules import Periodic, Scheduler, decide
from pg import wait_until
from worker import q

UTC = timezone.utc


@pytest.mark.unit
def test_slots_are_wall_clock_times_in_the_schedule_zone():
    p = Periodic("daily", "t", "0 9 * * *", timezone="Europe/Paris")
    assert p.next_after(datetime(2026, 7, 1, tzinfo=UTC)) == datetime(2026, 7, 1, 7, tzinfo=UTC)  # CEST
    assert p.next_after(datetime(2026, 1, 10, tzinfo=UTC)) == datetime(2026, 1, 10, 8, tzinfo=UTC)  # CET
    hourly = Periodic("h", "t", "0 * * * *", timezone="Europe/Paris")
    # the fall-back night repeats 02:00 local: both real hours get their slot
    start = datetime(2026, 10, 24, 23, 30, tzinfo=UTC)
    slots, t = [], start
    for _ in range(3):
        t = hourly.next_after(t)
        slots.append(t)
    assert slots == [datetime(2026, 10, 25, h, tzinfo=UTC) for h in (0, 1, 2)]
    assert hourly.latest_at_or_before(datetime(2026, 10, 25, 1, 0, tzinfo=UTC)) == datetime(2026, 10, 25, 1, tzinfo=UTC)
    # so the second 02:00 is fired, not lost (croniter's backward search alone would lose it)
    d = decide(hourly, datetime(2026, 10, 25, 0, tzinfo=UTC), datetime(2026, 10, 25, 1, 0, 30, tzinfo=UTC))
    assert (d.slot, d.enqueue) == (datetime(2026, 10, 25, 1, tzinfo=UTC), True)
    # the spring-forward gap: a 02:30 slot that does not exist fires at 03:00 local
    gap = Periodic("g", "t", "30 2 * * *", timezone="Europe/Paris")
    assert gap.next_after(datetime(2026, 3, 28, 23, tzinfo=UTC)) == datetime(2026, 3, 29, 1, tzinfo=UTC)


@pytest.mark.unit
def test_missed_slot_policies():
    now = datetime(2026, 7, 1, 12, 3, tzinfo=UTC)
    last = datetime(2026, 7, 1, 10, 0, tzinfo=UTC)  # two hours of downtime
    latest = Periodic("a", "t", "*/5 * * * *", missed="latest")
    d = decide(latest, last, now)
    assert (d.slot, d.enqueue, d.missed) == (datetime(2026, 7, 1, 12, 0, tzinfo=UTC), True, 23)
    skip = Periodic("b", "t", "*/5 * * * *", missed="skip", misfire_grace_seconds=60)
    d = decide(skip, last, now)
    assert (d.slot, d.enqueue, d.missed) == (datetime(2026, 7, 1, 12, 0, tzinfo=UTC), False, 24)
    on_time = decide(skip, datetime(2026, 7, 1, 11, 55, tzinfo=UTC), datetime(2026, 7, 1, 12, 0, 20, tzinfo=UTC))
    assert (on_time.enqueue, on_time.missed) == (True, 0)  # 20 s late, within the grace
    assert decide(latest, datetime(2026, 7, 1, 12, 0, tzinfo=UTC), now).slot is None  # nothing new
    assert d.next_slot == datetime(2026, 7, 1, 12, 5, tzinfo=UTC)


@pytest.mark.unit
@pytest.mark.parametrize("kwargs, match", [
    ({"cron": "every minute"}, "not a cron expression"),
    ({"cron": "* * * *"}, "five"),
    ({"timezone": "Mars/Olympus"}, "unknown time zone"),
    ({"missed": "all"}, "latest"),
    # croniter parses these, but no date has them: the scheduler could never fire them
    ({"cron": "0 0 30 2 *"}, r"'0 0 30 2 \*' matches no date .* fix its day-of-month or month field, e\.g\. 'L'"),
    ({"cron": "15 8 31 4,6,9,11 *"}, "matches no date"),
])
def test_bad_schedules_are_refused_with_the_fix(kwargs, match):
    base = {"name": "s", "task": "t", "cron": "* * * * *"}
    with pytest.raises(ConfigError, match=match):
        Periodic(**{**base, **kwargs})


@pytest.mark.unit
def test_a_schedule_with_no_possible_slot_is_refused_at_declaration():
    """'0 0 30 2 *' once declared fine and then failed in every scheduler pass, which
    stopped every schedule of the app. Rare but real dates stay accepted."""
    app = App("postgresql://x@localhost/db")
    with pytest.raises(ConfigError, match=r"schedule 'feb30': '0 0 30 2 \*' matches no date"):
        app.task(name="feb30", schedule="0 0 30 2 *")(lambda payload: None)
    with pytest.raises(ConfigError, match=r"schedule 'apr31': '0 0 31 4 \*' matches no date"):
        app.periodic("report", "0 0 31 4 *", name="apr31")
    assert not app.tasks and not app.schedules  # nothing half-declared
    leap = app.periodic("report", "0 0 29 2 *", name="leap-day")  # every four years or so
    assert leap.next_after(datetime(2026, 3, 1, tzinfo=UTC)) == datetime(2028, 2, 29, tzinfo=UTC)
    # day-of-month or day-of-week, as cron reads them together: the Mondays of February
    mondays = app.periodic("report", "0 0 30 2 1", name="february-mondays")
    assert mondays.next_after(datetime(2026, 3, 1, tzinfo=UTC)) == datetime(2027, 2, 1, tzinfo=UTC)
    assert app.periodic("report", "0 0 L 2 *", name="feb-last").next_after(
        datetime(2026, 3, 1, tzinfo=UTC)) == datetime(2027, 2, 28, tzinfo=UTC)


@pytest.mark.unit
def test_declaring_schedules_on_an_app():
    app = App("postgresql://x@localhost/db")

    @app.task(name="report", queue="reports", priority=3, schedule="0 6 * * 1", schedule_tz="Asia/Tokyo")
    def report(payload):
        return None

    app.periodic("report", "30 * * * *", name="report-hourly", payload={"scope": "hour"}, missed="skip")
    assert app.schedules["report"].queue == "reports" and app.schedules["report"].priority == 3
    assert app.schedules["report-hourly"].payload == {"scope": "hour"}
    with pytest.raises(ConfigError, match="twice"):
        app.periodic("report", "* * * * *")


@pytest.mark.unit
@pytest.mark.parametrize("options, match", [
    ({"payload": {"ratio": float("nan")}}, "NaN"),
    ({"payload": [float("inf")]}, "NaN and infinities"),
    ({"payload": {"tags": {"a", "b"}}}, "not JSON-serialisable"),
    ({"payload": "nul\x00char"}, "NUL"),
    ({"payload": "x" * 200}, "over the limit of 100.*PGWORKER_MAX_PAYLOAD_BYTES"),
    ({"priority": 40_000}, "priority must be an integer between -32768 and 32767"),
    ({"priority": True}, "priority must be an integer"),
    ({"priority": 1.5}, "priority must be an integer"),
    ({"max_attempts": 0}, "max_attempts must be an integer >= 1"),
    ({"max_attempts": -3}, "max_attempts must be an integer >= 1"),
    ({"max_attempts": 2_000_000}, "max_attempts must be <= 1000000"),
    ({"queue": ""}, "queue name is empty"),
])
def test_periodic_jobs_are_checked_like_enqueue_when_declared(options, match):
    """What enqueue refuses, a schedule refuses when it is declared (reusing enqueue's
    checks), instead of failing in the scheduler at every slot."""
    app = App(settings=Settings(dsn="postgresql://x@localhost/db", max_payload_bytes=100))
    with pytest.raises(ConfigError, match=f"schedule 'nightly': .*{match}"):
        app.periodic("report", "0 3 * * *", name="nightly", **options)
    assert "nightly" not in app.schedules  # nothing half-declared


@pytest.mark.unit
def test_periodic_checks_apply_to_a_schedule_built_directly_and_to_task_schedules():
    with pytest.raises(ConfigError, match="schedule 'p': payload is not valid JSON"):
        Periodic("p", "t", "* * * * *", payload=float("nan"))
    with pytest.raises(ConfigError, match="schedule 'p': priority"):
        Periodic("p", "t", "* * * * *", priority=-40_000)
    with pytest.raises(ConfigError, match="schedule 'p': payload is 12 bytes of JSON, over the limit of 10"):
        Periodic("p", "t", "* * * * *", payload="x" * 10, max_payload_bytes=10)
    p = Periodic("p", "t", "* * * * *", payload={"é": [1, 2.5, None]})
    assert p.payload_json == '{"é":[1,2.5,null]}'  # the text enqueue would store
    app = App("postgresql://x@localhost/db")
    with pytest.raises(ConfigError, match="not a cron expression"):
        app.task(name="bad", schedule="every day")(lambda payload: None)
    assert "bad" not in app.tasks and not app.schedules
    # an expression of five fields names the one out of its range
    for cron, said in (("0 25 * * *", "its hour field '25' is not 0-23"),
                       ("61 * * * *", "its minute field '61' is not 0-59"),
                       ("* * 0 * *", "its day of month field '0' is not 1-31"),
                       ("* * * 13 *", "its month field '13' is not 1-12"),
                       ("* * * * 9", "its day of week field '9' is not 0-7")):
        with pytest.raises(ConfigError, match="not a cron expression") as info:
            Periodic("p", "t", cron)
        assert said in str(info.value), str(info.value)


def rewind(conn, schema, name, minutes):
    """Pretend no dispatcher ran for a while: move the schedule's last slot back."""
    q(conn, schema, "UPDATE {s}.schedules SET last_slot = last_slot - make_interval(mins => %s) "
                    "WHERE name = %s RETURNING name", minutes, name)


@pytest.mark.integration
def test_registration_owes_nothing_from_before(app, conn):
    p = app.periodic("t", "* * * * *", name="every-minute")
    s = Scheduler(app.store, [p])
    s.register(conn)
    s.tick(conn)
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.jobs") == [(0,)]
    [row] = app.list_schedules()
    assert row["name"] == "every-minute" and row["declared"] == "yes"
    assert row["next_run"] > row["last_slot"]
    # the app's last schedule removed from its code: listed as not declared any more (it
    # read "unknown", as for a bare App that knows no code), while a bare App cannot tell
    app.schedules.clear()
    app.task(name="still_here")(lambda payload: None)
    assert [r["declared"] for r in app.list_schedules()] == ["no"]
    bare = App(settings=app.settings)
    try:
        assert [r["declared"] for r in bare.list_schedules()] == ["unknown"]
    finally:
        bare.close()


@pytest.mark.integration
def test_each_slot_is_enqueued_once_by_racing_schedulers(app, pg_dsn, conn):
    schema = app.settings.schema
    p = app.periodic("t", "* * * * *", name="race", payload={"n": 1}, queue="cron")
    Scheduler(app.store, [p]).register(conn)
    rewind(conn, schema, "race", 3)  # three slots are owed
    barrier = threading.Barrier(8)
    fired = []

    def dispatcher():
        s = Scheduler(app.store, [p])
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            barrier.wait()
            s.tick(c)
        fired.append(s.fired)

    threads = [threading.Thread(target=dispatcher) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sum(fired) == 1
    rows = q(conn, schema, "SELECT queue, payload, schedule_name, schedule_slot, run_at = schedule_slot "
                           "FROM {s}.jobs")
    assert len(rows) == 1 and rows[0][:3] == ("cron", {"n": 1}, "race") and rows[0][4]
    # policy 'latest': the latest slot ran once, the two before it were not enqueued
    assert q(conn, schema, "SELECT skipped_slots, last_slot = %s FROM {s}.schedules", rows[0][3]) == [(2, True)]
    # the slot's unique key refuses a second job even if the bookkeeping were reset
    q(conn, schema, "UPDATE {s}.schedules SET last_slot = last_slot - interval '1 minute' RETURNING name")
    Scheduler(app.store, [p]).tick(conn)
    # that slot's job only: a run crossing a minute boundary rightly enqueues the new slot's
    # (it failed so once at 01:05:00, counting every job)
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE schedule_slot = %s", rows[0][3]) == [(1,)]


@pytest.mark.integration
def test_the_jobs_a_schedule_enqueues_count_in_the_enqueue_metric(app, conn):
    """pgworker_enqueued_jobs_total ("jobs enqueued by this process") stayed 0 in a worker
    whose scheduler enqueued a job every minute."""
    from pgworker.worker.scheduler import tick

    class Recorded:
        """The two calls the scheduler service makes on the worker's Metrics."""

        def __init__(self):
            self.calls, self.errors = [], 0

        def enqueued(self, queue, n):
            self.calls.append((queue, n))

        def schedule_errors(self, n):
            self.errors += n

    metrics = Recorded()
    p = app.periodic("t", "* * * * *", name="counted", queue="cron")
    s = Scheduler(app.store, [p])
    s.register(conn)
    tick(s, conn, metrics)
    assert metrics.calls == []  # nothing owed yet
    rewind(conn, app.settings.schema, "counted", 2)
    tick(s, conn, metrics)
    assert metrics.calls == [("cron", 1)] and metrics.errors == 0  # the latest of the owed slots
    tick(s, conn, metrics)
    assert metrics.calls == [("cron", 1)]


@pytest.mark.integration
def test_skip_policy_drops_a_late_slot(app, conn):
    schema = app.settings.schema
    p = app.periodic("t", "* * * * *", name="skipper", missed="skip", misfire_grace=0.05)
    s = Scheduler(app.store, [p])
    s.register(conn)
    rewind(conn, schema, "skipper", 5)
    # the latest slot must be later than the grace (just after a minute boundary, wait a moment)
    wait_until(lambda: (lambda now: (now - p.latest_at_or_before(now)).total_seconds() > 0.2)(app.store.db_now(conn)),
               5, message="the latest slot to be more than the grace late")
    s.tick(conn)
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs") == [(0,)]
    assert q(conn, schema, "SELECT skipped_slots FROM {s}.schedules") == [(5,)]


@pytest.mark.integration
def test_a_changed_expression_starts_afresh(app, conn):
    schema = app.settings.schema
    p = Periodic("c", "t", "* * * * *")
    Scheduler(app.store, [p]).register(conn)
    rewind(conn, schema, "c", 60)
    Scheduler(app.store, [Periodic("c", "t", "*/2 * * * *")]).register(conn)
    [(last, now)] = q(conn, schema, "SELECT last_slot, now() FROM {s}.schedules")
    assert now - last < timedelta(minutes=2)  # not an hour of owed slots


# A row a manual UPDATE broke, two ways: a last_slot no slot can follow that Python cannot
# even read ('infinity'), and a counter pushed to the top of bigint, so that firing the
# schedule fails with a statement error (bigint out of range) for that schedule only.
BREAKAGES = {
    "unreadable last_slot": ("UPDATE {s}.schedules SET last_slot = 'infinity' WHERE name = 'a-broken' RETURNING name",
                             r"(UPDATE \S+\.schedules SET last_slot = NULL WHERE name = 'a-broken')"),
    "statement error": ("UPDATE {s}.schedules SET skipped_slots = 9223372036854775807 WHERE name = 'a-broken' "
                        "RETURNING name", r"(DELETE FROM \S+\.schedules WHERE name = 'a-broken')"),
}


@pytest.mark.integration
@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_failing_schedule_is_logged_once_counted_and_the_others_still_fire(app, conn, caplog, breakage):
    schema = app.settings.schema
    # declared first: before the fix its error ended the tick before the others fired
    broken = app.periodic("t", "* * * * *", name="a-broken")
    fine = app.periodic("t", "* * * * *", name="b-fine", payload={"n": 1})
    s = Scheduler(app.store, [broken, fine])
    s.register(conn)
    rewind(conn, schema, "a-broken", 3)
    rewind(conn, schema, "b-fine", 3)
    damage, fix_pattern = BREAKAGES[breakage]
    q(conn, schema, damage)
    with caplog.at_level(logging.DEBUG, logger="pgworker.schedules"):
        s.tick(conn)
        s.tick(conn)  # still broken: counted again, not logged again
    assert q(conn, schema, "SELECT schedule_name FROM {s}.jobs") == [("b-fine",)]
    assert s.fired == 1 and s.errors == {"a-broken": 2}
    # the listing an operator reads next (`pgworker schedules`) still works, the broken slot as text
    listed = {row["name"]: row for row in app.list_schedules()}
    assert set(listed) == {"a-broken", "b-fine"} and listed["b-fine"]["last_slot"] is not None
    if breakage == "unreadable last_slot":
        assert listed["a-broken"]["last_slot"] == "infinity"
    [logged] = [r for r in caplog.records if r.levelno >= logging.WARNING and "a-broken" in r.getMessage()]
    assert logged.levelno == logging.ERROR and "schedule 'a-broken' could not fire" in logged.getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and "b-fine" in r.getMessage()]
    # the fix the log names, run as it is, lets the schedule fire again (afresh: from its next slot)
    fix = re.search(fix_pattern, logged.getMessage())
    assert fix, logged.getMessage()
    conn.execute(fix.group(1))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pgworker.schedules"):
        s.tick(conn)
    assert s.errors == {"a-broken": 2}
    assert any("schedule 'a-broken'" in r.getMessage() and "again" in r.getMessage() for r in caplog.records)
    [(last_slot, now)] = q(conn, schema, "SELECT last_slot, now() FROM {s}.schedules WHERE name = 'a-broken'")
    assert last_slot is not None and timedelta(0) <= now - last_slot < timedelta(minutes=2)
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE schedule_name = 'a-broken'") == [(0,)]
    # a new failure streak is logged again
    rewind(conn, schema, "a-broken", 3)
    q(conn, schema, damage)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="pgworker.schedules"):
        s.tick(conn)
    assert s.errors == {"a-broken": 3}
    assert len([r for r in caplog.records if r.levelno == logging.ERROR and "a-broken" in r.getMessage()]) == 1


@pytest.mark.integration
def test_a_schedule_that_cannot_be_recorded_does_not_stop_the_others(app, conn, caplog):
    """Registration is per schedule: one whose slots cannot be computed (here a Periodic
    broken after its declaration, standing for any error at run time) is logged once per
    streak and counted at each tick, the others are recorded and fire; once it is right
    again it is recorded at the next tick. Before, its error ended register() for all."""
    schema = app.settings.schema
    broken = app.periodic("t", "* * * * *", name="a-broken")
    fine = app.periodic("t", "* * * * *", name="b-fine")
    object.__setattr__(broken, "cron", "0 0 30 2 *")
    s = Scheduler(app.store, [broken, fine])
    with caplog.at_level(logging.DEBUG, logger="pgworker.schedules"):
        s.register(conn)
        rewind(conn, schema, "b-fine", 3)
        s.tick(conn)
        s.tick(conn)
    assert q(conn, schema, "SELECT name FROM {s}.schedules") == [("b-fine",)]
    assert q(conn, schema, "SELECT schedule_name FROM {s}.jobs") == [("b-fine",)]
    assert s.fired == 1 and s.errors == {"a-broken": 2}
    [logged] = [r for r in caplog.records if r.levelno >= logging.WARNING and "a-broken" in r.getMessage()]
    assert logged.levelno == logging.ERROR
    assert logged.getMessage().startswith("schedule 'a-broken' could not be recorded: CroniterBadDateError")
    assert "correct its declaration in the app's code (cron '0 0 30 2 *' in 'UTC')" in logged.getMessage()
    object.__setattr__(broken, "cron", "* * * * *")  # the code fixed (a new release)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pgworker.schedules"):
        s.tick(conn)
    assert q(conn, schema, "SELECT name FROM {s}.schedules ORDER BY name") == [("a-broken",), ("b-fine",)]
    assert s.errors == {"a-broken": 2}
    assert any(r.getMessage() == "schedule 'a-broken' fires again after 2 failed tick(s)" for r in caplog.records)


@pytest.mark.integration
def test_a_schedule_failing_inside_a_callers_transaction_leaves_it_usable(app, pg_dsn, conn):
    """On a connection in a transaction, the failed statement is rolled back to a savepoint:
    the transaction is not aborted and the next schedule fires in it."""
    schema = app.settings.schema
    broken = app.periodic("t", "* * * * *", name="a-broken")
    fine = app.periodic("t", "* * * * *", name="b-fine")
    s = Scheduler(app.store, [broken, fine])
    s.register(conn)
    rewind(conn, schema, "a-broken", 3)
    rewind(conn, schema, "b-fine", 3)
    q(conn, schema, BREAKAGES["statement error"][0])
    with psycopg.connect(pg_dsn) as tx:  # not autocommit: the tick runs inside a transaction
        s.tick(tx)
        tx.commit()
    assert q(conn, schema, "SELECT schedule_name FROM {s}.jobs") == [("b-fine",)]
    assert s.errors == {"a-broken": 1}


@dataclasses.dataclass
class Report:  # module level: the handler's string annotation (PEP 563) resolves to it
    day: str


@pytest.mark.integration
def test_a_schedule_whose_payload_its_task_refuses_never_fires_and_says_why(app, conn, caplog):
    """A break-it trial: `app.periodic("report", ..., payload={"date": ...})` for a handler
    taking a Report(day) was accepted, and every slot enqueued a job that went dead
    PAYLOAD_INVALID, though enqueue refuses that payload up front. The scheduler checks
    each schedule's payload against its task's (the app imported whole by then): a refused
    one is not recorded, logged once with the fix and counted; the others fire. (A schedule
    declared for a registered task is refused at declaration now: below. This is the
    scheduler's check, for what reaches it anyway: a handler whose annotation resolved
    only once the app was imported whole.)"""
    @app.task(name="report")
    def report(r: Report) -> None: ...

    bad = Periodic(name="bad-report", task="report", cron="* * * * *", payload={"date": "2026-12-05"})
    good = app.periodic("report", "* * * * *", name="good-report", payload={"day": "2026-12-05"})
    s = Scheduler(app.store, [bad, good], app.tasks)
    s.register(conn)
    assert set(s.unregistered) == {"bad-report"}
    rewind(conn, app.settings.schema, "good-report", 2)
    with caplog.at_level(logging.ERROR, logger="pgworker.schedules"):
        s.tick(conn)
        s.tick(conn)
    assert q(conn, app.settings.schema, "SELECT payload FROM {s}.jobs") == [({"day": "2026-12-05"},)]
    said = [r.getMessage() for r in caplog.records if "bad-report" in r.getMessage()]
    assert len(said) == 1 and "PayloadError: task 'report': payload: unexpected field 'date' for Report" in said[0]
    assert "give the schedule a payload its task 'report' takes" in said[0], said
    assert s.errors["bad-report"] == 2 and "good-report" not in s.errors


@pytest.mark.integration
def test_a_schedule_whose_payload_its_task_refuses_is_refused_when_declared(app):
    """A new user's trial: `@app.task(schedule=...)` on a handler taking a dict (the
    schedule enqueues no payload), and `app.periodic(..., payload={"scop": ...})` misspelt
    for a dataclass handler, were accepted; every slot then failed ("could not be
    recorded") while a drain run reported success. docs/scheduling.md promises enqueue's
    checks at declaration: ConfigError naming the schedule and the fix, when the task is
    registered first or after a schedule declared by its name; nothing is declared."""
    with pytest.raises(ConfigError, match=r"schedule 'needs_dict': task 'needs_dict': payload: expected an object "
                                          r".*@app.task\(schedule=\.\.\.\) enqueues no payload: declare the "
                                          r"schedule with app.periodic"):
        @app.task(name="needs_dict", schedule="* * * * *")
        def needs_dict(payload: dict, ctx) -> None: ...
    assert "needs_dict" not in app.schedules and "needs_dict" not in app.tasks

    @app.task(name="report")
    def report(r: Report) -> None: ...

    with pytest.raises(ConfigError, match=r"schedule 'misspelt': task 'report': payload: unexpected field 'scop' "
                                          r".*give the schedule a payload= the handler takes"):
        app.periodic("report", "*/15 * * * *", name="misspelt", payload={"scop": "15m"})
    assert "misspelt" not in app.schedules
    assert app.periodic("report", "*/15 * * * *", name="fine", payload={"day": "mon"}).name == "fine"

    # declared by name before its task: checked when the task is registered
    app.periodic("later", "0 * * * *", payload={"nope": 1})
    with pytest.raises(ConfigError, match=r"schedule 'later': task 'later': payload: unexpected field 'nope'"):
        @app.task(name="later")
        def later(r: Report) -> None: ...
    assert "later" not in app.tasks


@pytest.mark.integration
def test_a_handler_annotation_not_resolvable_yet_is_checked_by_the_scheduler_later(app):
    """With `from __future__ import annotations` a payload type may be defined below its
    handler: at declaration it cannot be read, and reading it then would fix the task's
    decoder to "no type" for good. The declaration is accepted; the task still decodes
    its type once it is defined."""
    @app.task(name="forward", schedule="* * * * *")
    def forward(r: DefinedBelow) -> None: ...  # noqa: F821 - defined below, on purpose

    assert "forward" in app.schedules
    globals()["DefinedBelow"] = dataclasses.make_dataclass("DefinedBelow", [("x", int)])
    try:
        assert app.tasks["forward"].typed_decoder is not None
    finally:
        del globals()["DefinedBelow"]


@pytest.mark.integration
def test_a_context_annotated_with_a_type_checkers_only_import_leaves_the_payload_checked(app):
    """The break-it trial: with `from __future__ import annotations` (as in this module)
    and `JobContext` imported under `if TYPE_CHECKING:`, `ctx: JobContext` cannot be
    evaluated at run time. The payload's own annotation was read by evaluating the whole
    signature, so it failed too: the schedule (no payload for a dict handler) was accepted,
    enqueue's check skipped, and every slot's job died of a TypeError. Only the payload's
    annotation is evaluated now."""
    from pgworker import PayloadError

    with pytest.raises(ConfigError, match=r"schedule 'ctx_typed': task 'ctx_typed': payload: expected an object"):
        @app.task(name="ctx_typed", schedule="* * * * *")
        def ctx_typed(payload: dict, ctx: OnlyForTypeCheckers) -> None: ...  # noqa: F821 - never defined, on purpose

    @app.task(name="ctx_typed_report")
    def ctx_typed_report(r: Report, ctx: OnlyForTypeCheckers) -> None: ...  # noqa: F821

    assert app.tasks["ctx_typed_report"].typed_decoder is not None
    with pytest.raises(PayloadError, match="unexpected field 'scop'"):
        app.enqueue("ctx_typed_report", {"scop": 1})


def test_a_schedule_declared_before_its_task_takes_the_tasks_job_options():
    """The break-it trial: `app.periodic('t', ...)` before `@app.task(name='t',
    queue='emails', max_attempts=9, priority=5)` kept queue 'default', 5 attempts and
    priority 0, so a worker of `--queues emails` never ran its jobs. Options the schedule
    names stay its own."""
    app = App(settings=Settings.from_env(environ={}))
    app.periodic("t", "* * * * *", payload={})
    app.periodic("t", "0 * * * *", name="t-own", payload={}, queue="reports", priority=-1)

    @app.task(name="t", queue="emails", max_attempts=9, priority=5)
    def t(payload: dict) -> None: ...

    first, own = app.schedules["t"], app.schedules["t-own"]
    assert (first.queue, first.priority, first.max_attempts) == ("emails", 5, 9)
    assert (own.queue, own.priority, own.max_attempts) == ("reports", -1, 9)
    app.periodic("t", "30 * * * *", name="t-after", payload={})  # declared after: the task's, as before
    assert app.schedules["t-after"].queue == "emails" and "emails" in app.queues()
