"""The App the benchmark runs under ``pgworker run``: one no-op task on the queue 'bench'.

What only a benchmark needs, both driven by environment variables the harness sets:

- ``BENCH_GATE_DIR``: every claimer process, once imported, writes ``ready-<pid>`` there
  and waits for a ``go`` file, so all claimers start claiming at the same moment and the
  measured rate is not that of the first claimer while the others are still spawning.
- ``BENCH_TRACING=sdk``: an OpenTelemetry SDK tracer provider at its default sampling
  (parent-based, always on) with a batch span processor and an exporter that discards
  the spans: every span is created, recorded, queued and exported, only not sent.
  (``OTEL_TRACES_EXPORTER=console`` with stdout to /dev/null is the other way the
  harness can turn tracing on.)
- ``BENCH_STARTUP_DIR`` (the start-up case): each claimer writes the wall-clock time of
  its first job to ``first-<pid>`` there; ``BENCH_JOB_MS``: each job sleeps that long
  (so that a run lasts until every claimer is up).
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


STARTUP_DIR = os.environ.get("BENCH_STARTUP_DIR")
JOB_SECONDS = float(os.environ.get("BENCH_JOB_MS") or 0) / 1000.0
_first_job_seen = False


def _first_job(folder: str) -> None:
    """Start-up case: the wall-clock time of this claimer's first job, in ``first-<pid>``."""
    global _first_job_seen
    _first_job_seen = True
    path = os.path.join(folder, f"first-{os.getpid()}")
    with open(path + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.replace(path + ".tmp", path)


if STARTUP_DIR or JOB_SECONDS:
    @app.task(name="noop", queue="bench")
    def noop(payload: Any) -> None:
        if STARTUP_DIR and not _first_job_seen:
            _first_job(STARTUP_DIR)
        if JOB_SECONDS:
            time.sleep(JOB_SECONDS)
else:
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
