"""Unit tier: no database."""

from __future__ import annotations

import math
import os
import re
from datetime import datetime, timedelta

import pytest

from pgworker import InvalidJob, InvalidName, PayloadError, Permanent, Retry, RetryPolicy, Settings
from pgworker.config import ConfigError
from pgworker.names import check_queue_name, check_schema_name, redact, redact_dsn
from pgworker.producer import JobSpec, prepare, serialize_payload
from pgworker.retry import classify
from pgworker.store import notify_channel

pytestmark = pytest.mark.unit


def test_backoff_grows_is_capped_and_jittered():
    p = RetryPolicy(base_seconds=1, factor=2, max_seconds=10, jitter=0.5)
    assert p.delay(1, rng=lambda: 0.0) == 1
    assert p.delay(3, rng=lambda: 0.0) == 4
    assert p.delay(30, rng=lambda: 0.0) == 10  # capped
    assert p.delay(30, rng=lambda: 1.0) == 5  # at most half taken off with jitter 0.5
    assert p.delay(10_000, rng=lambda: 0.0) == 10  # no overflow
    with pytest.raises(ValueError):
        RetryPolicy(jitter=2)


@pytest.mark.parametrize("fields, match", [
    ({"base_seconds": 10, "max_seconds": 1}, r"base_seconds \(10\) must be from 0 to max_seconds \(1\).*raise max_seconds"),
    ({"base_seconds": 5000}, r"base_seconds \(5000\) must be from 0 to max_seconds \(3600"),
    ({"max_seconds": 1e13}, r"max_seconds .* from 0 to 3,153,600,000 seconds \(100 years"),
    ({"max_seconds": -1}, "max_seconds"),
    ({"base_seconds": -1}, "base_seconds"),
    ({"factor": 0.5}, "factor must be >= 1"),
    ({"factor": float("inf")}, "factor must be a finite number, got inf"),
    ({"factor": True}, "factor must be a finite number, got True"),
    ({"jitter": 2}, "jitter is the fraction"),
    ({"jitter": -0.1}, "jitter is the fraction"),
    ({"jitter": True}, "jitter must be a finite number, got True"),
    ({"jitter": float("nan")}, "jitter must be a finite number, got nan"),
    ({"base_seconds": "5s"}, r"base_seconds must be a finite number \(a number, not a duration string\)"),
    ({"max_seconds": None}, "max_seconds must be a finite number, got None"),
])
def test_a_retry_policy_refuses_nonsense_naming_the_fix(fields, match):
    """A base above its cap, a cap of 300,000 years, a bool or NaN: refused when the policy
    is made, not found out at the first retry (before: accepted, or a bare TypeError)."""
    with pytest.raises(ConfigError, match=match):
        RetryPolicy(**fields)


def test_a_retry_policy_accepts_its_bounds():
    RetryPolicy(base_seconds=0, max_seconds=0, jitter=0)  # no backoff at all
    RetryPolicy(base_seconds=900, factor=1, max_seconds=900, jitter=1)  # a constant wait, full jitter
    top = RetryPolicy(base_seconds=1, max_seconds=100 * 365 * 86400)
    assert top.delay(10_000, rng=lambda: 0.0) == 100 * 365 * 86400


def test_classification_order():
    assert classify(Permanent("nope")).permanent
    assert classify(Retry(after=3)).retry_after == 3
    assert not classify(ValueError("x")).permanent
    assert classify(ValueError("x"), permanent_types=(ValueError,)).permanent
    assert classify(KeyError("x"), classifier=lambda e: True).permanent
    assert classify(SystemExit(3)).code == "SystemExit"
    assert classify(KeyboardInterrupt()).permanent is False


def test_error_message_is_bounded_printable_and_secret_free():
    exc = RuntimeError("connect to postgresql://app:hunter2@db/x failed " + "\x00\x07" + "y" * 5000)
    f = classify(exc, max_chars=200, secrets=["hunter2"])
    assert len(f.message) <= 200
    assert "hunter2" not in f.message and "\x00" not in f.message

    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert "Unprintable" in classify(Unprintable()).message


