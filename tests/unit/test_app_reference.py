"""`--app` references a new user gets slightly wrong: the error says which reference was
meant (the App's name after a colon; the module's App when the name is misspelt)."""

from __future__ import annotations

import sys

import pytest

from pgworker.errors import ConfigError
from pgworker.loader import load_app

pytestmark = pytest.mark.unit

TASKS = "import pgworker\n\napp = pgworker.App()\n\n\n@app.task(name='greet')\ndef greet(payload):\n    pass\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "refproj").mkdir()
    (tmp_path / "refproj" / "__init__.py").write_text("")
    (tmp_path / "refproj" / "tasks.py").write_text(TASKS)
    (tmp_path / "refproj" / "empty.py").write_text("X = 1\n")
    (tmp_path / "refproj" / "two.py").write_text("import pgworker\nfirst = pgworker.App()\nsecond = pgworker.App()\n")
    (tmp_path / "refproj" / "factory.py").write_text("import pgworker\n\n\ndef make_app():\n    return pgworker.App()\n")
    (tmp_path / "my tasks").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("refproj")]:
        del sys.modules[name]


@pytest.mark.parametrize("ref, meant", [
    ("refproj.tasks:ap", "module 'refproj.tasks' has no attribute 'ap'; this module's App: --app refproj.tasks:app"),
    ("refproj.empty:app", "has no attribute 'app'; it defines no pgworker.App"),
    ("refproj.tasks.app", "did you mean --app refproj.tasks:app?"),
    ("refproj/tasks.py", "did you mean --app refproj/tasks.py:app"),
    ("refproj.tasks", "did you mean --app refproj.tasks:app?"),  # a module: its App, not 'refproj:tasks'
    ("refproj.two", "did you mean --app refproj.two:first or --app refproj.two:second?"),
    ("refproj", "module 'refproj' defines no pgworker.App"),
    ("nosuchpkg.tasks", "'nosuchpkg.tasks' is not an importable module here either"),
])
def test_a_slightly_wrong_reference_names_the_one_meant(project, ref, meant):
    with pytest.raises(ConfigError) as refused:
        load_app(ref)
    assert meant in str(refused.value), refused.value


def test_the_reference_meant_loads(project):
    assert "greet" in load_app("refproj.tasks:app").tasks


@pytest.mark.parametrize("ref, meant", [
    # unquoted, a shell reads `(` as syntax and splits a path at its space (a new user's trial)
    ("refproj.factory:make_app", "call it: --app 'refproj.factory:make_app()'"),
    ("my tasks/tasks", "did you mean --app 'my tasks/tasks:app'"),
])
def test_a_reference_a_hint_prints_is_shell_quoted(project, ref, meant):
    with pytest.raises(ConfigError) as refused:
        load_app(ref)
    assert meant in str(refused.value), refused.value


def test_a_schema_flag_in_a_hint_is_shell_quoted():
    import shlex

    from pgworker.names import schema_flag

    assert schema_flag("pgworker") == "" and schema_flag("jobs_2") == " --schema jobs_2"
    assert shlex.split(schema_flag("my jobs")) == ["--schema", "my jobs"]
