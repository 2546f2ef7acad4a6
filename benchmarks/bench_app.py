"""The App the benchmark runs under ``pgworker run``: one no-op task on the queue 'bench'.

Two things only a benchmark needs, both driven by environment variables the harness sets:

- ``BENCH_GATE_DIR``: every claimer process, once imported, writes ``ready-<pid>`` there
  and waits for a ``go`` file, so all claimers start claiming at the same moment and the
  measured rate is not that of the first claimer while the others are still spawning.
- ``BENCH_TRACING=sdk``: an OpenTelemetry SDK tracer provider at its default sampling
  (parent-based, always on) with a batch span processor and an exporter that discards
  the spans: every span is created, recorded, queued and exported, only not sent.
  (``OTEL_TRACES_EXPORTER=console`` with stdout to /dev/null is the other way the
  harness can turn tracing on.)
- ``BENCH_METRICS=off``: every pgworker metric call in this process does nothing, to
  measure what metrics cost (pgworker itself has no switch: its metrics are always on).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any, Sequence

import pgworker

app = pgworker.App()


@app.task(name="noop", queue="bench")
def noop(payload: Any) -> None:
    return None


def _install_sdk_tracing() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class DiscardingExporter(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(DiscardingExporter()))
    trace.set_tracer_provider(provider)


def _disable_metrics() -> None:
    import pgworker.metrics as metrics_mod

    class NullMetrics(metrics_mod.WorkerMetrics):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __getattribute__(self, name: str) -> Any:
            return _nothing

    null = NullMetrics()
    metrics_mod.process_metrics = lambda **kwargs: null  # type: ignore[assignment]


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _gate(folder: str) -> None:
    with open(os.path.join(folder, f"ready-{os.getpid()}"), "w"):
        pass
    go = os.path.join(folder, "go")
    deadline = time.monotonic() + 300
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.001)


if os.environ.get("BENCH_METRICS") == "off":
    _disable_metrics()
if os.environ.get("BENCH_TRACING") == "sdk":
    _install_sdk_tracing()
if os.environ.get("BENCH_GATE_DIR") and multiprocessing.current_process().name.startswith("pgworker-claimer"):
    _gate(os.environ["BENCH_GATE_DIR"])
