"""The console's graph filter (`/jobs?graph=ID`, `/api/jobs?graph=ID`, a bulk operation's
filter), through a real `pgworker web`: a trial found a graph (the jobs linked by
depends_on, docs/graphs.md) browsable only through each job page's parent and child
links, `?graph=` answering 400 with a command line instead."""

from __future__ import annotations

import pytest
from console_server import ConsoleServer
from pg import wait_until
from worker import q

import pgworker

pytestmark = pytest.mark.integration

TOKEN = "ops:admin:graph-token-0123456789"
AUTH = {"Authorization": "Bearer graph-token-0123456789"}
NEWER = 30  # jobs enqueued after the graph: more than a window of the table's newest holds


@pytest.fixture
def graph(app, conn):
    """A graph of four (extract, then two loads and a report that depend on it; the loads
    dead), a second graph of two, then NEWER plain jobs and a dead 'load' of no graph."""
    schema = app.settings.schema
    ids = app.enqueue_many([pgworker.JobSpec("extract", {"n": 0}, ref="a"),
                            pgworker.JobSpec("load", {"n": 1}, depends_on=["a"]),
                            pgworker.JobSpec("load", {"n": 2}, depends_on=["a"]),
                            pgworker.JobSpec("report", {"n": 3}, depends_on=["a"])], any_task=True)
    other = app.enqueue_many([pgworker.JobSpec("extract", {}, ref="x"),
                              pgworker.JobSpec("load", {}, depends_on=["x"])], any_task=True)
    for _ in range(NEWER):
        app.enqueue("plain", {}, any_task=True)
    [loose] = q(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload, state, finished_at, last_error_code) "
                "VALUES ('default', 'load', '{{}}', 'dead', now(), 'PERMANENT') RETURNING id")[0]
    q(conn, schema, "UPDATE {s}.jobs SET state = 'dead', finished_at = now(), last_error_code = 'PERMANENT' "
      "WHERE id = ANY(%s) RETURNING id", ids[1:3])
    graph_id, other_id = (q(conn, schema, "SELECT graph_id FROM {s}.jobs WHERE id = %s", i)[0][0]
                          for i in (ids[3], other[1]))
    assert graph_id is not None and other_id is not None and graph_id != other_id
    return {"id": graph_id, "jobs": ids, "other": other_id, "other_jobs": other, "loose": loose}


@pytest.fixture
def console(app, pg_dsn):
    env = {"PGWORKER_WEB_TOKENS": TOKEN, "PGWORKER_WEB_SCAN_ROWS": "5", "PGWORKER_WEB_PAGE_SIZE": "3",
           "PGWORKER_WEB_BULK_IDLE_SECONDS": "0.2"}
    with ConsoleServer(pg_dsn, app.settings.schema, env=env) as server:
        yield server


def _ids(r):
    assert r.status_code == 200, r.text[:2000]
    return [j["id"] for j in r.json()["jobs"]]


def test_the_jobs_list_and_the_api_take_a_graph(console, graph):
    """Every job of the graph, newest first, in pages, though NEWER jobs are newer than
    the whole graph and the window (PGWORKER_WEB_SCAN_ROWS) is 5: the window is the graph's."""
    g, jobs = graph["id"], graph["jobs"]
    r = console.get("/api/jobs", params={"graph": g}, headers=AUTH)
    assert _ids(r) == jobs[:0:-1] and r.json()["filter"] == {"graph": g}, r.text
    cursor = r.json()["next_cursor"]
    assert cursor
    r = console.get("/api/jobs", params={"graph": g, "cursor": cursor}, headers=AUTH)
    assert _ids(r) == jobs[:1] and r.json()["next_cursor"] is None
    r = console.get("/api/jobs", params={"graph": str(g), "state": "dead", "task": "load"}, headers=AUTH)
    assert _ids(r) == [jobs[2], jobs[1]]  # the dead 'load' of no graph is not among them
    assert _ids(console.get("/api/jobs", params={"graph": graph["other"]}, headers=AUTH)) == \
        graph["other_jobs"][::-1]

    page = console.get("/jobs", params={"graph": g}, headers=AUTH)
    assert page.status_code == 200, page.text[:2000]
    assert f'name="graph" inputmode="numeric" size="8" value="{g}"' in page.text  # the form keeps it
    assert f"jobs of graph {g}" in page.text and f"Filter: graph {g}." in page.text
    for job in jobs[1:]:
        assert f'href="/jobs/{job}"' in page.text
    assert f'href="/jobs/{jobs[0]}"' not in page.text and f'href="/jobs/{graph["loose"]}"' not in page.text
    assert f"graph={g}" in page.text.split('id="next-page"')[1].split(">")[0]  # the next page keeps the filter
    # a bulk operation's links keep the graph too
    assert f"/bulk/new?kind=replay&amp;graph={g}" in page.text


