"""docs/configuration.md: generated from Settings, the CLI's parser and the retry
defaults, current, and naming every PGWORKER_* variable the project reads."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pgworker import RetryPolicy, Settings, settings_docs

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"


def test_docs_configuration_md_is_generated_from_the_code():
    assert DOC.read_text() == settings_docs.render(), \
        "docs/configuration.md is stale: run `python -m pgworker.settings_docs > docs/configuration.md`"


def test_the_documented_command_prints_the_doc():
    out = subprocess.run([sys.executable, "-m", "pgworker.settings_docs"], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out == settings_docs.render()


def test_every_setting_has_help_a_unit_and_a_default():
    for f in dataclasses.fields(Settings):
        assert f.metadata.get("help", "").endswith("."), f"Settings.{f.name}: help= is missing or not a sentence"
        assert settings_docs.setting_unit(f) and settings_docs.setting_default(f)


def test_every_pgworker_variable_the_project_reads_is_documented():
    doc = DOC.read_text()
    sources = [*ROOT.joinpath("pgworker").rglob("*.py"), *ROOT.joinpath("tests").rglob("*.py"),
               *ROOT.joinpath("benchmarks").rglob("*.py"), *ROOT.joinpath("helm").rglob("*.yaml"),
               *ROOT.joinpath("helm").rglob("*.tpl"), ROOT / "Dockerfile", ROOT / ".ci" / "run"]
    names = set()
    for path in sources:
        if path.resolve() == Path(__file__).resolve():
            continue  # the made-up settings of the test below
        names |= set(re.findall(r"PGWORKER_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    assert len(names) > 40
    undocumented = sorted(n for n in names if f"`{n}`" not in doc)
    assert not undocumented, f"add them to Settings or to pgworker/settings_catalog.py: {undocumented}"


def test_the_retry_defaults_are_stated_from_the_policy():
    doc = settings_docs.render()
    p = RetryPolicy()
    for name, value in (("base_seconds", p.base_seconds), ("factor", p.factor), ("max_seconds", p.max_seconds),
                        ("jitter", p.jitter)):
        assert f"| `{name}` | {value:g} |" in doc
    assert "0.5-1 s, 1-2 s, 2-4 s, 4-8 s" in doc  # the waits of a job with the default 5 attempts
    assert "`retry` | `RetryPolicy()`" in doc


def test_a_setting_without_help_or_unit_fails_the_render():
    """A field added at the end of Settings without help= (or, for a number whose name
    does not say seconds or bytes, unit=) is caught here, not shipped undocumented."""

    @dataclasses.dataclass
    class Later:
        new_limit: int = dataclasses.field(default=3, metadata={"env": "PGWORKER_NEW_LIMIT", "parse": int})
        new_wait_seconds: float = dataclasses.field(default=1.0, metadata={
            "env": "PGWORKER_NEW_WAIT_SECONDS", "parse": float, "help": "How long."})

    limit, wait = dataclasses.fields(Later)
    with pytest.raises(ValueError, match="Settings.new_limit: give it help"):
        settings_docs.setting_row(limit, {})
    with pytest.raises(ValueError, match="Settings.new_limit: give its unit"):
        settings_docs.setting_unit(limit)
    assert settings_docs.setting_row(wait, {"new_wait_seconds": ["--new-wait"]}) == \
        "| `new_wait_seconds` | `PGWORKER_NEW_WAIT_SECONDS` | `--new-wait` | 1 | seconds | How long. |"


def test_no_default_is_written_in_scientific_notation():
    """The queues' audit-trail retention read "7.776e+06" seconds."""
    assert not re.findall(r"\| [-\d.]+e[+-]\d+ \|", settings_docs.render())
    assert "| 7,776,000 | seconds |" in settings_docs.render()
