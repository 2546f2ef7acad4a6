"""The console in a real browser (Debian's Chromium driven by Selenium) against a real
PostgreSQL with jobs made by a real `pgworker run`: every page loads (and is
photographed for docs/web.md), a dead job replayed from its page succeeds, a running job
cancelled from its page is stopped by its worker, a reason typed into a job's cancel form
is kept and shown in its audit trail, a paused queue stops being claimed, a
dead-job group is replayed as a bulk operation, another discarded with the reason typed
into its confirmation (kept on the operation and in each job's trail), read-only mode shows no action, hostile
names and messages stay inert, unauthenticated visits and a form without its CSRF token
are refused. Every page is checked for browser console errors (a CSP violation is one)."""

from __future__ import annotations

import os
import shutil
import time

import psycopg
import pytest
from console_server import WEB_APP, ConsoleServer
from pg import make_settings, wait_until
from worker import Worker, q

import browser as browser_mod
from pgworker import App
from pgworker.migrate import drop_schema

pytestmark = [pytest.mark.acceptance, pytest.mark.web]

SHOTS = os.environ.get("PGWORKER_WEB_SCREENSHOTS")  # a folder: the docs' screenshots are written there too
HOSTILE = ("<script>alert('queue')</script>", "<img src=x onerror=alert('task')>")


class Site:
    def __init__(self, app, conn, console, worker, heal_dir, shots):
        self.app, self.conn, self.console, self.worker = app, conn, console, worker
        self.heal_dir, self.shots = heal_dir, shots
        self.schema = app.settings.schema

    def heal(self, group):
        open(os.path.join(self.heal_dir, f"heal-{group}"), "w").close()

    def state(self, job):
        return q(self.conn, self.schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job)[0][0]

    def wait_state(self, job, state, timeout=30):
        wait_until(lambda: self.state(job) == state, timeout=timeout,
                   message=lambda: f"job {job} {state} (it is {self.state(job)}); worker log:\n{self.worker.logs()[-3000:]}")


@pytest.fixture(scope="module")
def site(pg_dsn, tmp_path_factory):
    schema = f"webui_{os.getpid()}"
    heal_dir = str(tmp_path_factory.mktemp("heal"))
    shots = str(tmp_path_factory.mktemp("shots"))
    app = App(settings=make_settings(pg_dsn, schema))
    app.migrate()
    conn = psycopg.connect(pg_dsn, autocommit=True)
    worker = Worker(pg_dsn, schema, "--concurrency", "2", "--poll-interval", "0.2", "--lease", "6", app=WEB_APP,
                    env={"WEB_TEST_DIR": heal_dir}, log_dir=shots)
    console = ConsoleServer(pg_dsn, schema, env={"WEB_TEST_DIR": heal_dir}, log_dir=shots).wait_ready()
    try:
        yield Site(app, conn, console, worker, heal_dir, shots)
    finally:
        console.stop()
        worker.kill()
        app.close()
        drop_schema(conn, schema)
        conn.close()


def _open(driver, site, path, shot=None):
    driver.get(site.console.url + path)
    logs = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not logs, f"browser console errors on {path}: {logs}"
    if shot:
        _shot(driver, site, shot)
    return driver


def _shot(driver, site, name):
    """The page as it is now, whole, into the test's folder (and the docs' with SHOTS)."""
    target = os.path.join(site.shots, f"{name}.png")
    browser_mod.full_screenshot(driver, target)
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        shutil.copy(target, os.path.join(SHOTS, f"{name}.png"))
    driver.set_window_size(1400, 900)