def test_redaction_covers_url_and_keyword_forms():
    assert "s3cret" not in redact_dsn("postgresql://u:s3cret@h:5432/db")
    assert "s3cret" not in redact_dsn("host=h password=s3cret dbname=x")
    assert "s3cret" not in redact("password='s3cret' host=h")
    assert redact_dsn("postgresql://u@h/db") == "postgresql://u@h/db"


@pytest.mark.parametrize("text", [
    "env PGPASSWORD=s3cret psql", "{'password': 's3cret', 'user': 'x'}", "DATABASE_PASSWORD=s3cret",
    'password="s3cret with spaces" host=x', "postgresql://u:s3c@ret@db:5432/x", '{"db_password": "s3cret"}',
    "postgresql://u@db/x?password=s3cret&sslmode=require", "Password: s3cret", "passwd=s3cret",
    # other secrets a handler's HTTP or cloud client may put in an exception message
    "401 for https://api.x/v1?api_key=s3cret", "{'apiKey': 's3cret'}", "AWS_SECRET_ACCESS_KEY=s3cret",
    "client_secret: s3cret", '{"access_token": "s3cret"}', "headers={'Authorization': 'Bearer s3cretTOKEN123'}",
    "Authorization: Basic s3cretczNjcmV0", 'api_token = "s3cret"'])
def test_redaction_covers_the_forms_a_handler_error_may_hold(text):
    """Each once reached the stored error text or the logs (break-it trial): only the word
    'password' followed by '=' was recognised."""
    out = redact(text)
    assert "s3cret" not in out and "ret with spaces" not in out and "ret@db" not in out, out


def test_redaction_leaves_ordinary_text_alone():
    for text in ('FATAL:  password authentication failed for user "bob"', "see https://example.com/a@b",
                 "postgresql://u@h/db", "job 7 lease_token=3 refused", "token: 12 of 40",
                 "a secret of the trade", "Basic arithmetic"):
        assert redact(text) == text


@pytest.mark.parametrize("bad", ["", " q", "q ", "a\nb", "x" * 129, "tab\there", 42, None])
def test_invalid_queue_names_are_refused(bad):
    with pytest.raises(InvalidName):
        check_queue_name(bad)


@pytest.mark.parametrize("good", ["default", "emails.high", "q'; DROP TABLE jobs; --", "очередь", "x" * 128])
def test_queue_names_that_are_values_are_fine(good):
    assert check_queue_name(good) == good


@pytest.mark.parametrize("name", ["a,b", "emails=2", "x,"])
def test_a_queue_that_takes_jobs_cannot_hold_a_comma_or_an_equals_sign(name):
    """A break-it trial: enqueue(queue="a,b") was accepted, and no worker could select it
    (PGWORKER_QUEUES='a,b' is two queues; --queue-concurrency 'a,b=1' was refused): its
    jobs waited, and a drain run reported success. Enqueue, a task's and a schedule's queue
    refuse it, naming the fix; reads and operator commands still take an existing name."""
    import pgworker

    app = pgworker.App("postgresql://nobody@127.0.0.1:1/none")
    with pytest.raises(InvalidName, match=r"workers name their queues in lists such as PGWORKER_QUEUES='a,b' and "
                                          r"--queue-concurrency 'a=2', so no worker could select it; use another"):
        app.enqueue("t", None, queue=name, any_task=True)
    with pytest.raises(InvalidName, match="no worker could select it"):
        app.task(name="t2", queue=name)(lambda payload: None)
    with pytest.raises(InvalidName, match="no worker could select it"):
        app.periodic("t", "* * * * *", queue=name)
    assert check_queue_name(name) == name  # an existing queue's name, for reads and operators


@pytest.mark.parametrize("bad", ["", "x" * 64, "pg_jobs", "a\x00b"])
def test_invalid_schema_names(bad):
    with pytest.raises(InvalidName):
        check_schema_name(bad)


def test_notify_channel_fits_an_identifier():
    assert len(notify_channel("é" * 31).encode()) <= 63
    assert notify_channel("pgworker") == "pgworker.pgworker"


