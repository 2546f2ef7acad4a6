"""The PromQL of docs/observability.md (pgworker.metrics_questions.QUESTIONS) through promtool
and against the metric catalogue; tests/acceptance/test_observability.py also runs each
query on a real Prometheus server scraping a real worker."""

from __future__ import annotations

import pytest

from deploytools import catalogue_errors, promtool_check_expressions

from pgworker.metrics_questions import QUESTIONS, all_queries

pytestmark = pytest.mark.deploy


def test_promtool_parses_every_documented_query(tmp_path):
    exprs = {str(i): expr for i, expr in enumerate(all_queries())}
    result = promtool_check_expressions(exprs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


@pytest.mark.parametrize("expr", all_queries())
def test_documented_query_uses_catalogued_metrics_and_labels(expr):
    assert not catalogue_errors(expr)


def test_the_common_questions_are_answered():
    questions = " ".join(q for q, _ in QUESTIONS).lower()
    for topic in ("keeping up", "die", "leases", "statistics"):
        assert topic in questions
