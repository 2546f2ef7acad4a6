"""A payload its worker is certain to refuse is refused at enqueue when the producer knows
the task (registered on the App enqueueing): a handler annotated ``dict``/``Mapping``
takes only a JSON object, a typed payload (dataclass, TypedDict, pydantic) is decoded by
the worker's own decode. Sync, async, enqueue_many (nothing of the batch, the index
named) and the CLI; nothing is written. A producer that does not know the task checks no
more than before, and a bad row that reaches the table anyway (raw SQL) still ends dead
with PAYLOAD_INVALID at the worker."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import sys
from typing import Any, Literal, Mapping, TypedDict

import pydantic
import pytest
from psycopg import sql

import pgworker
from pgworker import App, JobSpec, PayloadError, cli
from pgworker.testing import drain
from pg import make_settings

pytestmark = pytest.mark.integration


@dataclasses.dataclass
class Charge:  # module level: the handlers' string annotations (PEP 563) resolve to it
    amount_cents: int
    note: str = ""


class Ping(TypedDict):
    n: int


class Refund(pydantic.BaseModel):
    invoice: int


class Size(enum.Enum):
    SMALL = "s"
    LARGE = "l"


class Level(enum.IntEnum):
    LOW = 1


DICT_FIX = "nothing was enqueued: pass a dict (a JSON object)"
TYPED_FIX = "nothing was enqueued: give the payload the shape of Charge"


@pytest.fixture
def tasks(app):
    """The test's App with handlers of each kind; ``ran`` collects what they received."""
    ran: list[Any] = []

    @app.task(name="add")
    def add(payload: dict, ctx: pgworker.JobContext) -> None:
        ran.append(payload["a"] + payload["b"])

    @app.task(name="tally")
    def tally(payload: Mapping[str, int]) -> None:
        ran.append(sum(payload.values()))

    @app.task(name="maybe")
    def maybe(payload: dict | None) -> None:
        ran.append(payload)

    @app.task(name="anything")
    def anything(payload: Any) -> None:
        ran.append(payload)

    @app.task(name="bare")
    def bare(payload):
        ran.append(payload)

    @app.task(name="charge")
    def charge(c: Charge, ctx: pgworker.JobContext) -> None:
        ran.append(c)

    @app.task(name="ping")
    def ping(p: Ping) -> None:
        ran.append(p)

    @app.task(name="refund")
    def refund(r: Refund) -> None:
        ran.append(r)

    # plain JSON value types (a trial: `payload: int` took "3", and its handler failed every
    # attempt with a TypeError; `payload: None` took {'x': 1})
    @app.task(name="double")
    def double(n: int) -> None:
        ran.append(n * 2)

    @app.task(name="tick")
    def tick(payload: None) -> None:
        ran.append("tick")

    @app.task(name="label")
    def label(text: str | None) -> None:
        ran.append(text)

    @app.task(name="size")
    def size(s: Size) -> None:
        ran.append(s)

    @app.task(name="ratio")
    def ratio(x: float) -> None:
        ran.append(x)

    return ran


def count(conn, app) -> int:
    return conn.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(app.settings.schema))).fetchone()[0]


REFUSED = [
    ("add", "just a string", "task 'add': payload: expected an object (dict), got str 'just a string'", DICT_FIX),
    ("add", [1, 2], "task 'add': payload: expected an object (dict), got list [1, 2]", DICT_FIX),
    ("add", None, "task 'add': payload: expected an object (dict), got NoneType None", DICT_FIX),
    ("tally", 3, "task 'tally': payload: expected an object (Mapping), got int 3", DICT_FIX),
    ("charge", {"amount_cents": "12"}, "task 'charge': payload.amount_cents: expected int, got str '12'", TYPED_FIX),
    ("charge", {"amount_cents": 12, "cents": 1}, "task 'charge': payload: unexpected field 'cents' for Charge",
     TYPED_FIX),
    ("charge", "12", "task 'charge': payload: expected an object (Charge), got str '12'", TYPED_FIX),
    ("ping", {"n": "1"}, "task 'ping': payload.n: expected int, got str '1'", "the shape of Ping"),
    ("refund", {"invoice": "eight"}, "task 'refund': payload does not fit Refund", "the shape of Refund"),
    ("double", "3", "task 'double': payload: expected int, got str '3'", "the shape of int"),
    ("double", 3.0, "task 'double': payload: expected int, got float 3.0", "the shape of int"),
    ("double", True, "task 'double': payload: expected int, got bool True", "the shape of int"),
    ("tick", {"x": 1}, "task 'tick': payload: expected null, got dict {'x': 1}", "the shape of None,"),
    ("label", 5, "task 'label': payload: expected str or NoneType, got int 5", "the shape of str | None"),
    ("size", "medium", "task 'size': payload: expected one of 's', 'l', got str 'medium'", "the shape of Size"),
    ("ratio", "0.5", "task 'ratio': payload: expected float, got str '0.5'", "the shape of float"),
]


