"""OpenTelemetry spans for enqueue, claim, process, settle, renew and reap.

Span names and attributes follow the OpenTelemetry messaging semantic conventions
(v1.44): ``send {queue}`` (PRODUCER) at enqueue, ``receive {queue}`` for a claim,
``process {queue}`` (CONSUMER) for each attempt, ``settle {queue}`` for its fenced
outcome. The W3C trace context of the send span is stored in the job row
(``trace_context``) and becomes the parent of every attempt's process span, which also
links to it, so one trace follows a job from the request that enqueued it to its last
attempt. With no SDK configured (or ``--no-tracing``) every helper here returns at once
with the API's invalid span, building no attributes, so tracing then costs a function
call and an ``isinstance`` check per span.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Iterator, Sequence, TextIO

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from ._version import __version__
from .catalogue import MESSAGING_SYSTEM

log = logging.getLogger("pgworker.tracing")

LEASE_LOST = "pgworker.LeaseLost"  # error.type of a write refused by the fence

_tracer_provider: trace.TracerProvider | None = None
# (provider, its pgworker tracer or None when that provider records nothing)
_cached: tuple[Any, trace.Tracer | None] = (None, None)
_NO_OP_PROVIDERS = (trace.NoOpTracerProvider, trace.ProxyTracerProvider)
INVALID_SPAN = trace.INVALID_SPAN


def set_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Use ``provider`` for pgworker's spans instead of the global one (tests inject an
    SDK provider with an in-memory exporter here); None goes back to the global one."""
    global _tracer_provider
    _tracer_provider = provider


def _active_tracer() -> trace.Tracer | None:
    """pgworker's tracer, or None when no SDK is set up (the global provider is still the
    API's proxy, or a no-op one): then no span would be recorded and callers skip all
    work. Cached per provider, so an SDK installed later (by the user's app module,
    say) is picked up."""
    global _cached
    provider = _tracer_provider if _tracer_provider is not None else trace.get_tracer_provider()
    cached_provider, cached_tracer = _cached
    if cached_provider is provider:
        return cached_tracer
    t = None if isinstance(provider, _NO_OP_PROVIDERS) else provider.get_tracer("pgworker", __version__)
    _cached = (provider, t)
    return t


def tracer() -> trace.Tracer:
    """pgworker's tracer (a no-op one when tracing is not set up)."""
    return _active_tracer() or trace.get_tracer("pgworker", __version__, tracer_provider=_tracer_provider)


def enabled() -> bool:
    """True when spans are recorded (an SDK tracer provider is set up)."""
    return _active_tracer() is not None


def _base(queue: str, op_type: str, op_name: str) -> dict[str, Any]:
    return {"messaging.system": MESSAGING_SYSTEM, "messaging.operation.type": op_type,
            "messaging.operation.name": op_name, "messaging.destination.name": queue}


@contextlib.contextmanager
def send_span(queue: str, *, task: str | None = None, batch: int | None = None) -> Iterator[trace.Span]:
    """The span around an enqueue; inject its context with :func:`carrier`."""
    t = _active_tracer()
    if t is None:
        yield INVALID_SPAN
        return
    attrs = _base(queue, "send", "send")
    if task is not None:
        attrs["pgworker.task"] = task
    if batch is not None:
        attrs["messaging.batch.message_count"] = batch
    kind = SpanKind.PRODUCER if batch is None else SpanKind.CLIENT
    with t.start_as_current_span(f"send {queue}", kind=kind, attributes=attrs) as span:
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
    """The span around one claim statement (set messaging.batch.message_count on it)."""
    t = _active_tracer()
    if t is None:
        yield INVALID_SPAN
        return
    attrs = _base(queue, "receive", "claim")
    attrs["messaging.client.id"] = worker_id
    with t.start_as_current_span(f"receive {queue}", kind=SpanKind.CLIENT, attributes=attrs) as span:
        yield span


_PROCESS_FIXED: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}


