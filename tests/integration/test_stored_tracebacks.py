"""A failed attempt keeps where the handler raised: the error history entry carries the
innermost frames of its traceback (bounded, redacted as the log's), beside the message.
A Permanent or Retry raised on purpose keeps none. The console shows it (tests/web)."""

from __future__ import annotations

import pytest

from pgworker import Permanent
from pgworker.testing import drain
from pgworker.worker.claimer.tracebacks import STORED_TRACEBACK_CHARS, TRACEBACK_FRAMES, stored_traceback

pytestmark = pytest.mark.integration


def _inner_failure(n: int) -> None:
    raise ValueError(f"upstream said no to {n}")


def _deep(n: int) -> None:
    if n == 0:
        raise RuntimeError("deep down " + "x" * 50)
    _deep(n - 1)


def test_a_failed_attempt_keeps_its_traceback_and_a_deliberate_one_does_not(app):
    @app.task(name="boom", max_attempts=1)
    def boom(payload, ctx):
        _inner_failure(payload)

    @app.task(name="deliberate", max_attempts=1)
    def deliberate(payload, ctx):
        raise Permanent("the input is wrong")

    @app.task(name="deep", max_attempts=1)
    def deep(payload, ctx):
        _deep(200)

    ids = [app.enqueue("boom", 7), app.enqueue("deliberate"), app.enqueue("deep")]
    result = drain(app)
    assert result.dead == 3
    boom_entry, deliberate_entry, deep_entry = (app.get_job(i)["errors"][-1] for i in ids)

    trace = boom_entry["traceback"]
    assert boom_entry["message"].endswith("upstream said no to 7")  # the message stays where it was
    assert "in boom" in trace and trace.rstrip().endswith('raise ValueError(f"upstream said no to {n}")')
    assert trace.index("in boom") < trace.index("in _inner_failure")  # innermost frame last
    assert trace.startswith('File "') and "pgworker/worker/claimer" not in trace  # the user's frames, from the handler
    assert "upstream said no" not in trace.replace('raise ValueError(f"upstream said no to {n}")', "")

    assert "traceback" not in deliberate_entry and deliberate_entry["code"] == "PERMANENT"

    kept = deep_entry["traceback"]  # 200 frames deep: the innermost ones
    assert kept.count("in _deep") == TRACEBACK_FRAMES
    assert kept.rstrip().endswith('raise RuntimeError("deep down " + "x" * 50)')


def test_a_long_traceback_keeps_its_innermost_whole_lines():
    lines = [f'File "/srv/app/module_{i}.py", line {i}, in f{i}\n  call_{i}({"y" * 250})' for i in range(40)]
    kept = stored_traceback("\n".join(lines))
    assert kept.startswith("… (outer frames cut)\n") and len(kept) <= STORED_TRACEBACK_CHARS + 30
    assert kept.endswith(lines[-1]) and "module_0.py" not in kept
    body = kept.split("\n", 1)[1]
    assert body.startswith(("File ", "  call_"))  # whole lines only
    assert stored_traceback("") is None and stored_traceback("File x") == "File x"


def test_jobs_show_prints_a_stored_traceback_as_lines(app, pg_dsn, capsys):
    from pgworker.cli import main

    @app.task(name="boom", max_attempts=1)
    def boom(payload, ctx):
        _inner_failure(payload)

    job = app.enqueue("boom", 3)
    assert drain(app).dead == 1
    flags = ["--dsn", pg_dsn, "--schema", app.settings.schema]
    assert main(["jobs", "show", str(job), *flags]) == 0
    out = capsys.readouterr().out
    record, _, printed = out.partition("\ntraceback of attempt 1 (innermost frame last):\n")
    assert '"traceback": "(printed below, attempt 1)"' in record and "\\n" not in record, record
    lines = printed.splitlines()
    assert lines[-1] == '    raise ValueError(f"upstream said no to {n}")', lines
    assert any(line.startswith('  File "') and line.endswith("in _inner_failure") for line in lines), lines
    assert main(["jobs", "show", str(job), "--json", *flags]) == 0  # scripts keep the stored text
    shown = __import__("json").loads(capsys.readouterr().out)
    assert shown["errors"][-1]["traceback"] == app.get_job(job)["errors"][-1]["traceback"]


class _UpstreamDown(Exception):
    pass


def _fetch(url: str) -> None:
    raise ConnectionError(f"cannot reach {url}")


