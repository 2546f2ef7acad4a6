"""OpenTelemetry spans of real claims, runs and fenced writes against PostgreSQL.

The claimer logic runs in-process (a :class:`pgworker.worker.claimer.Claimer` with its slot
table, in a thread, in drain mode), so that an injected TracerProvider with an in-memory
exporter sees its spans; the database is the real one.
"""

from __future__ import annotations

import threading

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import pgworker
from pg import wait_until
from pgworker import tracing
from pgworker.worker.shm.slots import SlotTable
from pgworker.worker.claimer import Claimer
from worker import q

pytestmark = pytest.mark.integration


class FlakyError(Exception):
    pgworker_code = "FLAKY"


@pytest.fixture
def exporter():
    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    tracing.set_tracer_provider(provider)
    yield exp
    tracing.set_tracer_provider(None)
    provider.shutdown()


@pytest.fixture
def traced_app(app):
    app.configure(app.settings.replace(tracing=True))
    return app


class InProcessClaimer:
    """A claimer run in a thread of this process, in drain mode; stop() ends it."""

    def __init__(self, app: pgworker.App) -> None:
        self.table = SlotTable(app.settings.max_batch_size)
        self.claimer = Claimer(app, app.settings, 0, self.table, app.queues(), drain=True)
        self.thread = threading.Thread(target=self.claimer.run, name="in-process-claimer", daemon=True)

    def __enter__(self) -> "InProcessClaimer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.table.header.stopping = 1
        self.table.wake.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


def state(conn, schema, job_id):
    return q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job_id)[0][0]


def by_name(spans, name):
    return [s for s in spans if s.name == name]


def test_one_trace_from_the_request_through_both_attempts(traced_app, exporter, conn, schema):
    app = traced_app

    @app.task(name="flaky", max_attempts=3, retry=pgworker.RetryPolicy(base_seconds=0, jitter=0))
    def flaky(payload, ctx):
        with tracing.tracer().start_as_current_span("handler work"):
            if ctx.attempt == 1:
                raise FlakyError("first attempt fails")

    request_tracer = trace.get_tracer("the application", tracer_provider=tracing._tracer_provider)
    with request_tracer.start_as_current_span("POST /orders") as request:
        job_id = app.enqueue("flaky", {"order": 1})
    with InProcessClaimer(app):
        wait_until(lambda: state(conn, schema, job_id) == "succeeded", 30, message="the job to succeed")
        wait_until(lambda: len(by_name(exporter.get_finished_spans(), "settle default")) == 2, 10)
    spans = exporter.get_finished_spans()

    [send] = by_name(spans, "send default")
    process = sorted(by_name(spans, "process default"), key=lambda s: s.attributes["pgworker.job.attempt"])
    settle = sorted(by_name(spans, "settle default"), key=lambda s: s.attributes["pgworker.job.attempt"])
    work = by_name(spans, "handler work")
    assert len(process) == 2 and len(settle) == 2 and len(work) == 2

    trace_id = request.get_span_context().trace_id
    assert {s.context.trace_id for s in [send, *process, *settle, *work]} == {trace_id}
    assert send.parent.span_id == request.get_span_context().span_id
    assert send.kind == SpanKind.PRODUCER
    assert send.attributes["messaging.system"] == "pgworker"
    assert send.attributes["messaging.operation.type"] == "send"
    assert send.attributes["messaging.destination.name"] == "default"
    assert send.attributes["messaging.message.id"] == str(job_id)

    for attempt, (p, st, w) in enumerate(zip(process, settle, sorted(work, key=lambda s: s.start_time)), 1):
        assert p.kind == SpanKind.CONSUMER
        assert p.parent.span_id == send.context.span_id  # parented to the enqueuing span...
        assert [link.context.span_id for link in p.links] == [send.context.span_id]  # ...and linked
        assert p.attributes["messaging.message.id"] == str(job_id)
        assert p.attributes["messaging.operation.type"] == "process"
        assert p.attributes["pgworker.job.attempt"] == attempt
        assert p.attributes["pgworker.lease.token"] == attempt
        assert p.attributes["pgworker.task"] == "flaky"
        assert p.attributes["messaging.client.id"].endswith(":c0")
        assert w.parent.span_id == p.context.span_id  # the handler's own span is a child
        assert st.parent.span_id == p.context.span_id
        assert st.kind == SpanKind.CLIENT
        assert st.attributes["messaging.operation.type"] == "settle"
        assert st.attributes["pgworker.job.attempt"] == attempt
        assert st.attributes["pgworker.fence.result"] == "accepted"
        assert "error.type" not in st.attributes

    assert process[0].attributes["pgworker.outcome"] == "retried"
    assert process[0].attributes["error.type"] == "FLAKY"
    assert process[0].status.status_code == StatusCode.ERROR
    assert settle[0].attributes["messaging.operation.name"] == "retry"
    assert process[1].attributes["pgworker.outcome"] == "succeeded"
    assert "error.type" not in process[1].attributes
    assert settle[1].attributes["messaging.operation.name"] == "complete"

    # claims are spans of their own (one claim serves many jobs of many traces)
    receives = by_name(spans, "receive default")
    claimed = [r for r in receives if r.attributes.get("messaging.batch.message_count")]
    assert len(claimed) == 2 and all(r.parent is None and r.kind == SpanKind.CLIENT for r in receives)


