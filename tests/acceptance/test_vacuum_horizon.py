"""The jobs table's health end to end: a session holds a REPEATABLE READ snapshot while
jobs flow through a real `pgworker run`; its /metrics, scraped over HTTP, names that
session as the holder of the vacuum horizon; a VACUUM cannot remove the dead rows; and
the three table alerts of grafana/alerts.yaml fire in a real Prometheus scraping that
worker."""

from __future__ import annotations

import os
import tempfile

import psycopg
import pytest
import requests
import yaml
from psycopg import sql

from obs import free_port, prometheus_server, series, total, wait_for_metrics, wait_ready
from pg import make_settings, own_database, wait_until
from worker import Worker

from pgworker import App

pytestmark = pytest.mark.acceptance

SCHEMA = "pgworker"
ALERTS = os.path.join(os.path.dirname(__file__), "..", "..", "grafana", "alerts.yaml")
FAST_STATS = {"PGWORKER_STATS_CACHE_SECONDS": "0.1"}
REPORT = "nightly-report"

#: What a test cannot wait for, per alert: its `for` becomes 0s and these bounds shrink
#: (each must occur exactly once in the expression). Every other part of the expression
#: (metrics, labels, aggregations, the other thresholds, such as 10,000 dead rows) is
#: the shipped rule's.
SHORTENED = {
    "PgworkerJobsTableHorizonHeld": {"> 1800": "> 10"},            # 30 minutes held
    "PgworkerJobsTableDeadTuplesNotReclaimed": {},                 # as shipped
    "PgworkerJobsTableNotVacuumed": {"pgworker_table_last_vacuum_age_seconds) > 3600":
                                     "pgworker_table_last_vacuum_age_seconds) > 5"},  # an hour
}


def shortened_rules(path: str) -> None:
    """The table alerts of grafana/alerts.yaml with SHORTENED applied, as a rule file."""
    with open(ALERTS) as f:
        groups = yaml.safe_load(f)["groups"]
    rules = []
    for rule in (r for g in groups for r in g["rules"] if r.get("alert") in SHORTENED):
        for old, new in SHORTENED[rule["alert"]].items():
            assert rule["expr"].count(old) == 1, (rule["alert"], old)
            rule["expr"] = rule["expr"].replace(old, new)
        rule["for"] = "0s"
        rules.append(rule)
    assert [r["alert"] for r in rules] == list(SHORTENED)
    with open(path, "w") as f:
        yaml.safe_dump({"groups": [{"name": "pgworker-table-shortened", "rules": rules}]}, f, sort_keys=False)


def table_lines(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("pgworker_table_"))


def horizon(text: str) -> tuple[dict[str, str], float]:
    [(labels, seconds)] = series(text, "pgworker_table_horizon_age_seconds")
    return labels, seconds


def test_a_held_horizon_is_named_in_a_real_scrape_and_fires_the_table_alerts_in_a_real_prometheus(pg_dsn):
    # a database of its own: the horizon is per database, and sessions of other tests (or
    # suites) sharing the server would otherwise hold it too
    with own_database(pg_dsn) as dsn:
        app = App(settings=make_settings(dsn, SCHEMA))
        app.migrate()
        port = free_port()
        with psycopg.connect(dsn, application_name=REPORT) as report, \
                Worker(dsn, SCHEMA, "--concurrency", "2", "--batch-size", "100", "--metrics-port", str(port),
                       "--metrics-host", "127.0.0.1", env=FAST_STATS, name="health") as w:
            report.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            report.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(SCHEMA))).fetchone()
            wait_ready(port)

            # 6,000 jobs through the worker: a claim and an outcome each, 12,000 dead rows
            # that the report's snapshot keeps VACUUM from removing
            app.enqueue_many([("noop", i) for i in range(6000)])
            text = wait_for_metrics(
                port, lambda t: total(t, "pgworker_jobs_finished_total", outcome="succeeded") == 6000
                and total(t, "pgworker_table_dead_tuples") >= 12000, 300, "6,000 jobs and their dead rows")
            labels, seconds = horizon(text)
            assert labels == {"holder": "backend", "holder_name": REPORT, "holder_state": "idle in transaction"}, \
                table_lines(text)
            assert seconds > 0 and total(text, "pgworker_table_horizon_lag_transactions") > 60
            assert total(text, "pgworker_table_stats_up") == 1 and total(text, "pgworker_table_size_bytes") > 0

            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("VACUUM {}.jobs").format(sql.Identifier(SCHEMA)))
            text = wait_for_metrics(
                port, lambda t: total(t, "pgworker_table_last_vacuum_age_seconds", vacuum="manual") < 60, 30,
                "the VACUUM to be recorded")
            assert total(text, "pgworker_table_dead_tuples") >= 12000, table_lines(text)

            with tempfile.TemporaryDirectory(prefix="pgworker-test-rules-") as tmp:
                rules = os.path.join(tmp, "table.rules.yaml")
                shortened_rules(rules)
                with prometheus_server(port, rule_files=[rules]) as prom:
                    def firing() -> dict[str, dict[str, str]] | None:
                        # jobs keep flowing: the dead rows grow, jobs finish
                        app.enqueue_many([("noop", i) for i in range(50)])
                        r = requests.get(prom.url("/api/v1/alerts"), timeout=10).json()
                        alerts = {a["labels"]["alertname"]: a["labels"] for a in r["data"]["alerts"]
                                  if a["state"] == "firing"}
                        return alerts if set(alerts) == set(SHORTENED) else None

                    alerts = wait_until(firing, 120, 1.0, message=lambda: f"the table alerts to fire; {prom.logs()}")
                    held = alerts["PgworkerJobsTableHorizonHeld"]
                    assert (held["holder"], held["holder_name"]) == ("backend", REPORT)
                    assert held["job"] == "pgworker" and held["severity"] == "warning"
                    assert alerts["PgworkerJobsTableDeadTuplesNotReclaimed"]["job"] == "pgworker"
                    assert alerts["PgworkerJobsTableNotVacuumed"]["job"] == "pgworker"
            report.rollback()

            # the snapshot gone, the next vacuum removes what it held back
            wait_for_metrics(port, lambda t: horizon(t)[0].get("holder_name") != REPORT, 30, "the horizon released")
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("VACUUM {}.jobs").format(sql.Identifier(SCHEMA)))
            wait_for_metrics(port, lambda t: total(t, "pgworker_table_dead_tuples") < 1000, 30,
                             "the dead rows removed")
            assert w.stop() == 0
        app.close()


def test_no_stats_turns_the_table_gauges_off_with_the_queue_statistics(app, pg_dsn):
    """--no-stats (PGWORKER_STATS=false) switches off the one collector that reads both."""
    port = free_port()
    with Worker(pg_dsn, app.settings.schema, "--concurrency", "1", "--no-stats", "--metrics-port", str(port),
                "--metrics-host", "127.0.0.1", name="nostats") as w:
        wait_ready(port)
        text = wait_for_metrics(port, lambda t: "pgworker_build_info" in t, 30, "the exposition")
        assert not [line for line in text.splitlines()
                    if line.startswith(("pgworker_table_", "pgworker_queue_"))], table_lines(text)
        assert w.stop() == 0