def _on_fresh(driver, css, act, timeout=0.0):
    """``act(element)`` on the first element matching ``css`` (waiting up to ``timeout``
    seconds for it to appear: a click that submits a form returns before the next page
    has loaded). A running job's page refreshes on every lease renewal (heartbeat_at is
    part of what it follows), so the element found may be swapped out before ``act``
    lands: a stale element is found again, as a user's next click would land on the new
    button."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    for _ in range(10):
        try:
            found = (WebDriverWait(driver, timeout).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))
                     if timeout else driver.find_element(By.CSS_SELECTOR, css))
            return act(found)
        except StaleElementReferenceException:
            time.sleep(0.1)
    raise AssertionError(f"{css} kept being replaced")


def _text(driver, css, timeout=15):
    """The text of the first element matching ``css``, waiting for it to appear."""
    return _on_fresh(driver, css, lambda e: e.text, timeout)


def _click(driver, css):
    _on_fresh(driver, css, lambda e: e.click())


def _type(driver, css, *keys):
    _on_fresh(driver, css, lambda e: e.send_keys(*keys))


def _no_alert(driver):
    from selenium.common.exceptions import NoAlertPresentException

    try:
        alert = driver.switch_to.alert
    except NoAlertPresentException:
        return True
    text = alert.text
    alert.dismiss()
    raise AssertionError(f"a dialog opened: {text!r}")


def test_every_page_loads(browser, site):
    app = site.app
    done = [app.enqueue("quick", {"order": i, "customer": {"id": i % 5}}, any_task=True) for i in range(30)]
    dead = [app.enqueue("dies", {"group": "shots", "order": i}, any_task=True) for i in range(6)]
    running = app.enqueue("runs_until_cancelled", {"report": "quarterly", "api_key": "sk-never-shown"}, any_task=True)
    later = app.enqueue("quick", {"reminder": True}, any_task=True, delay=3600, ordering_key="customer-7")
    for job in done:
        site.wait_state(job, "succeeded")
    for job in dead:
        site.wait_state(job, "dead")
    site.wait_state(running, "running")
    wait_until(lambda: q(site.conn, site.schema, "SELECT count(*) FROM {s}.pods")[0][0] >= 1, timeout=30,
               message="the pod registry")

    _open(browser, site, "/", "overview")
    assert "default" in _text(browser, "#queues")
    _open(browser, site, "/jobs?payload=customer.id%3D3", "jobs")
    assert _text(browser, "#jobs-table").count("quick") == 6
    _open(browser, site, f"/jobs/{running}", "job-running")
    assert _text(browser, "#lease-token") == str(q(site.conn, site.schema,
                                                   "SELECT lease_token FROM {s}.jobs WHERE id = %s", running)[0][0])
    assert "sk-never-shown" not in browser.page_source and "[redacted]" in _text(browser, "#payload-json")
    _open(browser, site, f"/jobs/{dead[0]}", "job-dead")
    assert "upstream refused the request" in _text(browser, "#attempts")
    _open(browser, site, f"/jobs/{later}")
    assert browser.find_elements("css selector", "#action-retry")
    _open(browser, site, "/dead", "dead")
    _open(browser, site, "/dead?task=dies&error_code=PERMANENT", "dead-group")
    _open(browser, site, "/schedules", "schedules")
    assert "yearly_report" in _text(browser, "#schedules")
    _open(browser, site, "/workers", "workers")
    assert str(running) in _text(browser, "main")
    _open(browser, site, "/bulk/new?kind=replay&state=dead&task=dies&error_code=PERMANENT", "bulk-confirm")
    assert "6" in _text(browser, "#bulk-count")
    site.app.cancel(running, actor="test")


def test_a_dead_job_replayed_from_its_page_succeeds(browser, site):
    job = site.app.enqueue("dies", {"group": "replay-one"}, any_task=True)
    site.wait_state(job, "dead")
    site.heal("replay-one")
    _open(browser, site, f"/jobs/{job}")
    _click(browser, "#action-replay")
    assert "Replayed" in _text(browser, "#notice")
    site.wait_state(job, "succeeded")
    wait_until(lambda: _open(browser, site, f"/jobs/{job}") and _text(browser, "#job-state") == "succeeded",
               timeout=20, message="the page showing it succeeded")
    assert "replayed" in _text(browser, "#history") and "web" in _text(browser, "#history")


def test_a_running_job_cancelled_from_its_page_is_stopped_by_its_worker(browser, site):
    job = site.app.enqueue("runs_until_cancelled", None, any_task=True)
    site.wait_state(job, "running")
    _open(browser, site, f"/jobs/{job}")
    assert "renewed on schedule" in _text(browser, "#lease") and _text(browser, "#lease-owner") != "-"
    _click(browser, "#action-cancel")
    browser.switch_to.alert.accept()  # the page's confirmation (console.js)
    site.wait_state(job, "cancelled", timeout=40)
    # the open page follows by itself (SSE from the job's row), no reload
    wait_until(lambda: _text(browser, "#job-state") == "cancelled", timeout=20, message="the live update")


def test_a_reason_typed_on_a_running_jobs_page_survives_its_live_refreshes(browser, site):
    """A running job's page refreshes on each lease renewal; a reason the operator typed
    and then left (clicked elsewhere) was wiped by the next refresh."""
    job = site.app.enqueue("runs_until_cancelled", None, any_task=True)
    site.wait_state(job, "running")
    _open(browser, site, f"/jobs/{job}")
    beat = lambda: q(site.conn, site.schema, "SELECT heartbeat_at FROM {s}.jobs WHERE id = %s", job)[0][0]  # noqa: E731

    def refreshed_twice(mark):
        browser.execute_script("document.getElementById('live').dataset.mark = arguments[0]", mark)
        first = beat()
        wait_until(lambda: beat() != first, timeout=20, message="a lease renewal")
        second = beat()
        wait_until(lambda: beat() != second, timeout=20, message="a second lease renewal")
        time.sleep(3)  # the stream polls every 2 s
        return browser.execute_script("return document.getElementById('live').dataset.mark || null") is None

    assert refreshed_twice("untouched"), "the page did not refresh on renewals: this test could not fail"
    _type(browser, "#reason-cancel", "stuck on the <b>old</b> API")
    browser.execute_script("document.activeElement.blur()")
    assert not refreshed_twice("typed"), "a refresh replaced the page under a typed reason"
    assert browser.find_element("css selector", "#reason-cancel").get_attribute("value") == "stuck on the <b>old</b> API"
    _click(browser, "#action-cancel")
    browser.switch_to.alert.accept()
    site.wait_state(job, "cancelled", timeout=40)
    wait_until(lambda: "stuck on the <b>old</b> API" in _text(browser, "#history"), timeout=20,
               message="the reason in the job's history")


def test_a_refresh_held_back_while_the_operator_typed_runs_once_they_stop(browser, site):
    """A job's last change comes once and its stream then ends: a refresh skipped while
    a reason was typed left the page saying 'running' for good after the job finished."""
    from selenium.webdriver.common.keys import Keys

    job = site.app.enqueue("runs_until_cancelled", None, any_task=True)
    site.wait_state(job, "running")
    _open(browser, site, f"/jobs/{job}")
    _type(browser, "#reason-cancel", "on second thought")
    browser.execute_script("document.activeElement.blur()")
    site.app.cancel(job, actor="t")  # elsewhere: the API, another operator
    site.wait_state(job, "cancelled", timeout=40)
    # the stream's poll (2 s) sends its last refresh and ends; the browser reconnects 3 s
    # later and that stream's first read, unlike the page's render, sends one more: both
    # held back
    time.sleep(8)
    assert _text(browser, "#job-state") == "running", "the refresh was not held back: this test could not fail"
    _type(browser, "#reason-cancel", Keys.CONTROL, "a")
    _type(browser, "#reason-cancel", Keys.BACK_SPACE)
    browser.execute_script("document.activeElement.blur()")
    wait_until(lambda: _text(browser, "#job-state") == "cancelled", timeout=10, message="the held-back refresh")


def test_a_job_cancelled_from_its_page_with_a_reason_shows_it_in_its_audit_trail(browser, site):
    """The cancel form's reason field reaches App.cancel and comes back as text."""
    job = site.app.enqueue("quick", {"later": True}, any_task=True, delay=3600)
    _open(browser, site, f"/jobs/{job}")
    field = browser.find_element("css selector", "#reason-cancel")
    assert field.get_attribute("maxlength") == "500"
    field.send_keys("<b>duplicate</b> of the 9 o'clock run")
    _click(browser, "#action-cancel")
    browser.switch_to.alert.accept()  # the page's confirmation (console.js)
    assert "Cancel" in _text(browser, "#notice")
    site.wait_state(job, "cancelled")
    assert "<b>duplicate</b> of the 9 o'clock run" in _text(browser, "#history .reason")
    assert not browser.find_elements("css selector", "#history b")  # text, not markup
    detail = q(site.conn, site.schema, "SELECT detail FROM {s}.job_events WHERE job_id = %s", job)
    assert detail == [({"reason": "<b>duplicate</b> of the 9 o'clock run"},)]


