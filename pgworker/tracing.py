"""OpenTelemetry spans for enqueue, claim, process, settle, renew and reap.

Span names and attributes follow the OpenTelemetry messaging semantic conventions
(v1.44): ``send {queue}`` (PRODUCER) at enqueue, ``receive {queue}`` for a claim,
``process {queue}`` (CONSUMER) for each attempt, ``settle {queue}`` for its fenced
outcome. The W3C trace context of the send span is stored in the job row
(``trace_context``) and becomes the parent of every attempt's process span, which also
links to it, so one trace follows a job from the request that enqueued it to its last
attempt. With no SDK configured the OpenTelemetry API returns non-recording spans and
pgworker skips the work around them, so tracing then costs next to nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Iterator

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from . import __version__
from .catalogue import MESSAGING_SYSTEM

log = logging.getLogger("pgworker.tracing")

_tracer_provider: trace.TracerProvider | None = None


_tracer_cache: tuple[trace.TracerProvider | None, trace.Tracer] | None = None


def set_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Use ``provider`` for pgworker's spans instead of the global one (tests inject an
    SDK provider with an in-memory exporter here)."""
    global _tracer_provider
    _tracer_provider = provider


def tracer() -> trace.Tracer:
    """pgworker's tracer, looked up once per provider: ``get_tracer`` costs several
    microseconds and the claimer asks for it a few times per job. Without an override
    the global provider's tracer is a proxy until the SDK installs one, then delegates."""
    global _tracer_cache
    cached = _tracer_cache
    if cached is not None and cached[0] is _tracer_provider:
        return cached[1]
    t = trace.get_tracer("pgworker", __version__, tracer_provider=_tracer_provider)
    _tracer_cache = (_tracer_provider, t)
    return t


def _base(queue: str, op_type: str, op_name: str) -> dict[str, Any]:
    return {"messaging.system": MESSAGING_SYSTEM, "messaging.operation.type": op_type,
            "messaging.operation.name": op_name, "messaging.destination.name": queue}


@contextlib.contextmanager
def send_span(queue: str, *, task: str | None = None, batch: int | None = None) -> Iterator[trace.Span]:
    """The span around an enqueue; inject its context with :func:`carrier`."""
    attrs = _base(queue, "send", "send")
    if task is not None:
        attrs["pgworker.task"] = task
    if batch is not None:
        attrs["messaging.batch.message_count"] = batch
    kind = SpanKind.PRODUCER if batch is None else SpanKind.CLIENT
    with tracer().start_as_current_span(f"send {queue}", kind=kind, attributes=attrs) as span:
        yield span


def carrier(span: trace.Span) -> dict[str, str] | None:
    """The W3C trace context of ``span`` to store with a job, or None when not traced."""
    if not span.get_span_context().is_valid:
        return None
    out: dict[str, str] = {}
    inject(out, context=trace.set_span_in_context(span))
    return out or None


@contextlib.contextmanager
def claim_span(queue: str, worker_id: str) -> Iterator[trace.Span]:
    attrs = _base(queue, "receive", "claim")
    attrs["messaging.client.id"] = worker_id
    with tracer().start_as_current_span(f"receive {queue}", kind=SpanKind.CLIENT, attributes=attrs) as span:
        yield span


def start_process_span(job: Any, worker_id: str) -> trace.Span:
    """Start (not activate) the CONSUMER span of one attempt, parented to the enqueuing
    span through the job's stored trace context, and linked to it."""
    t = tracer()
    attrs = _base(job.queue, "process", "process")
    attrs.update({"messaging.message.id": str(job.id), "messaging.client.id": worker_id,
                  "pgworker.task": job.task, "pgworker.job.attempt": job.attempt,
                  "pgworker.lease.token": job.lease_token})
    parent_ctx = None
    links: list[Link] = []
    if job.trace_context:
        try:
            parent_ctx = extract(job.trace_context)
            sc = trace.get_current_span(parent_ctx).get_span_context()
            if sc.is_valid:
                links.append(Link(sc, {"pgworker.link": "enqueue"}))
            else:
                parent_ctx = None
        except Exception:  # a malformed stored context must not fail the job
            parent_ctx = None
    if parent_ctx is None:
        parent_ctx = otel_context.Context()  # a new trace, not the claimer's current span
    return t.start_span(f"process {job.queue}", context=parent_ctx, kind=SpanKind.CONSUMER,
                        attributes=attrs, links=links)


def record_outcome(span: trace.Span, outcome: str, exc: BaseException | None = None,
                   error_type: str | None = None) -> None:
    if not span.is_recording():
        return
    span.set_attribute("pgworker.outcome", outcome)
    if exc is not None:
        # error.type only: exception messages and tracebacks may carry secrets
        span.set_attribute("error.type", error_type or type(exc).__qualname__)
        span.set_status(Status(StatusCode.ERROR, error_type or type(exc).__qualname__))


