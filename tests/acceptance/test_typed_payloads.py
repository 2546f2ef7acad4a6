"""Typed payloads end to end: objects enqueued as they are (a dataclass, a TypedDict, a
pydantic model), run by a real `pgworker run` whose handlers are annotated with those
types (tests/apps/typed_app.py); each handler receives its type, and a payload that does
not fit is refused at enqueue by a producer that knows the task, with the message a
worker gives a row that reaches the table anyway (raw SQL, another producer): dead at its
first attempt with PAYLOAD_INVALID and the field at fault."""

from __future__ import annotations

import datetime
import json
import os
import sys

import pytest

from pgworker import PayloadError

from pg import wait_until
from worker import HERE, Worker, create_ledger, q

pytestmark = pytest.mark.acceptance

TYPED_APP = os.path.join(HERE, "apps", "typed_app.py") + ":app"


@pytest.fixture
def typed(app, pg_dsn):
    """The test's App with the typed app's tasks, and its module (for the types)."""
    from pgworker.loader import load_app

    create_ledger(pg_dsn, app.settings.schema)
    loaded = load_app(TYPED_APP)
    app.tasks.update(loaded.tasks)
    module = sys.modules[loaded.tasks["bill"].func.__module__]
    return app, module


def finished(conn, schema, n):
    return q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE state IN ('succeeded', 'dead')")[0][0] == n


def test_handlers_receive_their_types_and_bad_payloads_are_refused_or_die_once(typed, pg_dsn, conn):
    app, m = typed
    schema = app.settings.schema
    good = {
        "bill": app.enqueue("bill", m.Invoice("acme", [m.Line("a", 2), m.Line("b", 3)], datetime.date(2026, 12, 31))),
        "bill_dict": app.enqueue("bill", {"customer": "zeta", "lines": [{"sku": "c", "quantity": 1}]}),
        "remind": app.enqueue("remind", m.Reminder(invoice=7, channel="sms")),
        "refund": app.enqueue("refund", m.Refund(invoice=8, amount=12.5)),
    }
    bad_payloads = {
        "bill": ("bill", {"customer": "acme", "lines": [{"sku": "a", "quantity": "two"}]}),
        "bill_extra": ("bill", {"customer": "acme", "lines": [], "discount": 5}),
        "remind": ("remind", {"channel": "sms"}),
        "refund": ("refund", {"invoice": "eight", "amount": 1}),
    }
    expected = {
        "bill": "payload.lines[0].quantity: expected int, got str 'two'",
        "bill_extra": "payload: unexpected field 'discount' for Invoice",
        "remind": "payload: missing key 'invoice' of Reminder",
        "refund": "payload does not fit Refund",
    }
    for name, (task, payload) in bad_payloads.items():  # this producer knows the tasks: refused, not stored
        with pytest.raises(PayloadError, match="nothing was enqueued") as err:
            app.enqueue(task, payload)
        assert f"task {task!r}: {expected[name]}" in str(err.value), (name, err.value)
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs")[0][0] == len(good)
    # rows that reach the table anyway (raw SQL, a producer without the tasks): the worker refuses them
    bad = {name: q(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload, max_attempts) "
                                 "VALUES ('default', %s, %s, 5) RETURNING id", task, json.dumps(payload))[0][0]
           for name, (task, payload) in bad_payloads.items()}
    # the dataclass went in as JSON of its fields (the date as ISO text)
    assert app.get_job(good["bill"])["payload"] == {
        "customer": "acme", "lines": [{"sku": "a", "quantity": 2}, {"sku": "b", "quantity": 3}],
        "due": "2026-12-31", "tags": []}
    with Worker(pg_dsn, schema, "--concurrency", "2", "--poll-interval", "0.2", app=TYPED_APP) as w:
        wait_until(lambda: finished(conn, schema, len(good) + len(bad)), 60, message=lambda: w.logs()[-3000:])
    notes = dict(q(conn, schema, "SELECT job_id, note FROM {s}.ledger"))
    assert notes == {
        good["bill"]: "Invoice acme 5 Line datetime.date(2026, 12, 31)",
        good["bill_dict"]: "Invoice zeta 1 Line None",
        good["remind"]: "dict 7 sms",
        good["refund"]: "Refund 8 12.5",
    }
    for job_id in good.values():
        assert app.get_job(job_id)["state"] == "succeeded"
    for name, job_id in bad.items():
        job = app.get_job(job_id)
        assert (job["state"], job["last_error_code"], job["attempts"]) == ("dead", "PAYLOAD_INVALID", 1), (name, job)
        [error] = job["errors"]
        assert expected[name] in str(error), (name, error)