def start_process_span(job: Any, worker_id: str) -> trace.Span:
    """Start (not activate) the CONSUMER span of one attempt, parented to the enqueuing
    span through the job's stored trace context, and linked to it. Activate it around
    the handler with :func:`attach` so the handler's own spans become its children."""
    t = _active_tracer()
    if t is None:
        return INVALID_SPAN
    key = (job.queue, worker_id)
    fixed = _PROCESS_FIXED.get(key)
    if fixed is None:  # the attributes every attempt of a queue shares, built once
        fixed = _PROCESS_FIXED[key] = (f"process {job.queue}", {**_base(job.queue, "process", "process"),
                                                                 "messaging.client.id": worker_id})
    name, attrs = fixed[0], {**fixed[1], "messaging.message.id": str(job.id), "pgworker.task": job.task,
                             "pgworker.job.attempt": job.attempt, "pgworker.lease.token": job.lease_token}
    parent_ctx = None
    links: list[Link] = []
    if job.trace_context:
        try:
            stored = job.trace_context
            if PARENT_LINKS_KEY in stored:  # a job with dependencies: its parents' enqueue contexts
                stored = {k: v for k, v in stored.items() if k not in (PARENT_LINKS_KEY, PARENT_LINKS_DROPPED_KEY)}
                links += parent_links(job.trace_context)
                dropped = job.trace_context.get(PARENT_LINKS_DROPPED_KEY)
                if isinstance(dropped, int) and dropped > 0:
                    attrs["pgworker.parent_links.dropped"] = dropped
            parent_ctx = extract(stored)
            sc = trace.get_current_span(parent_ctx).get_span_context()
            if sc.is_valid:
                links.insert(0, Link(sc, {"pgworker.link": "enqueue"}))
            else:
                parent_ctx = None
        except Exception:  # a malformed stored context must not fail the job
            parent_ctx = None
    if parent_ctx is None:
        parent_ctx = otel_context.Context()  # a new trace, not the claimer's current span
    return t.start_span(name, context=parent_ctx, kind=SpanKind.CONSUMER,
                        attributes=attrs, links=links or None)  # None: the SDK skips building a link list


# Links from a dependent's process span to its parents (issue 21). As each parent
# succeeds, the trigger job_dependencies_settle (migration 0009_unblock) appends the
# parent's stored enqueue traceparent to the waiting child's trace_context (the array
# PARENT_LINKS_KEY): the parent's process spans are children of that context, so the
# link leads to the trace the parent ran in, and the claim reads nothing more. At most
# PARENT_LINKS_MAX are stored (the SDK's default OTEL_SPAN_LINK_COUNT_LIMIT is 128, and a
# fan-in of 1,000 parents would otherwise store and send 1,000); the trigger counts the
# others in PARENT_LINKS_DROPPED_KEY, set on the span as pgworker.parent_links.dropped.
# The migration's 127 must equal this constant (a test checks).
PARENT_LINKS_MAX = 127  # plus the link to the job's own enqueue: 128 in all
PARENT_LINKS_KEY = "pgworker.parents"
PARENT_LINKS_DROPPED_KEY = "pgworker.parents_dropped"


def parent_links(stored: dict[str, Any]) -> list[Link]:
    """The links to a job's parents from its stored trace context (malformed entries skipped)."""
    out: list[Link] = []
    values = stored.get(PARENT_LINKS_KEY)
    if not isinstance(values, list):
        return out
    for tp in values[:PARENT_LINKS_MAX]:
        if not isinstance(tp, str):
            continue
        sc = trace.get_current_span(extract({"traceparent": tp})).get_span_context()
        if sc.is_valid:
            out.append(Link(sc, {"pgworker.link": "parent"}))
    return out


def attach(span: trace.Span) -> object | None:
    """Make ``span`` the current span (for the handler's own spans); returns the token to
    :func:`detach`, or None when the span is not recording (nothing to do)."""
    if not span.is_recording():
        return None
    return otel_context.attach(trace.set_span_in_context(span))


def detach(token: object | None) -> None:
    if token is not None:
        otel_context.detach(token)  # type: ignore[arg-type]


def record_outcome(span: trace.Span, outcome: str, exc: BaseException | None = None,
                   error_type: str | None = None) -> None:
    """Set pgworker.outcome and, for a failure, error.type (the class or code, never the
    message: messages and tracebacks may carry secrets) and an ERROR status."""
    if not span.is_recording():
        return
    span.set_attribute("pgworker.outcome", outcome)
    if outcome == "lost":
        span.set_attribute("error.type", LEASE_LOST)
        span.set_status(Status(StatusCode.ERROR, "lease lost: the outcome was not written"))
    elif exc is not None:
        # error.type only: exception messages and tracebacks may carry secrets
        span.set_attribute("error.type", error_type or type(exc).__qualname__)
        span.set_status(Status(StatusCode.ERROR, error_type or type(exc).__qualname__))