def test_a_paused_queue_stops_being_claimed(browser, site):
    _open(browser, site, "/")
    site.app.enqueue("paused_queue_job", None, any_task=True, queue="pausable")  # the queue appears on the overview
    wait_until(lambda: q(site.conn, site.schema, "SELECT count(*) FROM {s}.jobs WHERE queue = 'pausable' "
                         "AND state = 'succeeded'")[0][0] == 1, timeout=30, message="the first job")
    _open(browser, site, "/")
    _click(browser, 'tr[data-queue="pausable"] button.pause')
    # the click returns before the next page has loaded, and the old page's row is present
    # meanwhile: wait for the row to say so (it read the old row once, on a loaded machine)
    wait_until(lambda: "paused" in _text(browser, 'tr[data-queue="pausable"]'), timeout=15,
               message=lambda: f"the row after the pause: {_text(browser, 'tr[data-queue=pausable]')!r}")
    held = site.app.enqueue("paused_queue_job", None, any_task=True, queue="pausable")
    probe = site.app.enqueue("quick", None, any_task=True)
    site.wait_state(probe, "succeeded")  # the worker claims other queues meanwhile...
    time.sleep(1.0)  # ...and several fallback polls (0.2 s) pass
    assert site.state(held) == "pending"  # ...but not the paused one
    _open(browser, site, "/")
    _click(browser, 'tr[data-queue="pausable"] button.resume')
    site.wait_state(held, "succeeded")
    events = q(site.conn, site.schema, "SELECT kind, actor FROM {s}.queue_events WHERE queue = 'pausable' ORDER BY id")
    assert events == [("paused", "web"), ("resumed", "web")]


