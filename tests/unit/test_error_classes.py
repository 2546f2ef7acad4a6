"""pgworker.error_classes: one error_class budget for every process of a pod, with real
processes sharing a real directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from pgworker.error_classes import BUDGET_FILE, ErrorClassBudget, clear

pytestmark = pytest.mark.unit

ADMIT = textwrap.dedent("""
    import json, sys
    from pgworker.error_classes import ErrorClassBudget
    budget = ErrorClassBudget(20, ("KNOWN",), "other", sys.argv[1])
    print(json.dumps({c: budget.label(c) for c in sys.argv[2:]}))
""")


def test_processes_share_one_budget(tmp_path):
    """Four processes at once, ten new classes each: 20 are admitted in all, every
    process agrees on which, and pgworker's own codes never count."""
    procs = [subprocess.Popen([sys.executable, "-c", ADMIT, str(tmp_path), "KNOWN",
                               *(f"P{p}C{c}" for c in range(10))], stdout=subprocess.PIPE, text=True)
             for p in range(4)]
    labels = {}
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        labels.update(json.loads(out))
    assert labels.pop("KNOWN") == "KNOWN"
    admitted = {c for c, label in labels.items() if label == c}
    assert len(admitted) == 20 and all(labels[c] == "other" for c in set(labels) - admitted)
    with open(tmp_path / BUDGET_FILE) as f:
        assert {json.loads(line) for line in f} == admitted
    # a later process (a recycled claimer) finds the budget spent, and the admitted classes
    later = ErrorClassBudget(20, ("KNOWN",), "other", str(tmp_path))
    assert later.label("NEW") == "other"
    assert all(later.label(c) == c for c in admitted)


def test_a_process_killed_holding_the_lock_wedges_nobody(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, sys, time
        f = open({str(tmp_path / BUDGET_FILE)!r}, "a+b")
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(b'"TORN')  # killed halfway through a line
        f.flush()
        print("locked", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(30)
    budget = ErrorClassBudget(2, (), "other", str(tmp_path))
    assert [budget.label(c) for c in ("A", "B", "C")] == ["A", "B", "other"]
    with open(tmp_path / BUDGET_FILE, "rb") as f:
        assert f.read() == b'"TORN\n"A"\n"B"\n'


def test_without_a_directory_the_budget_is_the_processs(tmp_path):
    budget = ErrorClassBudget(1, ("KNOWN",), "other")
    assert [budget.label(c) for c in ("KNOWN", "A", "B", "A")] == ["KNOWN", "A", "other", "A"]
    assert not (tmp_path / BUDGET_FILE).exists()
    clear(str(tmp_path))  # nothing to forget: no error
