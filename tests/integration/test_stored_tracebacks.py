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