def settle_span(job: Any, operation: str, accepted: bool, *, parent: trace.Span | None,
                worker_id: str, start_time: int | None = None) -> None:
    """Emit the ``settle {queue}`` span of one attempt's fenced write (after the fact:
    outcomes are written in batches)."""
    if parent is None or not parent.is_recording():
        return
    attrs = _base(job.queue, "settle", operation)
    attrs.update({"messaging.message.id": str(job.id), "messaging.client.id": worker_id,
                  "pgworker.task": job.task, "pgworker.job.attempt": job.attempt,
                  "pgworker.lease.token": job.lease_token,
                  "pgworker.fence.result": "accepted" if accepted else "refused"})
    if not accepted:
        attrs["error.type"] = "pgworker.LeaseLost"
    span = tracer().start_span(f"settle {job.queue}", context=trace.set_span_in_context(parent),
                               kind=SpanKind.CLIENT, attributes=attrs, start_time=start_time)
    if not accepted:
        span.set_status(Status(StatusCode.ERROR, "lease lost: the write was refused by the fence"))
    span.end()


def settle_batch_span(queue: str, operation: str, process_spans: list[trace.Span], *, worker_id: str,
                      start_time: int | None = None) -> None:
    """Emit one ``settle {queue}`` span for the accepted outcomes of one fenced batch
    write, linked to each attempt's process span. One span per statement rather than
    per attempt: with an SDK at full sampling a span costs about as much CPU as the rest
    of a no-op job's path, so per-attempt settle spans halved the claimer's throughput.
    A refused write still gets a span of its own (:func:`settle_span`)."""
    recording = [s for s in process_spans if s.is_recording()]
    if not recording:
        return
    attrs = _base(queue, "settle", operation)
    attrs.update({"messaging.client.id": worker_id, "messaging.batch.message_count": len(recording),
                  "pgworker.fence.result": "accepted"})
    links = [Link(s.get_span_context()) for s in recording]
    tracer().start_span(f"settle {queue}", context=otel_context.Context(), kind=SpanKind.CLIENT,
                        attributes=attrs, links=links, start_time=start_time).end()


def batch_span(kind: str, queue: str, count: int, **extra: Any) -> None:
    """Record a finished batch operation (renew, reap) as one span with its counts."""
    t = tracer()
    op_type = "renew" if kind == "renew" else "reap"
    attrs = _base(queue, op_type, kind)
    attrs["messaging.batch.message_count"] = count
    attrs.update({f"pgworker.{k}": v for k, v in extra.items()})
    span_kind = SpanKind.CLIENT if kind == "renew" else SpanKind.INTERNAL
    span = t.start_span(f"{kind} {queue}", kind=span_kind, attributes=attrs,
                        context=otel_context.Context())
    if extra.get("lost"):
        span.set_attribute("error.type", "pgworker.LeaseLost")
    span.end()


def configure_from_env(service_name: str = "pgworker") -> trace.TracerProvider | None:
    """Set up an SDK tracer provider from the standard ``OTEL_*`` variables, if any.

    Returns the provider (flush it with ``force_flush()`` before exit), or None when no
    exporter is configured (``OTEL_TRACES_EXPORTER`` unset or 'none' and no OTLP
    endpoint), in which case spans stay non-recording and cost next to nothing.
    Exporters are loaded through the ``opentelemetry_traces_exporter`` entry points
    (``otlp`` needs ``pip install 'pgworker[otlp]'``; ``console`` is built in).
    """
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not names and (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                      or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        names = "otlp"
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true" or names in ("", "none"):
        return None
    from importlib.metadata import entry_points

    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)}).merge(
        OTELResourceDetector().detect())
    provider = TracerProvider(resource=resource)  # sampler from OTEL_TRACES_SAMPLER
    eps = {ep.name: ep for ep in entry_points(group="opentelemetry_traces_exporter")}
    for name in (n.strip() for n in names.split(",") if n.strip() and n.strip() != "none"):
        ep = eps.get(name)
        if ep is None:
            log.warning("OTEL_TRACES_EXPORTER=%s: no such exporter installed (for otlp: "
                        "pip install 'pgworker[otlp]'); traces for it are off", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(ep.load()()))
    trace.set_tracer_provider(provider)
    return provider


def instrument_psycopg() -> None:
    """Emit SQL child spans for psycopg (``--trace-sql``)."""
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    instr = PsycopgInstrumentor()
    if not instr.is_instrumented_by_opentelemetry:
        instr.instrument(enable_commenter=False)


def flush(provider: trace.TracerProvider | None, timeout_millis: int = 5000) -> None:
    if provider is not None and hasattr(provider, "force_flush"):
        try:
            provider.force_flush(timeout_millis)
        except Exception:
            log.exception("flushing traces failed")