def test_a_dead_group_is_replayed_as_a_bulk_operation(browser, site):
    jobs = [site.app.enqueue("dies", {"group": "bulk"}, any_task=True) for _ in range(5)]
    for job in jobs:
        site.wait_state(job, "dead")
    q(site.conn, site.schema, "UPDATE {s}.jobs SET last_error_code = 'UPSTREAM_503' WHERE id = ANY(%s) RETURNING id",
      jobs)
    site.heal("bulk")
    _open(browser, site, "/dead")
    from selenium.webdriver.common.by import By

    row = next(r for r in browser.find_elements(By.CSS_SELECTOR, "tr.group") if "UPSTREAM_503" in r.text)
    assert " 5 " in f" {row.text} "
    row.find_element(By.LINK_TEXT, "Replay all").click()
    assert "5" in _text(browser, "#bulk-count")
    _click(browser, "#bulk-start")
    _text(browser, "#op-state")  # the operation's page has loaded: its address is the one to reload
    wait_until(lambda: _open(browser, site, browser.current_url.replace(site.console.url, ""))
               and _text(browser, "#op-state") == "done", timeout=60, message="the operation to finish")
    assert _text(browser, "#op-applied") == "5"
    _open(browser, site, browser.current_url.replace(site.console.url, ""), "bulk-operation")
    _open(browser, site, "/bulk", "bulk-list")
    for job in jobs:
        site.wait_state(job, "succeeded")


