"""The type checker and the linter, as .ci/run runs them: mypy (strict, configured in
pyproject.toml) passes pgworker's public modules and an example user module clean, and
fails on a fixture with a planted error; ruff passes the repository."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from obs import strict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join("tests", "typing", "fixtures", "planted_error.py")


def require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        message = f"{module} is not installed (pip install -e '.[lint]')"
        if strict():
            pytest.fail(f"{message}; PGWORKER_STRICT=1 requires it", pytrace=False)
        pytest.skip(message)


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_mypy_passes_the_public_modules_and_a_user_module():
    require("mypy")
    done = mypy()  # the files and options of pyproject.toml's [tool.mypy]
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout


def test_mypy_fails_on_a_planted_error():
    require("mypy")
    done = mypy(FIXTURE)
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'planted_error.py:12: error: Incompatible types in assignment (expression has type "int", ' \
           'variable has type "str")' in done.stdout, done.stdout
    assert "missing library stubs or py.typed" not in done.stdout


def test_ruff_passes_the_repository():
    require("ruff")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "pgworker", "tests", "benchmarks"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_still_refuses_a_misspelt_public_name():
    require("mypy")
    done = mypy(os.path.join("tests", "typing", "fixtures", "misspelt_names.py"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'Module "pgworker" has no attribute "Tsak"' in done.stdout, done.stdout
    assert 'Module has no attribute "Ap"; maybe "App"?' in done.stdout, done.stdout


def test_mypy_refuses_a_payload_of_another_type_than_the_handlers():
    """Task.enqueue took ``payload: Any``: a dict for a dataclass task, a str for an int,
    a payload for a task that takes None, a misspelt TypedDict key passed mypy --strict
    (a trial). Task[P] takes P from the handler's payload parameter."""
    require("mypy")
    done = mypy(os.path.join("tests", "typing", "fixtures", "wrong_payloads.py"))
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert ('wrong_payloads.py:48: error: Argument 1 to "enqueue" of "Task" has incompatible type '
            '"dict[str, object]"; expected "Invoice"') in out, out
    assert 'wrong_payloads.py:49: error: Missing positional argument "payload" in call to "enqueue"' in out, out
    assert ('wrong_payloads.py:50: error: Argument 1 to "aenqueue" of "Task" has incompatible type "str"; '
            'expected "int"') in out, out
    assert 'wrong_payloads.py:51: error: No overload variant of "enqueue" of "Task" matches argument type "int"' \
        in out, out
    assert 'wrong_payloads.py:52: error: Extra key "too" for TypedDict "Receipt"' in out, out
    assert out.count(": error:") == 6, out


def test_mypy_refuses_misspelt_and_wrong_enqueue_options():
    """Task.enqueue/aenqueue and the Django helper took **options: Any: `dealy=5` and
    `on_conflict="explode"` passed mypy --strict and failed at run time (a trial)."""
    require("mypy")
    done = mypy(os.path.join("tests", "typing", "fixtures", "misspelt_options.py"))
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert 'misspelt_options.py:18: error: Unexpected keyword argument "dealy" for "enqueue" of "Task"' in out, out
    assert 'misspelt_options.py:19: error: Argument "on_conflict" to "aenqueue" of "Task" has incompatible type' in out
    assert 'misspelt_options.py:20: error: Argument "on_conflict" to "enqueue" of "App" has incompatible type' in out
    assert 'misspelt_options.py:21: error: Unexpected keyword argument "dealy" for "enqueue"' in out, out