@pytest.mark.parametrize("task, payload, message, fix", REFUSED)
def test_enqueue_refuses_what_the_worker_would_and_writes_nothing(tasks, app, conn, task, payload, message, fix):
    with pytest.raises(PayloadError) as err:
        app.enqueue(task, payload)
    assert message in str(err.value) and fix in str(err.value), str(err.value)
    with pytest.raises(PayloadError, match="nothing was enqueued"):
        app.tasks[task].enqueue(payload)  # through the Task object too
    with pytest.raises(PayloadError) as err:
        asyncio.run(_aenqueue(app, task, payload))
    assert message in str(err.value) and fix in str(err.value), str(err.value)
    assert count(conn, app) == 0


async def _aenqueue(app: App, task: str, payload: Any) -> int:
    try:
        return await app.aenqueue(task, payload)
    finally:
        await app.aclose()


def test_the_message_is_the_one_the_worker_gives(tasks, app, conn):
    """The refusal at enqueue carries the worker's PAYLOAD_INVALID message, word for word."""
    with pytest.raises(PayloadError) as err:
        app.enqueue("charge", {"amount_cents": "12"})
    job = _raw_insert(conn, app, "charge", '{"amount_cents": "12"}')
    drain(app)
    row = app.get_job(job)
    assert (row["state"], row["last_error_code"], row["attempts"]) == ("dead", "PAYLOAD_INVALID", 1)
    worker_message = row["errors"][-1]["message"]
    assert worker_message == "task 'charge': payload.amount_cents: expected int, got str '12'"
    assert str(err.value).startswith(worker_message + "; nothing was enqueued: "), str(err.value)


def test_valid_payloads_still_enqueue_and_run(tasks, app, conn):
    ids = [app.enqueue("add", {"a": 1, "b": 2}), app.enqueue("tally", {"x": 2, "y": 3}),
           app.enqueue("maybe", None), app.enqueue("anything", "just a string"), app.enqueue("bare", [1, 2]),
           app.enqueue("charge", Charge(5)), app.enqueue("charge", {"amount_cents": 7, "note": "n"}),
           app.enqueue("ping", {"n": 1}), app.enqueue("refund", Refund(invoice=3))]
    ids += app.enqueue_many([("charge", {"amount_cents": i}) for i in range(3)])
    ids.append(asyncio.run(_aenqueue(app, "charge", Charge(9))))
    ids += [app.enqueue("double", 4), app.enqueue("tick"), app.enqueue("label", None), app.enqueue("label", "x"),
            app.enqueue("size", Size.LARGE), app.enqueue("size", "s"), app.enqueue("ratio", 2)]
    assert count(conn, app) == len(ids) == 20
    result = drain(app)
    assert result.succeeded == 20, result
    # the plain JSON value types are checked at enqueue only: their handlers get the stored
    # JSON as it is (an Enum's value, an int for a float), as before the check existed
    assert tasks == [3, 5, None, "just a string", [1, 2], Charge(5), Charge(7, "n"), {"n": 1}, Refund(invoice=3),
                     Charge(0), Charge(1), Charge(2), Charge(9), 8, "tick", None, "x", "l", "s", 2]


