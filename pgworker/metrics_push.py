"""Drain-mode reporting: a ``--drain`` run is too short to be scraped, so at exit it
pushes its summary to a Prometheus Pushgateway (when ``--pushgateway-url`` is set)."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

from . import catalogue as cat

PUSH_JOB = "pgworker_drain"


def push_drain_summary(url: str, summary: Any, schema: str, timeout_seconds: float = 10.0) -> None:
    """Push the drain gauges of ``summary`` to the Pushgateway at ``url`` (grouped by
    schema, replacing the previous run's group). Raises on an HTTP or network error."""
    registry = CollectorRegistry()
    d = cat.METRICS_BY_NAME
    last = Gauge("pgworker_drain_last_run_timestamp_seconds",
                 d["pgworker_drain_last_run_timestamp_seconds"].help, ["result"], registry=registry)
    last.labels(summary.result).set(time.time())  # when it ended: wall-clock time, as a timestamp is
    Gauge("pgworker_drain_duration_seconds", d["pgworker_drain_duration_seconds"].help,
          registry=registry).set(summary.duration_seconds)
    processed = Gauge("pgworker_drain_jobs_processed", d["pgworker_drain_jobs_processed"].help,
                      ["outcome"], registry=registry)
    for outcome, n in summary.counts.items():
        processed.labels(outcome).set(n)
    Gauge("pgworker_drain_jobs_left", d["pgworker_drain_jobs_left"].help, registry=registry).set(summary.left)
    push_to_gateway(url, job=PUSH_JOB, registry=registry, grouping_key={"schema": schema},
                    timeout=timeout_seconds)