def test_a_chained_exception_keeps_its_cause_first_as_python_prints_it(app):
    @app.task(name="chained", max_attempts=1)
    def chained(payload, ctx):
        try:
            _fetch("postgresql://svc:hunter2-secret@db.internal/app")
        except ConnectionError as exc:
            raise _UpstreamDown("the report service is down") from exc

    @app.task(name="during", max_attempts=1)
    def during(payload, ctx):
        try:
            {}["missing"]
        except KeyError:
            raise RuntimeError("while handling")  # noqa: B904 - the implicit chain is the case

    @app.task(name="suppressed", max_attempts=1)
    def suppressed(payload, ctx):
        try:
            {}["missing"]
        except KeyError:
            raise RuntimeError("on purpose") from None

    ids = [app.enqueue("chained"), app.enqueue("during"), app.enqueue("suppressed")]
    assert drain(app).dead == 3
    chained_trace, during_trace, suppressed_trace = (app.get_job(i)["errors"][-1]["traceback"] for i in ids)

    cause_at = chained_trace.index("ConnectionError: cannot reach postgresql://svc:********@db.internal/app")
    link_at = chained_trace.index("The above exception was the direct cause of the following exception:")
    assert chained_trace.index("in _fetch") < cause_at < link_at < chained_trace.rindex("in chained")
    assert "hunter2" not in chained_trace  # the cause's message is redacted as the log's
    assert chained_trace.rstrip().endswith('raise _UpstreamDown("the report service is down") from exc')
    assert "KeyError: 'missing'" in during_trace
    assert "During handling of the above exception, another exception occurred:" in during_trace
    assert "KeyError" not in suppressed_trace and "above exception" not in suppressed_trace


def test_a_cause_chain_is_bounded_and_a_cycle_ends():
    from pgworker.worker.claimer.tracebacks import CAUSE_LINKS, handler_traceback

    def raise_chain(n: int) -> None:
        if n == 0:
            raise ValueError("root")
        try:
            raise_chain(n - 1)
        except ValueError as inner:
            raise ValueError(f"level {n}") from inner

    try:
        raise_chain(10)
    except ValueError as exc:
        deep = exc
    trace = handler_traceback(deep)
    assert trace.count("direct cause") == CAUSE_LINKS and "ValueError: level 9" in trace
    assert "ValueError: root" not in trace  # beyond CAUSE_LINKS

    a, b = ValueError("a"), ValueError("b")
    a.__cause__, b.__cause__ = b, a
    try:
        raise a
    except ValueError as exc:
        assert handler_traceback(exc).count("direct cause") == 1  # b, then the cycle back to a ends


def _chained(message: str) -> str:
    from pgworker.worker.claimer.tracebacks import handler_traceback

    try:
        try:
            raise ValueError(message)
        except ValueError as exc:
            raise RuntimeError("could not load settings") from exc
    except RuntimeError as exc:
        return handler_traceback(exc)


def test_a_causes_message_is_redacted_before_its_line_breaks_are_escaped():
    """A break-it trial: escaped first, 'password:\\n  value' kept its value (the pattern's
    white space no longer matched the escaped break); a URL's password cut before its '@'
    at 1,000 characters kept its start; a cause whose __str__ raised SystemExit ended the
    claimer."""
    trace = _chained("invalid config near:\n  password:\n    hunter2YAML\n  Authorization: Bearer\n"
                     "    eyJhbGciOiJIUzI1NiJ9SECRET")
    assert "hunter2" not in trace and "eyJhbGci" not in trace, trace
    assert "password:\\n    ********\\n  Authorization: Bearer ********" in trace  # escaped, whole, not cut
    assert "abcdefghijklmnop" not in _chained("Bearer\nabcdefghijklmnopNL")
    assert "secret value" not in _chained("api_key:\n'quoted secret value'")
    cut = _chained("postgresql://u:pw" + "q" * 1200 + "@host/db")
    assert "pwqq" not in cut and "postgresql://u:********" in cut, cut

    class LoudStr(Exception):
        def __str__(self) -> str:
            raise SystemExit(3)

    from pgworker.worker.claimer.tracebacks import handler_traceback

    try:
        try:
            raise LoudStr()
        except LoudStr as exc:
            raise RuntimeError("outer") from exc
    except RuntimeError as exc:
        assert "LoudStr: <message could not be read>" in handler_traceback(exc)


def test_the_stored_message_survives_a_str_raising_system_exit_and_a_cut_url():
    from pgworker.retry import safe_message

    class LoudStr(Exception):
        def __str__(self) -> str:
            raise KeyboardInterrupt

    assert safe_message(LoudStr(), 100) == "<unprintable LoudStr>"
    said = safe_message(ValueError("postgresql://u:pw" + "q" * 5000 + "@host/db"), 1000)
    assert "pwqq" not in said and "postgresql://u:********" in said, said[:100]


def test_an_exception_groups_members_are_kept(app):
    """A break-it trial: an asyncio.TaskGroup's ExceptionGroup kept only its own frames,
    ending in asyncio's taskgroups.py: what the tasks raised was nowhere."""
    import asyncio

    async def fetch(n: int) -> None:
        raise ValueError(f"task {n} failed, api_key: sk-{n}-secret")

    @app.task(name="grouped", max_attempts=1)
    async def grouped(payload, ctx):
        async with asyncio.TaskGroup() as tg:
            for n in range(5):
                tg.create_task(fetch(n))

    job = app.enqueue("grouped")
    assert drain(app).dead == 1
    trace = app.get_job(job)["errors"][-1]["traceback"]
    assert "+---- sub-exception 1 of 5 ----" in trace and "+---- sub-exception 3 of 5 ----" in trace, trace
    assert "sub-exception 4" not in trace and "… (2 more sub-exception(s) not shown)" in trace
    assert "ValueError: task 0 failed, api_key: ********" in trace and "sk-0" not in trace
    assert 'raise ValueError(f"task {n} failed, api_key: sk-{n}-secret")' not in trace  # the source line, redacted
    assert "in fetch" in trace