def test_a_dead_group_discarded_as_a_bulk_operation_keeps_the_reason_typed_into_its_confirmation(browser, site):
    """The confirmation's reason field reaches the operation and each job's audit trail,
    and both pages show it as text."""
    from selenium.webdriver.common.by import By

    jobs = [site.app.enqueue("dies", {"group": "discard-why"}, any_task=True) for _ in range(3)]
    for job in jobs:
        site.wait_state(job, "dead")
    q(site.conn, site.schema, "UPDATE {s}.jobs SET last_error_code = 'POISON' WHERE id = ANY(%s) RETURNING id", jobs)
    _open(browser, site, "/dead")
    row = next(r for r in browser.find_elements(By.CSS_SELECTOR, "tr.group") if "POISON" in r.text)
    row.find_element(By.LINK_TEXT, "Discard all").click()
    assert "3" in _text(browser, "#bulk-count")
    field = browser.find_element(By.CSS_SELECTOR, "#bulk-reason")
    assert field.get_attribute("maxlength") == "500"
    why = "<img src=x onerror=alert('why')> poison <b>batch</b>"
    field.send_keys(why)
    _click(browser, "#bulk-start")
    _text(browser, "#op-state")  # the operation's page has loaded: its address is the one to reload
    wait_until(lambda: _open(browser, site, browser.current_url.replace(site.console.url, ""))
               and _text(browser, "#op-state") == "done", timeout=60, message="the operation to finish")
    _no_alert(browser)
    assert _text(browser, "#op-reason") == why and _text(browser, "#op-applied") == "3"
    assert not browser.find_elements(By.CSS_SELECTOR, "main img, main b")  # text, not markup
    _open(browser, site, f"/jobs/{jobs[0]}")
    assert why in _text(browser, "#history .reason") and site.state(jobs[0]) == "cancelled"
    _no_alert(browser)
    details = q(site.conn, site.schema, "SELECT DISTINCT detail FROM {s}.job_events WHERE job_id = ANY(%s) "
                "AND kind = 'cancelled'", jobs)
    assert details == [({"reason": why},)]


def test_a_selection_of_dead_jobs_is_replayed(browser, site):
    jobs = [site.app.enqueue("dies", {"group": "pick"}, any_task=True) for _ in range(3)]
    for job in jobs:
        site.wait_state(job, "dead")
    q(site.conn, site.schema, "UPDATE {s}.jobs SET last_error_code = 'PICKED' WHERE id = ANY(%s) RETURNING id", jobs)
    site.heal("pick")
    _open(browser, site, "/dead?task=dies&error_code=PICKED")
    for job in jobs[:2]:
        _click(browser, f'input[name="ids"][value="{job}"]')
    _click(browser, "#replay-selected")
    browser.switch_to.alert.accept()
    assert "2 job(s)" in _text(browser, "#notice")
    site.wait_state(jobs[0], "succeeded")
    site.wait_state(jobs[1], "succeeded")
    assert site.state(jobs[2]) == "dead"


def test_hostile_names_and_messages_stay_inert(browser, site):
    job = site.app.enqueue(HOSTILE[1], {"html": "<script>window.__pwned = 1</script>", "x": "\"><svg onload=alert(9)>"},
                           any_task=True, queue=HOSTILE[0])
    site.wait_state(job, "dead")
    for path in ("/", "/jobs", f"/jobs?queue={HOSTILE[0]}", f"/jobs/{job}", "/dead", "/workers"):
        _open(browser, site, path)
        _no_alert(browser)
        assert browser.execute_script("return window.__pwned === undefined")
    _open(browser, site, f"/jobs/{job}")
    assert HOSTILE[1] in _text(browser, "#job-summary")  # shown as text, literally
    assert "<script>alert('error')</script>" in _text(browser, "#attempts")
    assert "window.__pwned = 1" in _text(browser, "#payload-json")
    _no_alert(browser)


def test_a_failed_attempts_traceback_is_folded_under_it_and_inert(browser, site):
    """A real worker's attempt raised ConnectionError in a helper whose source line holds
    HTML and script: the job page folds the stored traceback under the attempt's message,
    opens it on a click, and shows it as text."""
    job = site.app.enqueue("breaks", {"to": "https://example.com/hook"}, any_task=True)
    site.wait_state(job, "dead")
    _open(browser, site, f"/jobs/{job}")
    assert not _on_fresh(browser, "details.traceback", lambda e: e.get_attribute("open"))  # folded
    _click(browser, "details.traceback summary")
    shown = _text(browser, "details.traceback pre")
    assert "in breaks" in shown and "in _deliver" in shown, shown
    assert 'raise ConnectionError("</pre><script>window.__pwned = 2</script> upstream closed' in shown, shown
    assert browser.execute_script("return window.__pwned === undefined")
    _no_alert(browser)
    _shot(browser, site, "job-traceback")