def test_a_batched_write_is_one_settle_span_linked_to_every_attempt(traced_app, exporter, conn, schema):
    """Outcomes written by one statement make one settle span (a root, with the batch
    count) that links to each attempt's process span, not a span per attempt; a write of
    a single outcome stays a child of its process span (the test above)."""
    app = traced_app
    # one claim of all ten, and no flush by the timer while the batch runs
    app.configure(app.settings.replace(batch_size=10, completion_flush_seconds=30))
    quick = app.task(name="quick")(lambda payload: None)
    n = 10
    ids = app.enqueue_many([(quick.name, {"i": i}) for i in range(n)])
    with InProcessClaimer(app):
        wait_until(lambda: all(state(conn, schema, i) == "succeeded" for i in ids), 30, message="the jobs")
        wait_until(lambda: by_name(exporter.get_finished_spans(), "settle default"), 10)
    spans = exporter.get_finished_spans()
    process = by_name(spans, "process default")
    settles = by_name(spans, "settle default")
    assert len(process) == n
    assert len(settles) == 1, [dict(s.attributes) for s in settles]
    [settle] = settles
    assert settle.parent is None and settle.kind == SpanKind.CLIENT
    assert settle.attributes["messaging.operation.type"] == "settle"
    assert settle.attributes["messaging.operation.name"] == "complete"
    assert settle.attributes["messaging.batch.message_count"] == n
    assert settle.attributes["pgworker.fence.result"] == "accepted"
    assert "messaging.message.id" not in settle.attributes
    assert {link.context.span_id for link in settle.links} == {p.context.span_id for p in process}
    assert settle.start_time >= max(p.end_time for p in process) - 1  # after the attempts, not during


def test_a_fenced_out_completion_carries_lease_lost(traced_app, exporter, conn, schema, pg_dsn):
    """Nobody renews the lease (there is no supervisor here): the handler outlives it,
    another worker takes the job over (its token moves on, as a reap and a new claim would
    do: an expired lease alone no longer refuses a late outcome), and the completion is
    refused by the fence."""
    from prometheus_client import REGISTRY

    app = traced_app
    app.configure(app.settings.replace(lease_seconds=1, renew_interval_seconds=0.5))

    def fenced_completions() -> float:
        return REGISTRY.get_sample_value("pgworker_fenced_writes_total",
                                         {"queue": "default", "operation": "complete"}) or 0.0

    @app.task(name="outlives", max_attempts=3)
    def outlives(payload, ctx):
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            wait_until(lambda: q(c, schema, "SELECT lease_expires_at < clock_timestamp() FROM {s}.jobs "
                                            "WHERE id = %s", ctx.job_id)[0][0], 30, 0.05)
            q(c, schema, "UPDATE {s}.jobs SET lease_token = lease_token + 1, lease_expires_at = now() + "
                         "interval '1 hour' WHERE id = %s RETURNING id", ctx.job_id)

    before = fenced_completions()
    job_id = app.enqueue("outlives")
    with InProcessClaimer(app):
        wait_until(lambda: by_name(exporter.get_finished_spans(), "settle default"), 30,
                   message="the settle span")
    [settle] = by_name(exporter.get_finished_spans(), "settle default")
    [process] = by_name(exporter.get_finished_spans(), "process default")
    assert settle.parent.span_id == process.context.span_id
    assert settle.attributes["messaging.operation.name"] == "complete"
    assert settle.attributes["pgworker.fence.result"] == "refused"
    assert settle.attributes["error.type"] == "pgworker.LeaseLost"
    assert settle.attributes["pgworker.lease.overrun_seconds"] > 0  # it ran past the claim's lease
    assert settle.status.status_code == StatusCode.ERROR
    assert q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job_id) == [("running",)]
    assert fenced_completions() == before + 1


