"""What the README and docs/ say against what exists: RetryPolicy calls written with its
real parameter names, tables whose every row renders as one (a row after a paragraph is
text), no "no bulk discard" beside the console's "Discard all", `run --queues`'s help
naming the `default` queue the worker also claims, and no denial of the cancel commands'
--reason."""

from __future__ import annotations

import re
from pathlib import Path

import pgworker
from pgworker.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line number, line) outside code fences."""
    out, fence = [], False
    for n, line in enumerate(path.read_text().split("\n"), 1):
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            out.append((n, line))
    return out


def test_every_retry_policy_call_in_the_docs_builds_one():
    calls = [(p.name, m.group(0)) for p in DOCS for m in re.finditer(r"RetryPolicy\([^()`]*\)", p.read_text())]
    assert calls
    for name, call in calls:
        if "..." in call:
            raise AssertionError(f"{name}: {call} names no parameters; write the real ones (base_seconds, ...)")
        eval(call, {"RetryPolicy": pgworker.RetryPolicy})  # a wrong keyword raises TypeError


def test_a_table_row_follows_a_table_row_or_starts_a_table():
    for path in DOCS:
        lines = _prose(path)
        for i, (n, line) in enumerate(lines):
            before = lines[i - 1][1] if i else ""
            after = lines[i + 1][1] if i + 1 < len(lines) else ""
            if line.startswith("|") and before.strip() and not before.startswith("|"):
                assert re.match(r"^\|[-:| ]+\|$", after), f"{path.name}:{n}: a table row after a paragraph: {line[:60]}"


def test_the_docs_do_not_deny_the_consoles_bulk_discard():
    templates = (Path(pgworker.__file__).parent / "web" / "templates")
    assert "Discard all" in (templates / "dead.html").read_text()
    for path in DOCS:
        assert "no bulk discard" not in path.read_text(), path.name


def test_run_queues_help_names_the_default_queue():
    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    [queues] = [a for a in run._actions if "--queues" in a.option_strings]
    assert '"default" and the queues' in queues.help


def test_the_docs_do_not_deny_the_cancel_commands_reason():
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    graphs_cancel = commands["graphs"]._subparsers._group_actions[0].choices["cancel"]
    for parser in (commands["cancel"], graphs_cancel):
        assert any("--reason" in a.option_strings for a in parser._actions)
    for path in DOCS:
        text = " ".join(path.read_text().split())  # a phrase broken across lines is found too
        for denial in ("There is no `--reason`", "records no reason anywhere"):
            assert denial not in text, f"{path.name}: {denial!r}, but cancel and graphs cancel take --reason"