def settle_span(job: Any, operation: str, accepted: bool, *, parent: trace.Span | None,
                worker_id: str, start_time: int | None = None, overrun_seconds: float | None = None) -> None:
    """Emit the ``settle {queue}`` span of one attempt's fenced write (after the fact:
    outcomes are written in batches), as a child of the attempt's process span. That span
    has ended by now, so it no longer reports ``is_recording()``: its context decides.
    ``overrun_seconds``: for a refused write, how long the attempt ran past its lease's
    expiry (database clock), the duplicate-execution window it opened."""
    if parent is None or not parent.get_span_context().is_valid:
        return  # the attempt was not traced (tracing off): the cheap check first
    t = _active_tracer()
    if t is None:
        return
    attrs = _base(job.queue, "settle", operation)
    attrs.update({"messaging.message.id": str(job.id), "messaging.client.id": worker_id,
                  "pgworker.task": job.task, "pgworker.job.attempt": job.attempt,
                  "pgworker.lease.token": job.lease_token,
                  "pgworker.fence.result": "accepted" if accepted else "refused"})
    if not accepted:
        attrs["error.type"] = LEASE_LOST
    if overrun_seconds is not None:
        attrs["pgworker.lease.overrun_seconds"] = overrun_seconds
    span = t.start_span(f"settle {job.queue}", context=trace.set_span_in_context(parent),
                               kind=SpanKind.CLIENT, attributes=attrs, start_time=start_time)
    if not accepted:
        span.set_status(Status(StatusCode.ERROR, "lease lost: the write was refused by the fence"))
    span.end()


# Links per batched settle span: the SDK's default span link limit
# (OTEL_SPAN_LINK_COUNT_LIMIT); a larger batch is split so that no link is dropped.
SETTLE_LINKS_PER_SPAN = 128


def settle_spans(queue: str, operation: str, attempts: Sequence[tuple[Any, trace.Span]], *,
                 worker_id: str, start_time: int | None = None) -> None:
    """Trace one batched fenced write that the fence accepted for ``attempts`` (pairs of
    the job and its attempt's process span), all of ``queue`` and ``operation``.

    One attempt: its ``settle {queue}`` span is a child of the attempt's process span (see
    :func:`settle_span`), so a job whose outcome is written alone, the common case for
    jobs that run for more than a moment, has its settle in its own trace. Several: one
    ``settle {queue}`` span for the statement, a root with ``messaging.batch.message_count``
    and a link to each traced attempt's process span, as the messaging conventions do for
    batch operations (a span per attempt would double the cost of tracing a busy worker:
    the SDK spends tens of microseconds on each span). A refused write is traced per
    attempt by the caller, as an error child of its process span.
    """
    t = _active_tracer()
    if t is None or not attempts:
        return
    if len(attempts) == 1:
        job, span = attempts[0]
        settle_span(job, operation, True, parent=span, worker_id=worker_id, start_time=start_time)
        return
    contexts = [sc for _, span in attempts if (sc := span.get_span_context()).is_valid and sc.trace_flags.sampled]
    if not contexts:
        return  # no attempt of the batch was sampled: neither is its write
    for i in range(0, len(contexts), SETTLE_LINKS_PER_SPAN):
        chunk = contexts[i:i + SETTLE_LINKS_PER_SPAN]
        attrs = _base(queue, "settle", operation)
        attrs.update({"messaging.batch.message_count": len(chunk), "messaging.client.id": worker_id,
                      "pgworker.fence.result": "accepted"})
        t.start_span(f"settle {queue}", context=otel_context.Context(), kind=SpanKind.CLIENT,
                     attributes=attrs, links=[Link(sc) for sc in chunk], start_time=start_time).end()


def batch_span(kind: str, queue: str, count: int, **extra: Any) -> None:
    """Record a finished batch operation (renew, reap) as one span with its counts."""
    t = _active_tracer()
    if t is None:
        return
    op_type = "renew" if kind == "renew" else "reap"
    attrs = _base(queue, op_type, kind)
    attrs["messaging.batch.message_count"] = count
    attrs.update({f"pgworker.{k}": v for k, v in extra.items()})
    span_kind = SpanKind.CLIENT if kind == "renew" else SpanKind.INTERNAL
    span = t.start_span(f"{kind} {queue}", kind=span_kind, attributes=attrs,
                        context=otel_context.Context())
    if extra.get("lost"):
        span.set_attribute("error.type", LEASE_LOST)
    span.end()