def test_trace_sql_makes_the_claim_statement_a_child_of_the_receive_span(traced_app, exporter, conn, schema):
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    app = traced_app

    @app.task(name="quick")
    def quick(payload):
        return None

    job_id = app.enqueue("quick")
    tracing.instrument_psycopg()
    try:
        with InProcessClaimer(app):
            wait_until(lambda: state(conn, schema, job_id) == "succeeded", 30)
    finally:
        PsycopgInstrumentor().uninstrument()
    spans = exporter.get_finished_spans()
    [receive] = [r for r in by_name(spans, "receive default") if r.attributes.get("messaging.batch.message_count")]
    sql_children = [s for s in spans if s.parent is not None and s.parent.span_id == receive.context.span_id]
    assert [s.name for s in sql_children] == ["WITH"]  # the claim's CTE, named after its first word
    assert sql_children[0].attributes.get("db.system") == "postgresql"


def test_no_sdk_no_spans_and_no_work():
    """Without an SDK provider (the API's proxy) or with --no-tracing (a no-op provider)
    every helper returns the invalid span at once."""
    from datetime import datetime, timezone

    from pgworker.jobs import ClaimedJob

    now = datetime.now(timezone.utc)
    job = ClaimedJob(1, "default", "t", None, 0, 1, 5, 1, now, now, now, None, None, None, 0.0)
    providers = [trace.NoOpTracerProvider()]
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):  # no global SDK in this process
        providers.append(None)
    for provider in providers:
        tracing.set_tracer_provider(provider)
        try:
            assert not tracing.enabled()
            span = tracing.start_process_span(job, "w")
            assert span is tracing.INVALID_SPAN and not span.is_recording()
            assert tracing.attach(span) is None
            with tracing.send_span("default", task="t") as s:
                assert tracing.carrier(s) is None
            with tracing.claim_span("default", "w") as s:
                assert s is tracing.INVALID_SPAN
        finally:
            tracing.set_tracer_provider(None)


def test_the_reaper_records_a_reap_span_with_its_counts(traced_app, exporter, conn, schema):
    from pgworker.worker.reaper import ReaperConfig, reap_pass

    app = traced_app
    ids = app.enqueue_many([("t", i) for i in range(3)])
    app.claim(limit=3)
    q(conn, schema, "UPDATE {s}.jobs SET lease_expires_at = now() - interval '1s', "
                    "max_attempts = CASE WHEN id = %s THEN 1 ELSE 5 END RETURNING id", ids[0])
    with app.connect() as c:
        assert reap_pass(app.store, c, ReaperConfig()) == 3
    [reap] = by_name(exporter.get_finished_spans(), "reap default")
    assert reap.kind == SpanKind.INTERNAL and reap.parent is None
    assert reap.attributes["messaging.operation.name"] == "reap"
    assert reap.attributes["messaging.batch.message_count"] == 3
    assert (reap.attributes["pgworker.requeued"], reap.attributes["pgworker.dead"]) == (2, 1)


def test_a_dependent_s_process_span_links_to_each_parent_s_trace(traced_app, exporter, conn, schema):
    """Two parents enqueued by two requests (two traces), their child by a third: the
    child's process span is parented to its own enqueue and links to it and to each
    parent's enqueue context, whose trace holds the parent's process span."""
    app = traced_app
    app.task(name="step")(lambda payload: None)
    request_tracer = trace.get_tracer("the application", tracer_provider=tracing._tracer_provider)
    parents = []
    for i in range(2):
        with request_tracer.start_as_current_span(f"POST /parent/{i}"):
            parents.append(app.enqueue("step", {"parent": i}))
    with request_tracer.start_as_current_span("POST /child") as request:
        child = app.enqueue("step", {"child": True}, depends_on=parents)
    with InProcessClaimer(app):
        wait_until(lambda: state(conn, schema, child) == "succeeded", 30, message="the child to succeed")
    spans = exporter.get_finished_spans()
    process = {s.attributes["messaging.message.id"]: s for s in by_name(spans, "process default")}
    by_span_id = {s.context.span_id: s for s in by_name(spans, "send default")}
    sends = {job_id: by_span_id[p.parent.span_id] for job_id, p in process.items()}  # each job's enqueue
    p_child = process[str(child)]
    assert p_child.context.trace_id == request.get_span_context().trace_id
    assert p_child.parent.span_id == sends[str(child)].context.span_id
    links = [(link.context.trace_id, link.context.span_id, link.attributes["pgworker.link"]) for link in p_child.links]
    assert links[0] == (sends[str(child)].context.trace_id, sends[str(child)].context.span_id, "enqueue")
    assert sorted(links[1:]) == sorted((sends[str(p)].context.trace_id, sends[str(p)].context.span_id, "parent")
                                       for p in parents)
    for p in parents:  # each link leads to the trace where the parent ran
        assert process[str(p)].context.trace_id == sends[str(p)].context.trace_id
    assert "pgworker.parent_links.dropped" not in p_child.attributes