@pytest.mark.parametrize("payload, fragment", [
    ({1, 2}, "not JSON-serialisable"), (b"x", "not JSON-serialisable"), (math.nan, "NaN"),
    ({"a": float("inf")}, "NaN"), ("nul\x00", "NUL"), ("\ud800", "surrogate"),
])
def test_unstorable_payloads_name_the_fix(payload, fragment):
    with pytest.raises(PayloadError, match=fragment):
        serialize_payload(payload, 1 << 20)


def test_payload_size_limit_is_exact():
    at_limit = "x" * (100 - 2)  # two quotes
    assert serialize_payload(at_limit, 100)
    with pytest.raises(PayloadError, match="over the limit of 100"):
        serialize_payload(at_limit + "x", 100)


def test_escaped_backslash_u0000_text_is_not_a_nul():
    assert serialize_payload("\\u0000", 100)


def test_deep_nesting_is_refused_cleanly():
    deep: object = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(PayloadError, match="nested too deeply"):
        serialize_payload(deep, 1 << 30)


def test_job_options_are_checked_before_the_database():
    with pytest.raises(InvalidJob, match="max_attempts"):
        prepare(JobSpec("t", max_attempts=0), {}, 1024)
    with pytest.raises(InvalidJob, match="no time zone"):
        prepare(JobSpec("t", run_at=datetime.now()), {}, 1024)
    with pytest.raises(InvalidJob, match="not both"):
        prepare(JobSpec("t", run_at=datetime.now().astimezone(), delay=1), {}, 1024)
    with pytest.raises(InvalidJob, match="delay"):
        prepare(JobSpec("t", delay=-1), {}, 1024)
    with pytest.raises(InvalidJob, match="priority"):
        prepare(JobSpec("t", priority=10**6), {}, 1024)
    assert prepare(JobSpec("t", delay=timedelta(minutes=1)), {}, 1024).delay_seconds == 60


def test_settings_validate_and_read_the_environment():
    s = Settings.from_env(environ={"PGWORKER_QUEUES": "a, b", "PGWORKER_LEASE_SECONDS": "30"})
    assert s.queues == ("a", "b") and s.effective_renew_interval == 10
    with pytest.raises(ConfigError, match="PGWORKER_CONCURRENCY"):
        Settings.from_env(environ={"PGWORKER_CONCURRENCY": "many"})
    with pytest.raises(ConfigError, match="two renewal intervals"):
        Settings.from_env(environ={}, lease_seconds=10, renew_interval_seconds=6)
    assert "hunter2" not in str(Settings(dsn="postgresql://u:hunter2@h/d").describe())


def test_a_queue_list_of_separators_alone_is_refused_and_a_blank_one_is_not_set():
    """A break-it trial: `--queues ,` ran every queue of the app, as if not given."""
    import argparse

    from pgworker.cli.settings import _settings_overrides

    with pytest.raises(ConfigError, match=r"PGWORKER_QUEUES=', ,' is invalid: .*names no queue.*emails,reports"):
        Settings.from_env(environ={"PGWORKER_QUEUES": ", ,"})
    with pytest.raises(ConfigError, match=r"--queues ',' names no queue"):
        _settings_overrides(argparse.Namespace(queues=","))
    assert Settings.from_env(environ={"PGWORKER_QUEUES": " "}).queues == ()
    assert "queues" not in _settings_overrides(argparse.Namespace(queues=""))
    assert _settings_overrides(argparse.Namespace(queues="a,,b"))["queues"] == ("a", "b")
    # in Python: a string is read as the variable is (queues="emails" was six one-letter queues)
    assert Settings.from_env(environ={}, queues="emails").queues == ("emails",)
    assert Settings.from_env(environ={}, queues="emails, reports").queues == ("emails", "reports")
    assert Settings.from_env(environ={}, queues=["b", "a"]).queues == ("b", "a")
    with pytest.raises(ConfigError, match="queues ',' names no queue"):
        Settings.from_env(environ={}, queues=",")
    with pytest.raises(ConfigError, match="tuple or list of strings"):
        Settings.from_env(environ={}, queues=["a", 1])


