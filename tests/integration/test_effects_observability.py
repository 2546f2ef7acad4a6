"""Spans and counters of durable steps, effects and ctx.transaction(), from a real
claimer run in a thread of this process (its executor, completer and metrics)."""

from __future__ import annotations

import threading

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import REGISTRY
from psycopg import sql

import pgworker
from pg import wait_until
from pgworker import tracing
from pgworker.worker.shm.slots import SlotTable
from pgworker.worker.claimer import Claimer
from worker import q

pytestmark = pytest.mark.integration
NOW = pgworker.RetryPolicy(base_seconds=0.0, jitter=0.0)


@pytest.fixture
def exporter():
    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    tracing.set_tracer_provider(provider)
    yield exp
    tracing.set_tracer_provider(None)
    provider.shutdown()


def run_claimer(app, until):
    table = SlotTable(app.settings.max_batch_size)
    claimer = Claimer(app, app.settings, 0, table, app.queues(), drain=True)
    thread = threading.Thread(target=claimer.run, daemon=True)
    thread.start()
    try:
        wait_until(until, 30, message="the jobs to finish")
    finally:
        table.header.stopping = 1
        table.wake.set()
        thread.join(30)


def metric(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_record_spans_settle_span_and_counters(app, exporter, conn, schema):
    app.configure(app.settings.replace(tracing=True))
    queue = f"obs_{schema[-8:]}"
    conn.execute(sql.SQL("CREATE TABLE {}.orders (job_id bigint)").format(sql.Identifier(schema)))

    @app.task(name="flow", queue=queue, max_attempts=3, retry=NOW)
    def flow(payload, ctx):
        ctx.step("quote", lambda: 5)
        ctx.effect("notify", lambda key: "sent" if ctx.attempt > 1 else (_ for _ in ()).throw(OSError("lost")),
                   reconcile=lambda key: pgworker.NOT_DONE)
        with ctx.transaction() as c:
            c.execute(sql.SQL("INSERT INTO {}.orders VALUES (%s)").format(sql.Identifier(schema)), [ctx.job_id])

    @app.task(name="stale", queue=queue, max_attempts=1)
    def stale(payload, ctx):
        conn.execute(sql.SQL("UPDATE {}.jobs SET lease_token = lease_token + 1 WHERE id = %s")
                     .format(sql.Identifier(schema)), [ctx.job_id])
        ctx.step("s", lambda: 1)

    @app.task(name="uncertain", queue=queue, max_attempts=2, retry=NOW)
    def uncertain(payload, ctx):
        ctx.effect("charge", lambda key: (_ for _ in ()).throw(OSError("reply lost")))

    before = {n: metric(n, queue=queue) for n in ("pgworker_steps_skipped_total", "pgworker_effects_uncertain_total")}
    reconciled = metric("pgworker_effects_reconciled_total", queue=queue, result="not_happened")
    fenced = metric("pgworker_fenced_writes_total", queue=queue, operation="step")
    ids = [app.enqueue("flow", {}), app.enqueue("stale", {}), app.enqueue("uncertain", {})]
    run_claimer(app, lambda: q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE state IN ('succeeded', 'dead') "
                                             "OR lease_token > attempts")[0][0] == 3)
    wait_until(lambda: any(s.attributes.get("messaging.operation.name") == "complete_in_transaction"
                           for s in exporter.get_finished_spans()), 10, message="the settle span")
    spans = exporter.get_finished_spans()
    records = [s for s in spans if s.name == f"record {queue}"]
    processes = {s.context.span_id: s for s in spans if s.name == f"process {queue}"}
    quote = [s for s in records if s.attributes.get("pgworker.step.name") == "quote"]
    assert len(quote) == 1 and quote[0].attributes["pgworker.fence.result"] == "accepted"
    assert quote[0].parent.span_id in processes  # a child of its attempt's process span
    refused = [s for s in records if s.attributes["pgworker.fence.result"] == "refused"]
    assert len(refused) == 1 and refused[0].status.status_code == StatusCode.ERROR
    assert [e.name for e in refused[0].events] == ["fence refused"]
    [settle] = [s for s in spans if s.attributes.get("messaging.operation.name") == "complete_in_transaction"]
    assert settle.attributes["pgworker.fence.result"] == "accepted"
    # attempt 2 of flow skipped 'quote'; reconcile said not_happened once; the stale step was fenced;
    # uncertain's attempt 2 found its effect started with no reconcile function
    assert metric("pgworker_steps_skipped_total", queue=queue) - before["pgworker_steps_skipped_total"] == 1
    assert metric("pgworker_effects_reconciled_total", queue=queue, result="not_happened") - reconciled == 1
    assert metric("pgworker_fenced_writes_total", queue=queue, operation="step") - fenced == 1
    assert metric("pgworker_effects_uncertain_total", queue=queue) - before["pgworker_effects_uncertain_total"] == 1
    assert q(conn, schema, "SELECT state::text, last_error_code FROM {s}.jobs WHERE id = %s", ids[2]) == \
        [("dead", "EFFECT_UNCERTAIN")]
