"""The worker's start reads what `pgworker sql grants` gives from grants.sql itself
(pgworker.grants._checks), so a grant added there is checked at start without a second
list: every statement of every block must be readable, and read right."""

from __future__ import annotations

import pytest

from pgworker import grants


@pytest.mark.parametrize("kind", ["producer", "worker", "viewer"])
def test_every_grant_of_every_block_is_read(kind):
    checks = grants._checks(kind)
    statements = grants._blocks()[kind]
    assert checks and {template for _, template, _, _ in checks} >= {"{schema}"} | (
        {"{schema}.jobs"} if kind != "viewer" else set())
    # each statement gave at least one check (none was skipped by the reader)
    assert len(checks) >= len(statements)


def test_the_workers_grants_read_as_privileges_per_object_and_column():
    checks = set(grants._checks("worker"))
    assert ("schema", "{schema}", "USAGE", None) in checks
    assert ("table", "{schema}.jobs", "UPDATE", "lease_token") in checks
    assert ("table", "{schema}.queues", "SELECT", None) in checks  # two privileges in one GRANT
    assert ("table", "{schema}.queues", "UPDATE", "tokens_at") in checks
    assert ("sequence", "{schema}.jobs_id_seq", "USAGE", None) in checks
    assert ("function", "{schema}.bounded_append(jsonb, jsonb, integer)", "EXECUTE", None) in checks
    assert not any(obj == "{schema}.jobs" and priv == "DELETE" for _, obj, priv, _ in checks)


def test_a_statement_the_reader_does_not_know_is_refused(monkeypatch):
    monkeypatch.setattr(grants, "_blocks", lambda: {"worker": ["GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {worker}"]})
    with pytest.raises(ValueError, match="cannot read"):
        grants._checks("worker")


def test_a_timeout_setting_never_rounds_to_postgresqls_no_timeout():
    """PGWORKER_LOCK_TIMEOUT_SECONDS=0.0004 became '0ms': no timeout at all (a trial's
    `jobs list` then waited for ever behind a lock)."""
    from pgworker.db import milliseconds

    assert [milliseconds(s) for s in (0.0004, 0.001, 0.5, 5, 30.25)] == ["1ms", "1ms", "500ms", "5000ms", "30250ms"]