def test_a_fan_in_of_1000_parents_links_a_bounded_number(traced_app, exporter, conn, schema):
    """1,000 parents, each with its own trace context: the child stores and links at most
    tracing.PARENT_LINKS_MAX of them (128 links with its own enqueue's, the SDK's default
    limit) and says how many it left out; the migration's bound is the constant."""
    app = traced_app
    app.task(name="step")(lambda payload: None)
    n = 1000
    parents = app.enqueue_many([("step", {"i": i}) for i in range(n)])
    # a distinct W3C context per parent, as 1,000 requests would have stored
    conn.execute(psycopg.sql.SQL(
        "UPDATE {s}.jobs SET trace_context = jsonb_build_object('traceparent', "
        "'00-' || lpad(to_hex(id), 32, '0') || '-' || lpad(to_hex(id), 16, '0') || '-01') "
        "WHERE id = ANY(%s)").format(s=psycopg.sql.Identifier(schema)), (parents,))
    child = app.enqueue("step", {"child": True}, depends_on=parents)
    with InProcessClaimer(app):
        wait_until(lambda: state(conn, schema, child) == "succeeded", 60, message="the child to succeed")
    stored = q(conn, schema, "SELECT trace_context FROM {s}.jobs WHERE id = %s", child)[0][0]
    assert len(stored[tracing.PARENT_LINKS_KEY]) == tracing.PARENT_LINKS_MAX
    assert stored[tracing.PARENT_LINKS_DROPPED_KEY] == n - tracing.PARENT_LINKS_MAX
    [p_child] = [s for s in by_name(exporter.get_finished_spans(), "process default")
                 if s.attributes["messaging.message.id"] == str(child)]
    assert len(p_child.links) == tracing.PARENT_LINKS_MAX + 1 <= 128
    assert p_child.attributes["pgworker.parent_links.dropped"] == n - tracing.PARENT_LINKS_MAX
    assert {link.attributes["pgworker.link"] for link in p_child.links[1:]} == {"parent"}


def test_the_trigger_s_link_bound_is_the_tracing_constant():
    """The trigger (SQL) and tracing.py bound the parent links alike."""
    import pathlib

    from pgworker import sql as sqlfiles

    root = pathlib.Path(sqlfiles.__file__).parent
    for f in (root / "schema.sql", root / "migrations" / "0009_unblock.sql"):
        assert f"'pgworker.parents'), 0) < {tracing.PARENT_LINKS_MAX}" in f.read_text(), f


def test_an_untraced_child_of_traced_parents_starts_a_trace_linked_to_them(traced_app, exporter, conn, schema):
    """The child was enqueued with no SDK (another service, say): its process span is a
    root of its own, with a link to each parent's trace."""
    app = traced_app
    app.task(name="step")(lambda payload: None)
    parents = [app.enqueue("step", {"parent": i}) for i in range(2)]
    provider = tracing._tracer_provider
    tracing.set_tracer_provider(None)  # the global provider: the API's proxy, nothing recorded
    try:
        child = app.enqueue("step", {"child": True}, depends_on=parents)
    finally:
        tracing.set_tracer_provider(provider)
    assert q(conn, schema, "SELECT trace_context FROM {s}.jobs WHERE id = %s", child)[0][0] is None
    with InProcessClaimer(app):
        wait_until(lambda: state(conn, schema, child) == "succeeded", 30, message="the child to succeed")
    spans = exporter.get_finished_spans()
    process = {s.attributes["messaging.message.id"]: s for s in by_name(spans, "process default")}
    p_child = process[str(child)]
    assert p_child.parent is None
    assert sorted(link.context.trace_id for link in p_child.links) == sorted(
        process[str(p)].context.trace_id for p in parents)
    assert {link.attributes["pgworker.link"] for link in p_child.links} == {"parent"}