@pytest.mark.parametrize("variable,value", [
    ("PGWORKER_LEASE_SECONDS", "nan"), ("PGWORKER_LEASE_SECONDS", "inf"), ("PGWORKER_RENEW_INTERVAL_SECONDS", "nan"),
    ("PGWORKER_SHUTDOWN_GRACE_SECONDS", "nan"), ("PGWORKER_STATEMENT_TIMEOUT_SECONDS", "1e308"),
    ("PGWORKER_LOCK_TIMEOUT_SECONDS", "inf"), ("PGWORKER_COMPLETION_FLUSH_SECONDS", "inf"),
    ("PGWORKER_POLL_INTERVAL_SECONDS", "nan"), ("PGWORKER_MAX_RUNTIME_SECONDS", "1e308"),
    ("PGWORKER_RETENTION_DEAD_SECONDS", "inf"), ("PGWORKER_CONCURRENCY", "100000"),
    ("PGWORKER_MAX_JOBS_PER_CHILD", "0"), ("PGWORKER_MAX_MEMORY_PER_CHILD_BYTES", "-1")])
def test_settings_refuse_non_finite_and_unbounded_values_at_start(variable, value):
    """NaN passes every comparison and infinity overflows the conversions: each once let a
    pod start and then crash a thread (the renewer, the flusher) or a claimer."""
    with pytest.raises(ConfigError, match=variable):
        Settings.from_env(environ={variable: value})


@pytest.mark.parametrize("variable,value", [
    ("PGWORKER_POLL_INTERVAL_SECONDS", "0"), ("PGWORKER_REAP_INTERVAL_SECONDS", "-1"),
    ("PGWORKER_SHUTDOWN_GRACE_SECONDS", "-1"), ("PGWORKER_MAX_BATCH_SIZE", "0"), ("PGWORKER_BATCH_SIZE", "500"),
    ("PGWORKER_MAX_PAYLOAD_BYTES", "1"), ("PGWORKER_ERROR_HISTORY_ENTRIES", "0"),
    ("PGWORKER_ERROR_MESSAGE_MAX_CHARS", "5"), ("PGWORKER_METRICS_PORT", "70000"),
    ("PGWORKER_SYNCHRONOUS_COMMIT", "sometimes"), ("PGWORKER_STATS_TIMEOUT_SECONDS", "0"),
    ("PGWORKER_MAX_RUNTIME_SECONDS", "0")])
def test_a_setting_out_of_range_names_its_variable_and_the_value(variable, value):
    """These said only "poll_interval_seconds must be > 0" (or less: "max_payload_bytes
    must be at least 2"), without the variable or flag to change."""
    with pytest.raises(ConfigError, match=variable) as refused:
        Settings.from_env(environ={variable: value})
    assert value in str(refused.value), refused.value


@pytest.mark.parametrize("argv,fix", [
    (["--poll-interval", "0"], "set --poll-interval or PGWORKER_POLL_INTERVAL_SECONDS"),
    (["--lease", "0.5s"], "set --lease or PGWORKER_LEASE_SECONDS"),
    (["--batch-size", "0"], "set --batch-size or PGWORKER_BATCH_SIZE"),
    (["--metrics-port", "70000"], "set --metrics-port or PGWORKER_METRICS_PORT"),
    (["--concurrency", "0"], "set --concurrency or PGWORKER_CONCURRENCY")])
def test_a_flag_out_of_range_is_named_beside_its_variable(argv, fix, capsys):
    """`pgworker run --lease 0.5s` said "set PGWORKER_LEASE_SECONDS": not what was typed."""
    from pgworker import cli

    app = os.path.join(os.path.dirname(os.path.dirname(__file__)), "apps", "acceptance_app.py") + ":app"
    assert cli.main(["run", "--app", app, "--dsn", "postgresql://nobody@127.0.0.1:1/none", *argv]) == 1
    err = capsys.readouterr().err
    assert fix in err, err


def test_quantity_words_a_count():
    from pgworker.names import quantity

    assert [quantity(n, "claimer") for n in (0, 1, 2)] == ["0 claimers", "1 claimer", "2 claimers"]
    assert quantity(1, "finished job") == "1 finished job" and quantity(3, "entry", "entries") == "3 entries"