def test_result_progress_and_dependencies_are_shown_inert_and_redacted(browser, site):
    """A real worker's job reports progress and returns a result, both with HTML and
    script (and a secret in the result); its child waits for it: the job page shows the
    three sections as text, the secret redacted, the relatives linked."""
    import pgworker

    hostile_progress = "<img src=x onerror=alert('progress')>"  # as tests/apps/web_app.py's task reports
    hostile_result = "</pre><script>window.__pwned = 1; alert('result')</script>"
    parent, child = site.app.enqueue_many([pgworker.JobSpec("reports_and_returns", {}, ref="p"),
                                           pgworker.JobSpec("quick", {}, depends_on=["p"])], any_task=True)
    site.wait_state(child, "succeeded")
    _open(browser, site, f"/jobs/{parent}")
    _no_alert(browser)
    assert browser.execute_script("return window.__pwned === undefined")
    assert hostile_result in _text(browser, "#result-json") and "[redacted]" in _text(browser, "#result-json")
    assert "sk-result-never-shown" not in browser.page_source
    assert "75" in _text(browser, "#progress-value") and _text(browser, "#progress-message") == hostile_progress
    assert f"{child}" in _text(browser, "#job-children") and "succeeded" in _text(browser, "#job-children")
    _click(browser, f'#job-children a[href$="/jobs/{child}"]')
    assert f"Job {child}" in _text(browser, "h1")
    assert f"{parent}" in _text(browser, "#job-parents") and "hold" in _text(browser, "#on-parent-failure")
    assert _text(browser, "#graph-id").startswith(str(parent))
    _no_alert(browser)


def test_read_only_console_shows_no_action(browser, site, pg_dsn):
    job = site.app.enqueue("dies", {"group": "ro"}, any_task=True)
    site.wait_state(job, "dead")
    with ConsoleServer(pg_dsn, site.schema, "--read-only", log_dir=site.shots) as ro:
        for path in ("/", f"/jobs/{job}", "/dead", "/dead?task=dies&error_code=PERMANENT", "/jobs?state=dead"):
            browser.get(ro.url + path)
            assert browser.find_elements("css selector", "#read-only"), path
            assert not browser.find_elements("css selector", "form[method=post]"), path
            assert not browser.find_elements("css selector", "a[href*='/bulk/new']"), path
        # the badge and the user beside it, apart (a new user's trial read "read-onlyweb (admin)")
        assert _text(browser, "header.top .who") == "read-only web (admin)"
        badge, who = (browser.find_element("css selector", css).rect for css in ("#read-only", "#principal"))
        assert badge["x"] + badge["width"] + 4 <= who["x"], (badge, who)


def test_unauthenticated_visits_and_forms_without_their_token_are_refused(browser, site, pg_dsn):
    # tokens only: the challenge is Bearer, so the browser shows the refusal instead of a password prompt
    with ConsoleServer(pg_dsn, site.schema, env={"PGWORKER_WEB_TOKENS": "ops:operator:ops-token-0123456789"},
                       log_dir=site.shots) as guarded:
        for path in ("/", "/jobs", "/dead"):
            browser.get(guarded.url + path)
            assert "Authentication required" in _text(browser, "h1"), path
            assert not browser.find_elements("css selector", "#queues, #jobs-table, #dead-groups"), path
    job = site.app.enqueue("dies", {"group": "csrf"}, any_task=True)
    site.wait_state(job, "dead")
    browser.get(site.console.url + f"/jobs/{job}")
    browser.execute_script("document.querySelectorAll('input[name=csrf_token]').forEach(function (e) { e.remove(); })")
    _click(browser, "#action-replay")
    assert "CSRF" in _text(browser, "#error-message")
    assert site.state(job) == "dead"