def test_enqueue_many_with_one_bad_spec_enqueues_none_and_names_its_index(tasks, app, conn):
    good = [JobSpec("charge", {"amount_cents": i}) for i in range(4)]
    batches = [
        (good[:2] + [JobSpec("charge", {"amount_cents": "2"})] + good[2:], 2, "payload.amount_cents: expected int"),
        ([("add", {"a": 1, "b": 1}), ("add", "x"), ("add", {"a": 2, "b": 2})], 1, "expected an object (dict)"),
        ([("bare", 1), ("charge", {"amount_cents": 1}), ("add", [1])], 2, "task 'add'"),  # tasks mixed
        # more than COPY's threshold, the bad one last: still nothing
        ([("add", {"a": i, "b": i}) for i in range(1500)] + [("add", 1)], 1500, "got int 1"),
        # a graph (ref/depends_on): its own statements, the same refusal first
        ([JobSpec("add", {"a": 1, "b": 1}, ref="first"), JobSpec("charge", {}, depends_on=["first"])], 1,
         "missing field 'amount_cents' of Charge"),
    ]
    for batch, index, message in batches:
        with pytest.raises(PayloadError) as err:
            app.enqueue_many(batch)
        assert str(err.value).startswith(f"jobs[{index}]: task ") and message in str(err.value), str(err.value)
        assert "nothing was enqueued" in str(err.value)
        with pytest.raises(PayloadError, match=rf"^jobs\[{index}\]: "):
            asyncio.run(_aenqueue_many(app, batch))
    assert count(conn, app) == 0


async def _aenqueue_many(app: App, batch: list[Any]) -> list[int]:
    try:
        return await app.aenqueue_many(batch)
    finally:
        await app.aclose()


def test_a_producer_that_does_not_know_the_task_checks_no_more(tasks, app, pg_dsn, conn):
    producer = App(settings=make_settings(pg_dsn, app.settings.schema))  # no tasks: enqueues any name
    try:
        ids = [producer.enqueue("charge", {"amount_cents": "12"}), producer.enqueue("add", "just a string")]
        ids += producer.enqueue_many([("charge", {"amount_cents": "x"})])
    finally:
        producer.close()

    ids.append(app.enqueue("elsewhere", "x", any_task=True))  # a name this App does not register
    assert count(conn, app) == len(ids) == 4
    # the worker, which knows the tasks, still refuses the typed ones at their first attempt
    drain(app)
    rows = [app.get_job(i) for i in ids]
    assert [(r["state"], r["last_error_code"], r["attempts"]) for r in (rows[0], rows[2])] == \
        [("dead", "PAYLOAD_INVALID", 1)] * 2
    assert rows[1]["last_error_code"] != "PAYLOAD_INVALID" and rows[1]["attempts"] == 1  # the handler's TypeError
    assert rows[3]["last_error_code"] == "UNKNOWN_TASK"


def _raw_insert(conn, app: App, task: str, payload_json: str) -> int:
    return conn.execute(sql.SQL("INSERT INTO {}.jobs (queue, task, payload, max_attempts) "
                                "VALUES ('default', %s, %s, 3) RETURNING id").format(
        sql.Identifier(app.settings.schema)), [task, payload_json]).fetchone()[0]


def test_plain_value_checks_keep_json_types_apart_and_leave_a_defaulted_parameter_alone(app, conn):
    """A break-it trial: Literal[1, "a"] took True and 1.0, an IntEnum took True, and a
    float payload of 10**400 passed the check, then failed every attempt with an
    OverflowError. A parameter with a default (`payload: int = 5`) is optional: None goes."""
    @app.task(name="lit")
    def lit(v: Literal[1, "a"]) -> None: ...

    @app.task(name="level")
    def level(v: Level) -> None: ...

    @app.task(name="ratio")
    def ratio(x: float) -> None: ...

    @app.task(name="optional")
    def optional(n: int = 5) -> None: ...

    for task, payload in (("lit", True), ("lit", 1.0), ("level", True), ("ratio", 10**400)):
        with pytest.raises(PayloadError, match="nothing was enqueued"):
            app.enqueue(task, payload)
    assert [app.enqueue("lit", 1), app.enqueue("lit", "a"), app.enqueue("level", 1), app.enqueue("optional")]
    assert count(conn, app) == 4

    # a dict parameter with a default takes no payload (the break-it trial: refused, and so
    # was a schedule of it without payload); a payload that is not an object is still refused
    @app.task(name="options", schedule="* * * * *")
    def options(opts: dict = None) -> None: ...  # type: ignore[assignment]

    assert app.enqueue("options") and count(conn, app) == 5
    with pytest.raises(PayloadError, match="expected an object"):
        app.enqueue("options", [1])


