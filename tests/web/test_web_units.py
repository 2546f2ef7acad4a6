"""The console's pieces without a database: the job filter, redaction, CSRF tokens, the
credentials and the permission rule, the same-site check, the chart, the settings."""

from __future__ import annotations

import re
import base64
from datetime import datetime, timedelta, timezone

import pytest

from pgworker.errors import ConfigError
from pgworker.jobfilter import FilterError, JobFilter
from pgworker.web import chart, security
from pgworker.web.auth import ADMIN, OPERATOR, VIEWER, Credentials, Principal, role_permits
from pgworker.web.config import WebConfig
from pgworker.web.render import age, capped, pretty, redact

pytestmark = pytest.mark.unit
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def test_the_filter_reads_what_an_operator_types():
    f = JobFilter.parse({"queue": " emails ", "state": "dead", "task": "send", "error_code": "TIMEOUT",
                         "created_after": "2h", "created_before": "2026-12-01T11:30", "payload": "order.id=7",
                         "dedupe_key": "", "ordering_key": None}, now=NOW)
    assert f.queue == "emails" and f.state == "dead" and f.dedupe_key is None and f.ordering_key is None
    assert f.created_after == NOW - timedelta(hours=2)
    assert f.created_before == datetime(2026, 12, 1, 11, 30, tzinfo=timezone.utc)
    assert f.payload == {"order": {"id": 7}}
    assert JobFilter.parse({"payload": '{"user": "u1", "n": [1]}'}).payload == {"user": "u1", "n": [1]}
    assert JobFilter.parse({"payload": "name=Ada Lovelace"}).payload == {"name": "Ada Lovelace"}
    assert JobFilter.from_json(f.to_json()) == f
    assert f.describe().startswith("queue emails, state dead, task send")
    assert JobFilter().empty and JobFilter().describe() == "every job"


def test_the_filter_reads_a_graph_id():
    """A graph (the jobs linked by depends_on, jobs.graph_id) is a filter key like the
    others: an id as text from a form, an int from Python or a recorded filter."""
    f = JobFilter.parse({"graph": " 56 ", "state": "dead"})
    assert f.graph == 56 and f.to_json() == {"state": "dead", "graph": 56}
    assert f.query() == {"state": "dead", "graph": "56"} and f.describe() == "state dead, graph 56"
    assert JobFilter.from_json(f.to_json()) == f and JobFilter.parse({"graph": 7}).graph == 7
    assert JobFilter.parse({"graph": ""}).graph is None and not f.replace(state=None).empty


@pytest.mark.parametrize("params, fix", [
    ({"state": "done"}, "use one of pending"),
    ({"payload": "[1, 2]"}, "neither a JSON object nor key=value"),
    ({"payload": "{not json"}, "not valid JSON"),
    ({"payload": "=3"}, "neither a JSON object nor key=value"),
    ({"payload": "a..b=1"}, "empty part"),
    ({"payload": "x" * 5000}, "the limit is 4,096"),
    ({"created_after": "yesterday"}, "an age (15m, 2h, 7d"),
    ({"queue": "x" * 200}, "the limit is 128"),
    ({"task": "tab\tbed"}, "non-printable"),
    ({"graph": "abc"}, "write ids as plain digits 0-9"),
    ({"graph": "\u0661\u0662"}, "write ids as plain digits 0-9"),
    ({"graph": "-4"}, "write ids as plain digits 0-9"),
    ({"graph": "0"}, "out of range: ids are 1 to 2"),
    ({"graph": str(2**63)}, "out of range: ids are 1 to 2"),
    ({"graph": True}, "a graph id is an int"),
])
def test_a_filter_it_cannot_use_is_refused_with_the_fix(params, fix):
    with pytest.raises(FilterError, match=re.escape(fix)):
        JobFilter.parse(params)


def test_redaction_at_any_depth_and_bounded_payloads():
    payload = {"user": "u1", "password": "p", "nested": {"Stripe-Api-Key": "k", "items": [{"card_number": "4"}]},
               "db_password": "x", "tokens_used": 5}
    shown = redact(payload, ("password", "api_key", "card_number", "token"))
    assert shown == {"user": "u1", "password": "[redacted]", "nested": {"Stripe-Api-Key": "[redacted]",
                     "items": [{"card_number": "[redacted]"}]}, "db_password": "[redacted]", "tokens_used": 5}
    assert payload["password"] == "p"  # the job's own value is untouched
    text = pretty({"blob": "y" * 50_000}, max_chars=1000)
    assert len(text) < 1100 and "more characters not shown" in text


def test_csrf_tokens_are_bound_to_a_name_and_expire():
    secret = b"s" * 32
    token = security.csrf_token(secret, "alice", now=1_000_000)
    assert security.csrf_valid(secret, "alice", token, now=1_000_100)
    assert not security.csrf_valid(secret, "bob", token, now=1_000_100)
    assert not security.csrf_valid(b"t" * 32, "alice", token, now=1_000_100)
    assert not security.csrf_valid(secret, "alice", token, now=1_000_000 + security.CSRF_MAX_AGE_SECONDS + 1)
    for bad in (None, "", "abc", "x.y", "1." + "0" * 64, token + "0"):
        assert not security.csrf_valid(secret, "alice", bad, now=1_000_100)


def test_the_same_site_check():
    assert security.same_site({"sec-fetch-site": "same-origin"}, "h:1")
    assert security.same_site({}, "h:1")  # a script: its credentials decide
    assert security.same_site({"origin": "http://h:1"}, "h:1")
    for headers in ({"sec-fetch-site": "cross-site"}, {"sec-fetch-site": "same-site"},
                    {"origin": "https://evil.example"}, {"origin": "null"}):
        assert not security.same_site(headers, "h:1"), headers


