"""Preparer.many's shortcut for runs of jobs with the same options, the prebuilt JSON
encoder, and the batch encoding of pgworker.store.batch: each gives what the per-job
path gives."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from pgworker import InvalidJob, JobSpec, PayloadError
from pgworker.jobspec import Preparer, prepare, serialize_payload
from pgworker.store import batch
from pgworker.tasks import Task

NY = ZoneInfo("America/New_York")
# the two instants of New York's repeated hour on 2030-11-03 (equal as datetimes, PEP 495)
FOLD0 = datetime(2030, 11, 3, 1, 30, tzinfo=NY, fold=0)
FOLD1 = datetime(2030, 11, 3, 1, 30, tzinfo=NY, fold=1)


def varied_specs():
    task = Task("registered", lambda ctx, p: None, queue="q1", priority=2, max_attempts=3)
    return task, [
        JobSpec("t", 1), JobSpec("t", 2), JobSpec("t", {"a": [1]}, queue="x"), JobSpec("t", 3, queue="x"),
        JobSpec(task, 4), JobSpec(task, 5), JobSpec("registered", 6), JobSpec("t", 7, delay=5),
        JobSpec("t", 8, delay=5.0), JobSpec("t", 9, run_at=FOLD0), JobSpec("t", 10, run_at=FOLD1),
        JobSpec("t", 11, run_at=FOLD1), JobSpec("t", 12, depends_on=[1, 2]), JobSpec("t", 13, depends_on=[1, 2]),
        JobSpec("t", 14, dedupe_key="d", dedupe_window=60), JobSpec("t", 15, dedupe_key="d", dedupe_window=60),
        JobSpec("t", 16, ordering_key="k", ordering_on_dead="skip"), JobSpec("t", 17)]


def test_many_prepares_what_prepare_prepares_one_by_one():
    task, specs = varied_specs()
    tasks = {"registered": task}
    got = Preparer(tasks, 10_000).many(specs, any_task=True)
    want = [prepare(s._replace(depends_on=None), tasks, 10_000, any_task=True) for s in specs]
    assert got == want
    # the fall-back's two instants stay apart (equal datetimes, different UTC instants)
    assert got[9].run_at == FOLD0.astimezone(timezone.utc) != got[10].run_at == FOLD1.astimezone(timezone.utc)
    assert got[11].run_at == got[10].run_at


def test_many_refuses_a_bad_job_after_a_run_of_good_ones():
    specs = [JobSpec("t", i) for i in range(3)] + [JobSpec("t", {1, 2})]
    with pytest.raises(PayloadError):
        Preparer({}, 10_000).many(specs)
    with pytest.raises(PayloadError, match="over the limit"):
        Preparer({}, 20).many([JobSpec("t", "x"), JobSpec("t", "y" * 30)])


def test_a_failed_encoding_leaves_the_encoder_usable():
    """The prebuilt C encoder's circular-reference markers keep the containers of an
    encoding that failed midway: without its rebuild, the same list encoded again (now
    valid) was refused as circular."""
    payload = [1, [2], {3}]
    with pytest.raises(PayloadError, match="not JSON-serialisable"):
        serialize_payload(payload, 10_000)
    payload[2] = 3
    assert serialize_payload(payload, 10_000) == "[1,[2],3]"
    loop: list = []
    loop.append(loop)
    with pytest.raises(PayloadError):
        serialize_payload(loop, 10_000)
    assert serialize_payload({"é": "✓", "n": None, "f": 1.5}, 10_000) == '{"é":"✓","n":null,"f":1.5}'


def rows(specs):
    return Preparer({}, 10_000).many(specs)


def test_shapes_number_the_distinct_options_and_count_queues():
    jobs = rows([JobSpec("t", i, queue="a" if i % 3 else "b", priority=i % 2) for i in range(6)])
    found, of, counts = batch.shapes(jobs)
    assert [s[:3] for s in found] == [("b", "t", 0), ("a", "t", 1), ("a", "t", 0), ("b", "t", 1)]
    assert of == [1, 2, 3, 4, 3, 2] and counts == {"a": 4, "b": 2}
    one = rows([JobSpec("t", i) for i in range(4)])
    assert batch.shapes(one)[1:] == (None, {"default": 4})


def test_payloads_join_and_split_back_exactly():
    payloads = [{"k": "a\\tb\u001e"}, "x\ny", None, "\\"]  # an escaped U+001E is text, not the separator
    jobs = rows([JobSpec("t", p) for p in payloads])
    assert batch.joined_payloads(jobs).split(batch.SEPARATOR) == [j.payload_json for j in jobs]
    bad = [jobs[0]._replace(payload_json='"a\x1eb"')]
    with pytest.raises(InvalidJob, match="U\\+001E"):
        batch.joined_payloads(bad + jobs)


def test_copy_text_escapes_what_copy_would_read_otherwise():
    now = datetime(2030, 1, 2, 3, 4, 5, 6, tzinfo=timezone.utc)
    jobs = rows([JobSpec("t", {"p": "C:\\x"}), JobSpec("t", "tab\tnl\n", queue="b", delay=timedelta(seconds=90))])
    data, counts, due = batch.copy_text([10, 11], jobs, now, '{"traceparent":"x"}')
    lines = data.split("\n")
    assert lines[2:] == [""] and counts == {"default": 1, "b": 1} and due == {"default"}
    first = lines[0].split("\t")
    assert len(first) == len(batch.COPY_COLUMNS)
    assert first == ["10", "default", "t", "0", now.isoformat(), "5", '{"traceparent":"x"}', '{"p":"C:\\\\\\\\x"}']
    second = lines[1].split("\t")
    assert second[4] == (now + timedelta(seconds=90)).isoformat() and second[7] == '"tab\\\\tnl\\\\n"'