def test_a_failed_attempts_traceback_follows_its_log_line_in_both_formats():
    import json
    import logging

    from pgworker.logs import JsonFormatter, TextFormatter
    from pgworker.worker.claimer.tracebacks import handler_traceback

    def handler(message):
        raise RuntimeError(message)

    message = "password=s3cret\nFORGED line"  # outside text: in the message, never in a frame
    try:
        handler(message)
    except RuntimeError as exc:
        tb = handler_traceback(exc)
    record = logging.LogRecord("pgworker.claimer", logging.WARNING, __file__, 1, "job 1 failed", None, None)
    record.traceback = tb
    text = TextFormatter().format(record)
    lines = text.splitlines()
    assert lines[0].endswith("job 1 failed") and lines[1] == "  Traceback (most recent call last):"
    assert any("in handler" in line for line in lines) and all(line.startswith("  ") for line in lines[1:])
    assert "s3cret" not in text and "FORGED" not in text  # frames only: the message is the line's, escaped
    assert json.loads(JsonFormatter().format(record))["traceback"] == tb


@pytest.mark.parametrize("options, fragment", [
    ({"timeout": "30s"}, "timeout must be seconds (a number, not a duration string)"),  # was a bare TypeError
    ({"timeout": float("nan")}, "timeout must be seconds"),
    ({"timeout": 0}, "timeout must be seconds"),
    ({"max_runtime": float("inf")}, "max_runtime must be seconds"),
    ({"max_runtime": True}, "max_runtime must be seconds"),
    ({"queue": ""}, "queue name is empty"),  # was silently the default queue
])
def test_task_options_are_checked_where_the_task_is_declared(options, fragment):
    from pgworker import App

    app = App("postgresql://nobody@127.0.0.1:1/none")
    with pytest.raises(Exception, match=re.escape(fragment)):
        app.task(name="t", **options)(lambda payload: None)
    assert "t" not in app.tasks


def _no_arguments():
    pass


def _three_required(payload, ctx, more):
    pass


def _required_keyword(payload, *, key):
    pass


@pytest.mark.parametrize("handler, options", [
    (_no_arguments, {}), (_three_required, {}), (_required_keyword, {}), (lambda payload: None, {"retry": 5})])
def test_a_handler_that_cannot_be_called_or_a_retry_that_is_no_policy_is_refused_at_declaration(handler, options):
    """Each was accepted, and every attempt of every job then failed (TypeError): a
    handler taking no payload, one wanting more than (payload, ctx), or retry=5 (meant
    as attempts)."""
    from pgworker import App

    app = App("postgresql://nobody@127.0.0.1:1/none")
    fix = "retry must be a pgworker.RetryPolicy" if options else "cannot be called as handler(payload) or"
    with pytest.raises(ConfigError, match=re.escape(fix)):
        app.task(name="t", **options)(handler)
    assert "t" not in app.tasks
    for fine in (lambda payload: None, lambda payload, ctx: None, lambda payload, ctx=None, extra=1: None,
                 lambda *args: None):
        app.task(name=f"t{id(fine)}")(fine)


def test_a_traceback_is_bounded_escaped_and_never_fails_the_outcome():
    """A break-it trial: a 30,000-character source line took redaction 38 s (a claimer
    past its timeout was killed, the job ended TIMEOUT); a file name with a line break
    forged log lines; a loader that raised while the frames were formatted killed the
    claimer (WORKER_DIED)."""
    import time

    from pgworker.worker.claimer.tracebacks import TRACEBACK_LINE_CHARS, handler_traceback

    long_line = "blob = " + repr("ab" * 15_000) + "; raise ValueError('long line')"
    namespace: dict = {}
    exec(compile("def f():\n    " + long_line + "\n", "/tmp/x\n2030-01-01 00:00:00,000 ERROR FORGED.py", "exec"),
         namespace)
    try:
        namespace["f"]()
    except ValueError as exc:
        started = time.process_time()
        tb = handler_traceback(exc)
        assert time.process_time() - started < 1.0  # CPU, not wall-clock: was 38 s
    assert all(len(line) <= TRACEBACK_LINE_CHARS + 2 for line in tb.splitlines()), tb
    assert "\nFORGED" not in tb and "\n2030" not in tb and "\\n2030-01-01" in tb, tb

    class Loader:
        def get_source(self, name):
            raise RuntimeError("the loader fails")

    namespace = {"__loader__": Loader(), "__name__": "virtmod"}
    exec(compile("def g():\n    raise ValueError('x')\n", "/nonexistent/virtmod.py", "exec"), namespace)
    try:
        namespace["g"]()
    except ValueError as exc:
        assert isinstance(handler_traceback(exc), str)  # no exception escapes


