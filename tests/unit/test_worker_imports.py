"""Issue 19: no import cycle inside pgworker/worker (an import inside a function counts:
it is a cycle the module merely defers), and no worker module over about 400 lines. The
modules are read, not imported, by the one reader of tests/unit/test_import_cycles.py
(whose rules say what counts as an edge)."""

from __future__ import annotations

import pathlib

import pytest
from test_import_cycles import cycles, import_graph

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = ROOT / "pgworker" / "worker"


def test_no_import_cycle_inside_the_worker_package():
    graph = {name: {m for m in imports if m.startswith("pgworker.worker")}
             for name, imports in import_graph().items() if name.startswith("pgworker.worker")}
    assert "pgworker.worker.shm.slots" in graph["pgworker.worker.supervisor.pool"] or \
        "pgworker.worker.shm.slots" in graph["pgworker.worker.renewer"]  # the reader sees imports at all
    assert cycles(graph) == []


def test_no_worker_module_is_over_about_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in WORKER.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 420}
    assert long == {}