@pytest.mark.parametrize("typed, fix", [
    ("abc", "write ids as plain digits 0-9"), ("1_0", "write ids as plain digits 0-9"),
    ("\u0661\u0662", "write ids as plain digits 0-9"), ("0", "out of range"), (str(2**63), "out of range"),
])
def test_a_graph_that_is_no_id_is_refused_with_the_fix(console, typed, fix):
    page = console.get("/jobs", params={"graph": typed}, headers=AUTH)
    assert page.status_code == 400 and fix in page.text and 'id="filter-error"' in page.text, page.text[:2000]
    r = console.get("/api/jobs", params={"graph": typed}, headers=AUTH)
    assert r.status_code == 400 and fix in r.json()["error"], r.text


def test_what_a_graph_filter_shows_is_escaped_and_says_what_is_wrong(console, graph):
    hostile = "<b id=x>1</b>"
    page = console.get("/jobs", params={"graph": hostile}, headers=AUTH)
    assert page.status_code == 400 and hostile not in page.text, page.text[:2000]
    assert "&lt;b id=x&gt;1&lt;/b&gt;" in page.text  # the form and the message show it as text
    # a graph sorted by an index's order: the fix named
    page = console.get("/jobs", params={"graph": graph["id"], "queue": "default", "state": "pending",
                                        "sort": "due"}, headers=AUTH)
    assert page.status_code == 400 and f"graph {graph['id']} is for the newest-first list" in page.text
    # an id no job carries: said so, rather than an empty list alone
    page = console.get("/jobs", params={"graph": "9999999"}, headers=AUTH)
    assert page.status_code == 200 and 'id="no-graph"' in page.text and "No job carries graph id 9999999" in page.text
    # not "Searched the newest 0 jobs of graph 9999999 (ids 0 and up)" above it (a trial)
    assert "Graph 9999999 has no job" in page.text and "Searched the newest 0 jobs" not in page.text, page.text
    page = console.get("/jobs", params={"graph": graph["id"], "state": "cancelled"}, headers=AUTH)
    assert page.status_code == 200 and 'id="no-jobs"' in page.text and 'id="no-graph"' not in page.text


def test_the_job_page_links_its_graph_to_the_filtered_list(console, graph):
    page = console.get(f"/jobs/{graph['jobs'][2]}", headers=AUTH)
    assert page.status_code == 200
    link = f'<a id="graph-link" href="/jobs?graph={graph["id"]}">{graph["id"]}</a>'
    assert link in page.text, page.text[page.text.find('id="graph-id"') - 100:][:600]


def test_a_bulk_replay_and_cancel_take_a_graph(console, graph, app, conn):
    """Replay the graph's dead jobs (not the dead 'load' of no graph); cancel the other
    graph's pending 'load' (not its parent); each operation reads its graph's jobs only
    (examined)."""
    schema, g = app.settings.schema, graph["id"]
    page = console.get("/bulk/new", params={"kind": "replay", "graph": g}, headers=AUTH)
    assert page.status_code == 200 and "<strong>2</strong> job(s) match now" in page.text, page.text[:3000]
    assert f'<input type="hidden" name="graph" value="{g}">' in page.text
    r = console.post("/api/bulk", headers=AUTH, json={"kind": "replay", "filter": {"graph": True}})
    assert r.status_code == 400 and "graph id" in r.json()["error"], r.text
    r = console.post("/api/bulk", headers=AUTH, json={"kind": "replay", "filter": {"graph": g}})
    assert r.status_code == 201, r.text
    replay = r.json()["id"]
    r = console.post("/api/bulk", headers=AUTH, json={"kind": "cancel", "filter": {"graph": graph["other"],
                                                                                   "task": "load"}})
    assert r.status_code == 201, r.text
    cancel = r.json()["id"]

    def finished():
        rows = q(conn, schema, "SELECT id, state, examined, applied, filter FROM {s}.bulk_operations ORDER BY id")
        return rows if all(row[1] == "done" for row in rows) else None

    rows = wait_until(finished, timeout=30, message="both operations")
    assert [(i, ex, ap, f) for i, _, ex, ap, f in rows] == [
        (replay, 4, 2, {"graph": g, "state": "dead"}), (cancel, 2, 1, {"graph": graph["other"], "task": "load"})]
    changed = q(conn, schema, "SELECT operation_id, job_id FROM {s}.bulk_operation_jobs ORDER BY 1, 2")
    assert changed == [(replay, graph["jobs"][1]), (replay, graph["jobs"][2]),
                       (cancel, graph["other_jobs"][1])]
    states = dict(q(conn, schema, "SELECT id, state::text FROM {s}.jobs WHERE id = ANY(%s)",
                    [graph["loose"], *graph["jobs"][1:3], *graph["other_jobs"]]))
    assert states[graph["loose"]] == "dead" and states[graph["jobs"][1]] != "dead" != states[graph["jobs"][2]]
    assert [states[i] for i in graph["other_jobs"]] == ["pending", "cancelled"]
    page = console.get(f"/bulk/{replay}", headers=AUTH)
    assert f"graph {g}" in page.text
