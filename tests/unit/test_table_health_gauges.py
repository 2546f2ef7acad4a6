"""The pgworker_table_* gauges from a table_health row: labels sanitised and bounded, the
age of a holder PostgreSQL records no time for, never vacuumed, and a table statement
that fails on its own (the queue gauges stay). The rows are what Store.queue_stats
returns; tests/integration/test_table_health.py reads them from a real PostgreSQL."""

from __future__ import annotations

import math
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pgworker import catalogue as cat
from pgworker.database_gauges import QueueStatsCollector, TableHealthGauges, holder_label
from pgworker.store import QueueStats

pytestmark = pytest.mark.unit

QUEUE_ROW = {"queue": "default", "due": 1, "scheduled": 0, "blocked": 0, "running": 0, "dead": 0,
             "oldest_due_age_seconds": 0.0, "oldest_dead_age_seconds": 0.0, "expired_leases": 0,
             "dead_blocked_keys": 0, "paused": False}


def table_row(**overrides):
    row = {"live_tuples": 10, "dead_tuples": 200, "last_vacuum_age_seconds": None,
           "last_autovacuum_age_seconds": 30.5, "size_bytes": 81920, "holder": "backend",
           "holder_name": "nightly-report", "holder_state": "idle in transaction", "horizon_xid": "1234",
           "lag_transactions": 500, "held_seconds": 42.0}
    row.update(overrides)
    return row


def samples(gauges: TableHealthGauges) -> dict[str, list[tuple[dict, float]]]:
    out: dict[str, list] = {}
    for family in gauges.families():
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def test_holder_labels_are_printable_ascii_bounded_and_one_line():
    assert holder_label("nightly-report") == "nightly-report"
    assert holder_label(None) == ""
    assert holder_label("idle in\ttransaction\n") == "idle in transaction"
    assert holder_label("café \x00report") == "caf? ?report"
    long = holder_label("x" * 500)
    assert long == "x" * cat.HOLDER_LABEL_MAX_CHARS


def test_a_row_becomes_one_series_per_gauge_with_the_holders_labels():
    g = TableHealthGauges()
    g.update(QueueStats([], table=table_row()))
    s = samples(g)
    labels = {"holder": "backend", "holder_name": "nightly-report", "holder_state": "idle in transaction"}
    assert s["pgworker_table_horizon_age_seconds"] == [(labels, 42.0)]
    assert s["pgworker_table_horizon_lag_transactions"] == [(labels, 500.0)]
    assert s["pgworker_table_dead_tuples"] == [({}, 200.0)]
    assert s["pgworker_table_live_tuples"] == [({}, 10.0)]
    assert s["pgworker_table_size_bytes"] == [({}, 81920.0)]
    # never vacuumed by hand: longer ago than any bound
    assert s["pgworker_table_last_vacuum_age_seconds"] == [({"vacuum": "manual"}, math.inf),
                                                           ({"vacuum": "auto"}, 30.5)]
    assert s["pgworker_table_stats_up"] == [({}, 1.0)]
    names = {m.name for m in cat.METRICS if m.name.startswith("pgworker_table_")}
    assert set(s) == names
    for name, series in s.items():
        assert {tuple(sorted(ls)) for ls, _ in series} == {tuple(sorted(cat.METRICS_BY_NAME[name].labels))}


def test_nothing_holding_the_horizon_reads_none_and_zero():
    g = TableHealthGauges()
    g.update(QueueStats([], table=table_row(holder=None, holder_name=None, holder_state=None, horizon_xid=None,
                                            lag_transactions=None, held_seconds=None)))
    none = {"holder": "none", "holder_name": "", "holder_state": ""}
    assert samples(g)["pgworker_table_horizon_age_seconds"] == [(none, 0.0)]
    assert samples(g)["pgworker_table_horizon_lag_transactions"] == [(none, 0.0)]


def test_without_a_recorded_time_the_age_counts_from_first_sight_of_the_same_holding():
    """A replication slot records no time, nor does another role's session to a role
    without pg_read_all_stats: the age is a lower bound, since this process first saw
    that holder hold the horizon at that xid."""
    g = TableHealthGauges()
    slot = dict(holder="replication_slot", holder_name="standby_one", holder_state="active", held_seconds=None)
    g.update(QueueStats([], table=table_row(**slot, horizon_xid="900")))
    first = samples(g)["pgworker_table_horizon_age_seconds"][0][1]
    assert 0 <= first < 0.5
    time.sleep(0.3)  # the age is the subject
    g.update(QueueStats([], table=table_row(**slot, horizon_xid="900")))
    assert samples(g)["pgworker_table_horizon_age_seconds"][0][1] >= first + 0.3
    # a failed scrape in between does not restart the count
    g.update([])
    g.update(QueueStats([], table=table_row(**slot, horizon_xid="900")))
    assert samples(g)["pgworker_table_horizon_age_seconds"][0][1] >= first + 0.3
    # the slot moved on to a newer xid: a new holding, counted anew
    g.update(QueueStats([], table=table_row(**slot, horizon_xid="950")))
    assert samples(g)["pgworker_table_horizon_age_seconds"][0][1] < 0.3


def test_a_failed_table_statement_leaves_the_queue_gauges_and_says_so(caplog):
    """Store.queue_stats runs the table statement in a savepoint: its failure comes back
    as table None and table_error, and only the pgworker_table_* gauges go."""
    def fetch(queues):
        return QueueStats([QUEUE_ROW], table_error="QueryCanceled")

    registry = CollectorRegistry()
    registry.register(QueueStatsCollector(fetch, lambda: ["default"], cache_seconds=0))
    text = generate_latest(registry).decode()
    found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert found["pgworker_queue_stats_up"] == 1
    assert registry.get_sample_value("pgworker_queue_jobs", {"queue": "default", "state": "due"}) == 1
    assert found["pgworker_table_stats_up"] == 0
    assert not [n for n in found if n.startswith("pgworker_table_") and n != "pgworker_table_stats_up"]
    assert "jobs table health query failed: QueryCanceled" in caplog.text


def test_a_failed_fetch_takes_both_down():
    def fetch(queues):
        raise OSError("unreachable")

    registry = CollectorRegistry()
    registry.register(QueueStatsCollector(fetch, lambda: ["default"], cache_seconds=0))
    assert registry.get_sample_value("pgworker_queue_stats_up") == 0
    assert registry.get_sample_value("pgworker_table_stats_up") == 0
    assert registry.get_sample_value("pgworker_table_dead_tuples") is None