def test_credentials_and_roles():
    creds = Credentials("alice:operator:alice-password-1\nvera:viewer:vera-password-12",
                        "ci:admin:token-0123456789", failures=2, window=60)
    basic = "Basic " + base64.b64encode(b"alice:alice-password-1").decode()
    assert creds.check(basic) == Principal("alice", OPERATOR, ambient=True)
    assert creds.check("Bearer token-0123456789") == Principal("ci", ADMIN, ambient=False)
    for wrong in ("Basic " + base64.b64encode(b"alice:vera-password-12").decode(), "Bearer nope", "Basic !!",
                  "Digest x", None, ""):
        assert creds.check(wrong) is None
    assert creds.blocked_for("1.2.3.4") == 0
    creds.failed("1.2.3.4")
    creds.failed("1.2.3.4")
    assert creds.blocked_for("1.2.3.4") > 0 and creds.blocked_for("5.6.7.8") == 0
    assert role_permits(Principal("v", VIEWER), "view") and not role_permits(Principal("v", VIEWER), "replay")
    assert role_permits(Principal("o", OPERATOR), "bulk") and not role_permits(Principal("o", OPERATOR), "set_limits")
    assert role_permits(Principal("a", ADMIN), "set_limits") and not role_permits(Principal("a", ADMIN), "rm -rf")


@pytest.mark.parametrize("text, fix", [
    ("alice:operator", "not name:role:secret"), ("alice:root:long-enough-pass", "use one of viewer"),
    ("alice:viewer:short", "shorter than 12"),
])
def test_bad_credentials_are_refused_without_echoing_the_secret(text, fix):
    with pytest.raises(ConfigError, match=fix) as info:
        Credentials(text)
    assert "long-enough-pass" not in str(info.value) and "short" not in str(info.value).replace("shorter", "")


def test_settings_refuse_nonsense_with_the_variable():
    with pytest.raises(ConfigError, match="trace_id"):
        WebConfig(trace_url="https://jaeger/trace/")
    with pytest.raises(ConfigError, match="PGWORKER_WEB_READ_ONLY"):
        WebConfig.from_env({"PGWORKER_WEB_READ_ONLY": "maybe"})
    with pytest.raises(ConfigError, match="shorter than 16"):
        WebConfig.from_env({"PGWORKER_WEB_SECRET": "short"})
    with pytest.raises(ConfigError, match="PGWORKER_WEB_SCAN_ROWS"):
        WebConfig.from_env({"PGWORKER_WEB_SCAN_ROWS": "lots"})
    cfg = WebConfig.from_env({"PGWORKER_WEB_READ_ONLY": "true", "PGWORKER_WEB_REDACT_KEYS": "pin, otp",
                              "PGWORKER_WEB_SECRET": "a-secret-of-enough-length"})
    assert cfg.read_only and cfg.redact_keys == ("pin", "otp") and cfg.secret == b"a-secret-of-enough-length"


def test_the_chart_and_the_formats():
    rows = [{"state": "succeeded", "queue": "q", "minutes_ago": 0, "jobs": 5},
            {"state": "dead", "queue": "q", "minutes_ago": 59, "jobs": 2},
            {"state": "succeeded", "queue": "other", "minutes_ago": 3, "jobs": 9}]
    buckets = chart.per_minute(rows, "q")
    assert buckets[-1]["succeeded"] == 5 and buckets[0]["dead"] == 2 and sum(b["succeeded"] for b in buckets) == 5
    svg = str(chart.svg(buckets, label="<q>"))
    assert svg.startswith("<svg") and "&lt;q&gt;" in svg and "<script" not in svg
    assert chart.covered_minutes(rows, limit=5) == 3 and chart.covered_minutes(rows, limit=100) is None
    assert (age(4), age(200), age(7300), age(None)) == ("4s", "3m 20s", "2h 1m", "-")
    assert capped(10_000, 10_000) == "10,000+" and capped(42, 10_000) == "42"


def test_a_time_stored_as_text_reads_as_the_pages_others_and_never_fails_the_page():
    from pgworker.web.render import dt

    assert dt("2026-12-05T10:24:35.390848+00:00") == "2026-12-05 10:24:35Z"
    assert dt("2026-12-05T11:24:35+01:00") == "2026-12-05 10:24:35Z"
    assert dt("2026-12-05T10:24:35") == "2026-12-05 10:24:35"  # no zone: not claimed to be UTC
    assert dt("0001-01-01T00:00:00+01:00") == "0001-01-01 00:00:00+01:00"  # before UTC's year 1
    assert dt("not a time") == "not a time" and dt(None) == "-"


def test_the_runs_of_an_error_history_are_found_whatever_was_written():
    from pgworker.web.pages.job import attempt_runs

    history = [{"attempt": 1}, {"attempt": 2}, {"attempt": 1}, {"attempt": "2"}]
    assert [(e.get("attempt"), e["earlier_run"]) for e in attempt_runs(history)] == [
        ("2", False), (1, False), (2, True), (1, False)]
    odd = attempt_runs([{"attempt": None}, "a bare string", {"attempt": [1]}, {"attempt": 10**400}, 7])
    assert [e["earlier_run"] for e in odd] == [False] * 5 and odd[3]["message"] == "a bare string"
    assert attempt_runs(None) == []
    # a history that is not a list (written by hand, or JSON Python cannot decode) is shown, not hidden
    assert attempt_runs({"not": "a list"}) == [{"message": "{'not': 'a list'}", "earlier_run": False}]
    from pgworker.jobs import UndecodablePayload
    [shown] = attempt_runs(UndecodablePayload("nested too deeply", 6000))
    assert shown["message"] == "<undecodable JSON of 6000 bytes: nested too deeply>"