def configure_from_env(service_name: str = "pgworker", *,
                       console_out: TextIO | None = None) -> trace.TracerProvider | None:
    """Set up an SDK tracer provider from the standard ``OTEL_*`` variables, if any.

    Returns the provider (flush it with ``force_flush()`` before exit), or None when no
    exporter is configured (``OTEL_TRACES_EXPORTER`` unset or 'none' and no OTLP
    endpoint), in which case spans stay non-recording and cost next to nothing.
    Exporters are loaded through the ``opentelemetry_traces_exporter`` entry points
    (``otlp`` needs ``pip install 'pgworker[otlp]'``; ``console`` is built in).
    ``console_out``: where the ``console`` exporter writes (default stdout; a one-shot
    command whose stdout is its result passes stderr).
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
        ep = eps.get(_otlp_entry_point(name) if name == "otlp" else name)
        if ep is None:
            log.warning("OTEL_TRACES_EXPORTER=%s: no such exporter installed (for otlp over HTTP: "
                        "pip install 'pgworker[otlp]'; over gRPC: pip install "
                        "opentelemetry-exporter-otlp-proto-grpc); traces for it are off", name)
            continue
        exporter_class = ep.load()
        exporter = exporter_class(out=console_out) if name == "console" and console_out else exporter_class()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def _otlp_entry_point(name: str) -> str:
    """The entry point that ``OTEL_TRACES_EXPORTER=otlp`` stands for. The specification's
    ``otlp`` means OTLP over the protocol ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` (else
    ``OTEL_EXPORTER_OTLP_PROTOCOL``) names, but only the gRPC package registers the name
    ``otlp``; the HTTP package, the one ``pgworker[otlp]`` installs, registers
    ``otlp_proto_http``: without this mapping ``otlp`` found nothing with that extra, and
    traces were off with one warning. The protocol defaults to http/protobuf (the
    specification's default), so the extra works with no other setting."""
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip().lower()
    return "otlp_proto_grpc" if protocol == "grpc" else "otlp_proto_http"


def instrument_psycopg() -> None:
    """Emit SQL child spans for psycopg (``--trace-sql``), to pgworker's tracer provider.

    Statements run under the current span: a claim's SQL is a child of its ``receive``
    span, a handler's SQL of its ``process`` span. Batched outcome writes serve many
    jobs at once and so appear as spans of their own.
    """
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    instr = PsycopgInstrumentor()
    if not instr.is_instrumented_by_opentelemetry:
        kwargs: dict[str, Any] = {"enable_commenter": False}
        if _tracer_provider is not None:
            kwargs["tracer_provider"] = _tracer_provider
        instr.instrument(**kwargs)


def setup_process(enabled: bool, *, trace_sql: bool = False, service_name: str = "pgworker",
                  console_out: TextIO | None = None) -> trace.TracerProvider | None:
    """Tracing for one pgworker process (the supervisor, or a claimer after spawn).

    ``enabled=False`` (``--no-tracing``) installs a no-op provider for pgworker's spans.
    Otherwise an SDK provider is built from the ``OTEL_*`` variables when they configure
    an exporter (see :func:`configure_from_env`, which ``console_out`` is passed to), and
    ``trace_sql`` turns on the psycopg instrumentation. Returns the provider to
    :func:`flush` before the process exits.
    """
    if not enabled:
        set_tracer_provider(trace.NoOpTracerProvider())
        return None
    provider = configure_from_env(service_name, console_out=console_out)
    if trace_sql:
        instrument_psycopg()
    return provider


def flush(provider: trace.TracerProvider | None, timeout_millis: int = 5000) -> None:
    """Export what ``provider`` (default: the one pgworker's spans go to, e.g. one the
    user's app module installed) still buffers, waiting at most ``timeout_millis``.
    Claimers and the supervisor call it before they exit rather than rely on the SDK's
    atexit hook, which does not run when a process ends through ``os._exit``."""
    if provider is None:
        provider = _tracer_provider if _tracer_provider is not None else trace.get_tracer_provider()
    if hasattr(provider, "force_flush"):
        try:
            provider.force_flush(timeout_millis)
        except Exception:
            log.exception("flushing traces failed")
