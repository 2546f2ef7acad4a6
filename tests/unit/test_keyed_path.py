"""The keyed-transition path (pgworker/store/keyed.py) is the only way to a statement that
can change which job heads an ordering key, and the head probe is written once."""

from __future__ import annotations

import re

import pytest

from pgworker import sql as sqlfiles
from pgworker.store import Store
from pgworker.store.keyed import KEYED_STATEMENTS, NOT_HEAD_CHANGING, PATH_STATEMENTS

# a statement that inserts, updates or deletes jobs (directly, or through the pruner's function)
_WRITES_JOBS = re.compile(r"(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+\{schema\}\.jobs\b|delete_finished_jobs\(",
                          re.IGNORECASE)


def test_every_statement_that_writes_jobs_is_keyed_or_says_why_it_changes_no_head():
    writers = {name for name, text in sqlfiles.query_templates().items() if _WRITES_JOBS.search(text)}
    unclassified = writers - KEYED_STATEMENTS - set(NOT_HEAD_CHANGING) - PATH_STATEMENTS
    assert not unclassified, (
        f"{sorted(unclassified)} write jobs: add each to KEYED_STATEMENTS (and run it through "
        "KeyedTransitions.keyed_plan) or to NOT_HEAD_CHANGING with the reason it cannot change a key's head")
    stale = (KEYED_STATEMENTS | set(NOT_HEAD_CHANGING)) - writers
    assert not stale, f"{sorted(stale)} are classified but write no jobs (renamed?)"
    assert not KEYED_STATEMENTS & set(NOT_HEAD_CHANGING)


@pytest.mark.parametrize("name", sorted(KEYED_STATEMENTS | PATH_STATEMENTS))
def test_the_store_refuses_a_keyed_statement_outside_the_path(name):
    store = Store("keyed_path_unit")
    with pytest.raises(RuntimeError, match="keyed_plan"):
        store._step(name, {})
    with pytest.raises(RuntimeError, match="keyed_plan"):
        store._exec(None, name, {})  # type: ignore[arg-type]  # refused before any connection is used


def test_the_head_probe_is_one_fragment_in_every_statement_that_decides_a_head():
    """ordering_keys_promote (which job to unblock) and the inserts (is a new job blocked)
    must agree on what heads a key: each holds the fragment word for word, and no other
    copy of its condition is left anywhere."""
    head = sqlfiles.query_fragments()["ordering_key_head"]
    templates = sqlfiles.query_templates()
    users = {name for name, text in templates.items() if head in text}
    assert users == {"ordering_keys_promote", "job_insert", "jobs_insert_many"}
    condition = "(o.state IN ('pending', 'running') OR (o.state = 'dead' AND o.dead_blocks_key))"
    for name, text in templates.items():
        assert text.count(condition) == (1 if name in users else 0), name
    assert all("{ordering_key_head}" not in text for text in templates.values())
