"""No import cycles in pgworker/: read every module's imports with ``ast`` and fail naming
each cycle as a chain of modules (a -> b -> a).

What counts as an edge, and why:

- ``import x.y`` and ``from x import y`` (relative ones resolved against the importing
  module's package); ``from pkg import name`` is an edge to ``pkg.name`` when that is a
  module, else to ``pkg`` (the name is an attribute of the package's ``__init__``).
- Imports inside functions count: a function-level import is a cycle postponed to the
  first call, not a cycle removed; it still means the two modules cannot be understood
  (or moved) one without the other.
- Imports under ``if TYPE_CHECKING:`` do not count: they never run, so they cannot
  deadlock or half-initialise a module; they only name types for mypy.
- Code under ``if __name__ == "__main__":`` does not count: it runs only when the file is
  executed as a script, as the module ``__main__``, a different module object from the
  one other modules import, so it cannot close a cycle.
- Importing a submodule also imports its parent packages; that implicit edge is not
  counted (every module would otherwise be in a cycle with a package ``__init__`` that
  re-exports anything).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pgworker

ROOT = Path(pgworker.__file__).parent


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("pgworker", *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_main_guard(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` that can run when the module is imported or
    its functions are called (TYPE_CHECKING and __main__ blocks skipped; their else
    branches kept)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and (_is_type_checking(node.test) or _is_main_guard(node.test)):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the pgworker modules it imports."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in mods else source for a in node.names]
            graph[mod].update(t for t in targets if t in mods and t != mod)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted, each
    given as its modules in order (a component is every module that can reach every other
    one of it: all the modules one cycle-breaking has to separate)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(components)


def _chain(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle from the component's first module back to itself (breadth first)."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return component  # unreachable for a strongly connected component


def test_the_reader_finds_a_cycle() -> None:
    # the checker itself: a cycle through a function-level import is found and named
    tree = ast.parse("import os\nif TYPE_CHECKING:\n    from . import b\ndef f():\n    from . import c\n")
    assert [type(n).__name__ for n in _imports(tree)] == ["Import", "ImportFrom"]
    graph = {"a": {"c"}, "c": {"a"}, "b": set()}
    assert cycles(graph) == [["a", "c"]] and _chain(graph, ["a", "c"]) == ["a", "c", "a"]


def test_pgworker_has_no_import_cycles() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles in pgworker/ (a shortest chain of each, then all its modules):\n" + "\n".join(
        f"  {' -> '.join(_chain(graph, c))}\n    {len(c)} modules: {', '.join(c)}" for c in found)


#: The modules the App is a façade over: they take what they need (the App's core, a
#: store, a connection, the task registry) and never the App.
BELOW_THE_APP = ("core", "producer", "jobspec", "dependencies", "lifecycle", "operations", "admin", "results",
                 "graphs", "declare", "aio", "context", "tasks", "schedules", "effects.connections",
                 "effects.steps", "effects.transaction", "effects.async_bridge")


def test_the_modules_below_the_app_do_not_import_it() -> None:
    # stricter than the cycle test: TYPE_CHECKING imports count too, since a module typed
    # against the App can reach into any of its attributes
    mods = _modules()
    offenders = {}
    for name in BELOW_THE_APP:
        path = mods[f"pgworker.{name}"]
        package = "pgworker.effects" if name.startswith("effects.") else "pgworker"
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
                source = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                found |= {source} | {f"{source}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        if {"pgworker.app", "pgworker.App"} & found:
            offenders[name] = sorted({"pgworker.app", "pgworker.App"} & found)
    assert not offenders, f"modules below the App import it (pass them the App's core instead): {offenders}"
