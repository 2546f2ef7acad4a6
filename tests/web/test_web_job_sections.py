"""The job page's result, progress and dependencies sections (issue 21), through a real
`pgworker web`: the result redacted like the payload on the page and in the JSON API
(the API returned it unredacted), progress as a percentage with its message, parents and
children linked with their states, the policy and the graph id; hostile HTML in a
result and a progress message shown as text."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from console_server import ConsoleServer
from psycopg import sql

from pgworker.web.config import WebConfig
from pgworker.web.pages.job import job_data

pytestmark = pytest.mark.integration

HOSTILE_RESULT = "</pre><script>window.__pwned = 1</script>"
HOSTILE_MESSAGE = "<img src=x onerror=alert('progress')>"


def _succeed_with(conn, schema, job, result):
    s = sql.Identifier(schema)
    conn.execute(sql.SQL("UPDATE {}.jobs SET state = 'succeeded', finished_at = now() WHERE id = %s").format(s), [job])
    conn.execute(sql.SQL("INSERT INTO {}.job_results (job_id, result) VALUES (%s, %s)").format(s),
                 [job, json.dumps(result)])


def _graph(app, conn):
    """A parent that succeeded with a result holding secrets and HTML, a second parent
    still pending (so the child waits for one), the child under policy 'cancel'."""
    schema = app.settings.schema
    ids = app.enqueue_many([
        _spec("extract", {"day": "2026-12-01"}, ref="a"),
        _spec("clean", {}, ref="b"),
        _spec("report", {}, depends_on=["a", "b"], on_parent_failure="cancel"),
    ], any_task=True)
    parent, other, child = ids
    _succeed_with(conn, schema, parent, {"rows": 1250, "html": HOSTILE_RESULT, "api_key": "sk-result-secret",
                                         "nested": [{"download_token": "tok-result-secret"}]})
    conn.execute(sql.SQL("UPDATE {}.jobs SET waiting_parents = 1 WHERE id = %s")
                 .format(sql.Identifier(schema)), [child])
    conn.execute(sql.SQL("UPDATE {}.jobs SET progress = 0.425, progress_message = %s, progress_at = now() "
                         "WHERE id = %s").format(sql.Identifier(schema)), [HOSTILE_MESSAGE, other])
    return parent, other, child


def _spec(task, payload, **kw):
    import pgworker

    return pgworker.JobSpec(task, payload, **kw)


def test_the_result_is_redacted_in_the_api_and_on_the_page(app, pg_dsn, conn):
    parent, _, _ = _graph(app, conn)
    with ConsoleServer(pg_dsn, app.settings.schema).wait_ready() as server:
        page = server.get(f"/jobs/{parent}")
        api = server.get(f"/api/jobs/{parent}")
    assert page.status_code == 200 and api.status_code == 200
    for text in (page.text, api.text):
        assert "sk-result-secret" not in text and "tok-result-secret" not in text
    result = api.json()["job"]["result"]
    assert result["api_key"] == "[redacted]" and result["nested"] == [{"download_token": "[redacted]"}]
    assert result["rows"] == 1250  # only the sensitive keys go
    assert "result_text" not in api.json()
    assert "sections" not in api.json()  # the page's template names ("job/_steps.html", ...) are not data


def test_the_overview_says_the_table_is_not_yet_estimated_before_analyze(app, pg_dsn, conn):
    """A fresh schema's jobs table was never analysed (pg_class.reltuples -1): the overview
    said "About ? jobs in the table"; after ANALYZE it gives the estimate."""
    schema = app.settings.schema
    app.enqueue_many([_spec("t", {}) for _ in range(3)], any_task=True)
    with ConsoleServer(pg_dsn, schema).wait_ready() as server:
        before = server.get("/").text
        conn.execute(sql.SQL("ANALYZE {}.jobs").format(sql.Identifier(schema)))
        after = server.get("/").text
    assert "About ?" not in before and "not yet estimated (ANALYZE has not run" in before
    assert "About 3 jobs in the table" in after and "not yet estimated" not in after


def test_the_jobs_list_says_why_a_pending_job_waits_and_that_the_table_is_not_yet_estimated(app, pg_dsn, conn):
    """A dependent waiting for a parent read as an ordinary due job in the list (its run_at
    is now), and the list said "about ? jobs" before ANALYZE."""
    _, _, child = _graph(app, conn)
    with ConsoleServer(pg_dsn, app.settings.schema).wait_ready() as server:
        page = server.get("/jobs")
    assert page.status_code == 200
    row = page.text.split(f'<tr data-job="{child}">', 1)[1].split("</tr>", 1)[0]
    assert "waits for 1 parent" in row
    assert "about ?" not in page.text and "not yet estimated" in page.text


def test_a_jobs_list_filtered_on_a_misspelt_queue_names_the_closest_queue(app, pg_dsn, conn):
    app.enqueue_many([_spec("t", {}, queue="emails"), _spec("t", {}, queue="reports")], any_task=True)
    with ConsoleServer(pg_dsn, app.settings.schema).wait_ready() as server:
        typo = server.get("/jobs?queue=emials").text
        right = server.get("/jobs?queue=emails").text
        nothing_close = server.get("/jobs?queue=zzzzzz").text
        # no queue in the filter, nothing matched: no hint, and no error (the page once failed
        # on the hint it did not compute, HTTP 500)
        no_queue = server.get('/jobs?payload={"user":-1}')
        bad_filter = server.get("/jobs?state=nope")
    assert no_queue.status_code == 200 and 'id="no-jobs"' in no_queue.text, no_queue.text[-2000:]
    assert bad_filter.status_code == 400
    assert 'id="queue-hint"' in typo and ">emails</a>" in typo and "queue=emails" in typo
    assert 'id="queue-hint"' not in right and 'id="queue-hint"' not in nothing_close


def test_the_redaction_hook_sees_the_result_too(app, conn):
    """WebConfig(redact=fn) runs on what the handler returned as on the payload."""
    parent, _, _ = _graph(app, conn)
    seen = []

    def hook(value, job):
        seen.append(value)
        return {k: ("[hidden by hook]" if k == "rows" else v) for k, v in value.items()} if isinstance(value, dict) \
            else value

    ctx = SimpleNamespace(app=app, console=SimpleNamespace(config=WebConfig(redact=hook)), can=lambda action: True)
    data = job_data(ctx, parent)
    assert data["job"]["result"]["rows"] == "[hidden by hook]"
    assert data["job"]["result"]["api_key"] == "[redacted]"  # the keys first, then the hook
    assert "[hidden by hook]" in data["result_text"] and "1250" not in data["result_text"]
    assert {"day": "2026-12-01"} in seen


def test_the_page_shows_result_progress_and_dependencies_escaped(app, pg_dsn, conn):
    parent, other, child = _graph(app, conn)
    with ConsoleServer(pg_dsn, app.settings.schema).wait_ready() as server:
        parent_page = server.get(f"/jobs/{parent}").text
        other_page = server.get(f"/jobs/{other}").text
        child_page = server.get(f"/jobs/{child}").text
        plain = server.get(f"/jobs/{server_job(app)}").text
    # the result: pretty-printed, redacted, its HTML as text
    assert 'id="result"' in parent_page and "&#34;rows&#34;: 1250" in parent_page
    assert "&lt;/pre&gt;&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in parent_page
    assert "<script>window.__pwned" not in parent_page
    # progress: a percentage, the message as text
    assert 'id="progress"' in other_page and "42.5%" in other_page
    assert "&lt;img src=x onerror=alert(&#39;progress&#39;)&gt;" in other_page and "<img src=x" not in other_page
    # dependencies: the child's parents linked with their states, the policy, what it waits for, the graph
    assert 'id="dependencies"' in child_page
    assert f'href="/jobs/{parent}"' in child_page and f'href="/jobs/{other}"' in child_page
    assert ">succeeded<" in child_page and ">pending<" in child_page
    assert 'id="on-parent-failure">cancel' in child_page and "1 parent not succeeded yet" in child_page
    assert f'id="graph-id"><a id="graph-link" href="/jobs?graph={parent}">{parent}</a> ' in child_page
    # and the parent's children
    assert 'id="job-children"' in parent_page and f'href="/jobs/{child}"' in parent_page
    # a job with none of them shows none of the sections
    for section in ('id="result"', 'id="progress"', 'id="dependencies"'):
        assert section not in plain


def server_job(app):
    return app.enqueue("quick", {"n": 1}, any_task=True)


def _error(attempt, at, code="UPSTREAM"):
    return {"attempt": attempt, "at": at, "code": code, "message": f"attempt {attempt} <b>failed</b>", "worker": "w1"}


def test_the_attempts_of_a_replayed_job_are_set_apart_and_its_times_read_alike(app, pg_dsn, conn):
    """A new user read 'Attempt 3, 2, 1, 3, 2, 1' with nothing between the two runs, an
    ISO time under each attempt beside the page's '2026-12-05 10:24:35Z' elsewhere, and
    'No traceback stored' under every attempt (none ever is)."""
    job = app.enqueue("t", {}, any_task=True)
    history = [_error(1, "2026-12-05T10:20:01.5+00:00"), _error(2, "2026-12-05T10:21:02.25+00:00"),
               _error(1, "2026-12-05T10:24:35.390848+00:00"), _error(2, "not a time <i>x</i>")]
    history[-1]["traceback"] = 'File "/app/tasks.py", line 9, in send\n  raise Boom("<script>x</script>")'

    conn.execute(sql.SQL("UPDATE {}.jobs SET errors = %s::jsonb WHERE id = %s").format(
        sql.Identifier(app.settings.schema)), [json.dumps(history), job])
    with ConsoleServer(pg_dsn, app.settings.schema).wait_ready() as server:
        page = server.get(f"/jobs/{job}").text
    section = page[page.index('id="attempts"'):]
    section = section[:section.index("</section>")]
    assert section.count("Earlier, before the job was replayed") == 1
    newest_first = [int(part.split("<", 1)[0]) for part in section.split("Attempt ")[1:]]
    assert newest_first == [2, 1, 2, 1]
    assert section.index("Attempt 1") < section.index("Earlier") < section.rindex("Attempt 2")
    assert "2026-12-05 10:24:35Z" in section and "2026-12-05 10:20:01Z" in section and "T10:24" not in section
    assert "not a time &lt;i&gt;x&lt;/i&gt;" in section  # shown as it is, escaped
    assert "No traceback stored" not in section and section.count("An exception's traceback is kept") == 1
    # the newest attempt's traceback, escaped, folded; the others have none
    assert section.count('<details class="traceback">') == 1
    assert 'raise Boom(&#34;&lt;script&gt;x&lt;/script&gt;&#34;)' in section and "<script>x" not in section
    assert "a job keeps its last 10 (PGWORKER_ERROR_HISTORY_ENTRIES)" in section


def test_a_running_jobs_page_offers_no_second_cancel(app, pg_dsn, conn):
    job = app.enqueue("t", {}, any_task=True)
    [claimed] = app.claim("default", limit=1)
    assert claimed.id == job
    with ConsoleServer(pg_dsn, app.settings.schema).wait_ready() as server:
        assert 'id="action-cancel"' in server.get(f"/jobs/{job}").text
        app.cancel(job, actor="t")
        page = server.get(f"/jobs/{job}").text
    assert 'id="action-cancel"' not in page and "Cancel requested" in page


def test_a_jobs_list_filtered_on_a_misspelt_task_names_the_closest_and_offers_no_bulk_action(app, pg_dsn, conn):
    """`/jobs?task=flak` said "No job matches" with no hint, where `pgworker jobs list --task
    flak` names 'flaky', and offered "Replay all · Discard all · Cancel all" for nothing (a
    new user's trial)."""
    app.enqueue_many([_spec("flaky", {}), _spec("other", {})], any_task=True)
    with ConsoleServer(pg_dsn, app.settings.schema).wait_ready() as server:
        typo = server.get("/jobs?task=flak").text
        right = server.get("/jobs?task=flaky").text
        nothing_close = server.get("/jobs?task=zzzzzz").text
        bad = server.get("/jobs?state=nope")
    assert 'id="task-hint"' in typo and ">flaky</a>" in typo and "task=flaky" in typo, typo[-3000:]
    assert 'id="task-hint"' not in right and 'id="task-hint"' not in nothing_close
    assert 'class="bulk-actions"' not in typo and 'class="bulk-actions"' not in nothing_close
    assert 'class="bulk-actions"' in right  # a filter that matches keeps its bulk actions
    assert bad.status_code == 400
    # a window exactly as large as the table read every job: nothing was cut off (its bulk
    # actions were offered when the table held exactly PGWORKER_WEB_SCAN_ROWS jobs)
    with ConsoleServer(pg_dsn, app.settings.schema, env={"PGWORKER_WEB_SCAN_ROWS": "2"}).wait_ready() as server:
        exact = server.get("/jobs?task=zzzzzz").text
    assert "No job matches" in exact and 'class="bulk-actions"' not in exact, exact[-3000:]