def test_a_plain_value_stored_before_the_check_still_runs_as_it_did(tasks, app, conn):
    """A break-it trial of the plain value check: jobs queued before an upgrade (3.0 for
    an int, {} for None) went dead PAYLOAD_INVALID at the new worker, though their
    handlers ran them before. The worker passes such payloads as it always has; only
    enqueue refuses new ones."""
    jobs = [_raw_insert(conn, app, "double", "3.0"), _raw_insert(conn, app, "tick", "{}")]
    drain(app)
    assert [app.get_job(j)["state"] for j in jobs] == ["succeeded", "succeeded"]
    assert tasks == [6.0, "tick"]


def test_a_bad_payload_inserted_by_raw_sql_still_ends_payload_invalid(tasks, app, conn):
    job = _raw_insert(conn, app, "charge", '{"amount_cents": "12"}')
    drain(app)
    row = app.get_job(job)
    assert (row["state"], row["last_error_code"], row["attempts"]) == ("dead", "PAYLOAD_INVALID", 1)
    assert tasks == []


def test_the_check_is_decided_once_per_task_and_untyped_tasks_have_none(tasks, app):
    checks = {name: app.tasks[name].payload_check for name in app.tasks}
    assert checks["bare"] is None and checks["anything"] is None and checks["maybe"] is None
    assert all(checks[n] is not None for n in ("add", "tally", "charge", "ping", "refund", "double", "tick", "label"))
    assert all(app.tasks[name].payload_check == checks[name] for name in app.tasks)  # cached on the Task


def test_cli_enqueue_with_the_app_refuses_and_writes_nothing(tmp_path, app, conn, monkeypatch, capsys):
    module = tmp_path / "cli_payload_app.py"
    module.write_text(
        "from __future__ import annotations\n"
        "import dataclasses\n"
        "import pgworker\n"
        "app = pgworker.App()\n\n"
        "@app.task(name='add')\n"
        "def add(payload: dict, ctx): ...\n\n"
        "@app.task(name='charge')\n"
        "def charge(c: Charge, ctx): ...\n\n"
        "@dataclasses.dataclass\n"
        "class Charge:  # defined below its handler: resolved when the module has run\n"
        "    amount_cents: int\n")
    monkeypatch.setenv("PGWORKER_DSN", app.settings.dsn)
    monkeypatch.setenv("PGWORKER_SCHEMA", app.settings.schema)
    monkeypatch.delitem(sys.modules, "pgworker_app_cli_payload_app", raising=False)
    target = f"{module}:app"
    for task, payload, message in [
        ("add", '"x"', "task 'add': payload: expected an object (dict), got str 'x'"),
        ("add", "[1, 2]", "got list [1, 2]"),
        ("charge", '{"amount_cents": "12"}', "task 'charge': payload.amount_cents: expected int, got str '12'"),
    ]:
        assert cli.main(["enqueue", task, "--payload", payload, "--app", target]) == 1
        err = capsys.readouterr().err
        assert message in err and "nothing was enqueued" in err, err
    assert count(conn, app) == 0
    assert cli.main(["enqueue", "charge", "--payload", '{"amount_cents": 12}', "--app", target]) == 0
    assert capsys.readouterr().out.strip().isdigit()
    # without --app the CLI does not know the task: enqueued as before
    assert cli.main(["enqueue", "add", "--payload", '"x"']) == 0
    assert count(conn, app) == 2


def test_a_batch_names_the_index_of_any_spec_it_refuses(app, conn):
    """Not only a payload: an unknown task, a bad option or a bad queue name in
    enqueue_many named no spec, in a batch of thousands."""
    from pgworker import InvalidJob, InvalidName, JobSpec, UnknownTask

    app.task(name="known")(lambda payload: None)
    before = conn.execute(f'SELECT count(*) FROM "{app.settings.schema}".jobs').fetchone()[0]
    for bad, error in ((JobSpec("knwon"), UnknownTask), (JobSpec("known", priority=10**9), InvalidJob),
                       (JobSpec("known", queue="q" * 129), InvalidName)):
        with pytest.raises(error) as info:
            app.enqueue_many([JobSpec("known"), JobSpec("known"), bad])
        assert str(info.value).startswith("jobs[2]: "), str(info.value)
    assert conn.execute(f'SELECT count(*) FROM "{app.settings.schema}".jobs').fetchone()[0] == before
