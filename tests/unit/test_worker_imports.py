"""Issue 19: no import cycle inside pgworker/worker (an import inside a function counts:
it is a cycle the module merely defers). The modules are read, not imported."""

from __future__ import annotations

import ast
import pathlib

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = ROOT / "pgworker" / "worker"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, name: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out |= {f"{target}.{a.name}" for a in node.names}
    return {m for m in out if m in known and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_inside_the_worker_package():
    paths = {_module_name(p): p for p in WORKER.rglob("*.py")}
    known = set(paths)
    graph = {name: _imports(path, name, known) for name, path in paths.items()}
    assert "pgworker.worker.shm.slots" in graph["pgworker.worker.supervisor.pool"] or \
        "pgworker.worker.shm.slots" in graph["pgworker.worker.renewer"]  # the reader sees imports at all
    assert _cycles(graph) == []


def test_no_worker_module_is_over_about_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in WORKER.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 420}
    assert long == {}