def test_an_unknown_task_close_to_a_registered_one_is_named_with_the_fix():
    """A misspelt name enqueued without the App (`pgworker enqueue send_emial`) died with
    "deploy a worker that has it, then replay the job": a replay only dies again."""
    from pgworker.worker.claimer.executor import unknown_task_message

    said = unknown_task_message("send_emial", ["ordered", "send_email", "slow"])
    assert "did you mean 'send_email'? then discard this job and enqueue that name" in said, said
    assert unknown_task_message("no.such.task", ["alpha", "beta"]) == (
        "no handler for task 'no.such.task' in this worker (registered: alpha, beta); deploy a worker that has "
        "it, then replay the job")


def test_an_unknown_setting_names_the_one_meant():
    """It said only "unknown settings: dns"."""
    with pytest.raises(ConfigError) as refused:
        Settings.from_env(environ={}, dns="postgresql://h/d", lease=30)
    assert "dns (did you mean dsn?)" in str(refused.value) and "lease (did you mean lease_seconds?)" in str(refused.value)


@pytest.mark.parametrize("dsn, shown, why", [
    # no password: the DSN whole (it was all asterisks), and the missing '//' named
    ("postgres:/127.0.0.1/x", "'postgres:/127.0.0.1/x'", "a URI starts postgresql:// or postgres:// (two slashes)"),
    # a URI libpq refused: its password masked all the same (it was printed in the clear)
    ("postgres:/u:s3cret@127.0.0.1/x", "'postgres:/u:********@127.0.0.1/x'", "(two slashes)"),
    ("u:s3cret@db/x", "'u:********@db/x'", "neither a URI (postgresql://...) nor key=value pairs"),
    ("host=h password=s3cret dbname", "'host=h password=******** dbname'", 'missing "=" after "dbname"'),
])
def test_a_malformed_dsn_is_shown_with_only_its_password_masked(dsn, shown, why, capsys):
    from pgworker.cli import main

    assert main(["jobs", "list", "--dsn", dsn]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: malformed DSN {shown}: ") and why in err, err
    assert "s3cret" not in err and err.count("\n") == 1, err  # one line
    assert "use a URI like postgresql://user@host:5432/db" in err and "key=value pairs like" in err


def test_one_line_keeps_the_sentences_of_a_multi_line_message_apart():
    from pgworker.names import one_line

    libpq = ('connection to server at "127.0.0.1", port 5999 failed: Connection refused\n'
             '\tIs the server running on that host and accepting TCP/IP connections?\n')
    assert one_line(libpq) == ('connection to server at "127.0.0.1", port 5999 failed: Connection refused; '
                               'Is the server running on that host and accepting TCP/IP connections?')
    assert one_line("a  b\n\n  c ") == "a b; c" and one_line("") == ""


def test_an_unknown_log_level_or_format_names_the_values_it_takes(monkeypatch):
    from pgworker.logs import setup_logging

    with pytest.raises(ConfigError, match=r"log level 'verbose' .* is not one of DEBUG, INFO, WARNING, ERROR"):
        setup_logging("verbose", "text")
    from pgworker.logs import log_level_number

    # the names the logging module knows, in any case, as numbers (uvicorn takes only those)
    assert [log_level_number(v) for v in ("warn", "FATAL", "notset", "Info", 15, "trace")] == [30, 50, 0, 20, 15, 5]
    monkeypatch.setenv("PGWORKER_LOG_FORMAT", "xml")
    with pytest.raises(ConfigError, match=r"log format 'xml' \(--log-format or PGWORKER_LOG_FORMAT\)"):
        setup_logging("info")


def test_a_traceback_line_cut_inside_a_password_keeps_none_of_it_and_dropped_frames_are_counted():
    """A source line of ~300 characters ending in a DSN was cut inside its password before
    redaction, so 'carol:LONGLINE' was logged and stored (a trial); 20 frames of a deep
    recursion read as the whole story."""
    from pgworker.worker.claimer.tracebacks import TRACEBACK_FRAMES, handler_traceback

    pad = " " * (300 - len("  raise RuntimeError('x');dsn='postgresql://carol:LONGLINE"))
    source = f"def f():\n    raise RuntimeError('x');{pad}dsn='postgresql://carol:LONGLINEPASSWORD@db/x'\n"
    namespace: dict = {}
    exec(compile(source, "/tmp/secret_line.py", "exec"), namespace)
    try:
        namespace["f"]()
    except RuntimeError as exc:
        tb = handler_traceback(exc)
    assert "LONGLINE" not in tb and "carol:" not in tb.replace("carol:********", ""), tb

    def deep(n):
        if n == 0:
            raise ValueError("bottom")
        deep(n - 1)
    try:
        deep(50)
    except ValueError as exc:
        tb = handler_traceback(exc)
    first = tb.splitlines()[0]
    assert first.startswith("… (") and first.endswith("outer frame(s) not shown)"), first
    assert tb.count("in deep") == TRACEBACK_FRAMES


def test_json_depth_matches_the_decoded_value_against_brackets_in_strings():
    """json_depth (the enqueue's nesting limit) against a recursive oracle on random JSON
    whose strings hold brackets, quotes and backslashes, ASCII-escaped or not."""
    import json
    import random

    from pgworker.jobspec import json_depth

    def depth(v: object) -> int:
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        return 0

    rng = random.Random(7)

    def value(levels: int) -> object:
        if levels == 0 or rng.random() < 0.2:
            return rng.choice([1, "x]", '{"', "\\", "é[", "\\\"]", None])
        if rng.random() < 0.5:
            return [value(levels - 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(["]", "a", "{", '"', "\\"]) + str(i): value(levels - 1) for i in range(rng.randint(0, 3))}

    for _ in range(2000):
        v = value(12)
        text = json.dumps(v, ensure_ascii=rng.random() < 0.5, separators=(",", ":"))
        assert json_depth(text, 500) == depth(v), text
    chain: list = []
    for _ in range(300):
        chain = [{"k": chain}]  # 601 levels
    assert json_depth(json.dumps(chain), 500) == 501  # stops at the limit


def test_an_empty_reason_is_a_short_default_not_the_docstring():
    """A break-it trial: Permanent("") (or None), Retry(reason="") and JobCancelled("")
    stored the class's whole docstring, usage example included, as the job's error."""
    import pgworker

    assert [str(e) for e in (Permanent(""), Permanent(None), Retry(reason=""), Permanent("  \n "))] == \
        ["permanent failure", "permanent failure", "retry requested", "permanent failure"]  # type: ignore[arg-type]
    said = str(pgworker.JobCancelled(""))
    assert said == "The job was cancelled while running; raise it from a handler to stop early.", said
    for cls in (pgworker.ConfigError, pgworker.InvalidName, pgworker.PayloadError, pgworker.LeaseLost):
        try:
            text = str(cls())
        except TypeError:  # takes arguments of its own
            continue
        assert "\n" not in text and len(text) < 200, (cls, text)


def test_prune_names_its_upper_bound():
    """A break-it trial: `pgworker prune --older-than 36501d` said "must be >= 0 seconds"."""
    import pgworker

    app = pgworker.App("postgresql://nobody@127.0.0.1:1/none")
    with pytest.raises(pgworker.ConfigError, match=r"from 0 seconds to 3,153,600,000 \(100 years\), got 3,153,686,400 s"):
        app.prune(36501 * 86400)
