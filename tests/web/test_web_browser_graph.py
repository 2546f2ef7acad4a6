"""The console's graph filter in a real browser (tests/web/test_web_browser.py's site:
a real `pgworker run` and `pgworker web`): a job page's graph id opens the jobs list of
that graph, the filter form's graph field, and a bulk replay of a graph's dead job."""

from __future__ import annotations

import pytest
from pg import wait_until
import test_web_browser
from test_web_browser import _click, _no_alert, _on_fresh, _open, _text, _type
from worker import q

pytestmark = [pytest.mark.acceptance, pytest.mark.web]
site = test_web_browser.site  # the module's own site (a module-scoped fixture): a worker and a console


def test_a_graph_is_listed_from_a_job_page_and_its_dead_jobs_replayed_in_bulk(browser, site):
    """A job page's graph id opens the jobs list filtered by that graph (a trial could
    only follow parent and child links); the filter form's graph field takes an id and
    refuses anything else with the fix; "Replay all" on the graph's list replays its dead
    job (a real worker ran and failed it), not the dead jobs of the same task elsewhere."""
    import pgworker
    from selenium.webdriver.common.by import By

    root, dead, ok = site.app.enqueue_many([pgworker.JobSpec("quick", {}, ref="r"),
                                            pgworker.JobSpec("dies", {"group": "graph"}, depends_on=["r"]),
                                            pgworker.JobSpec("quick", {}, depends_on=["r"])], any_task=True)
    outside = site.app.enqueue("dies", {"group": "graph"}, any_task=True)  # same task and group, no graph
    for job, state in ((root, "succeeded"), (dead, "dead"), (ok, "succeeded"), (outside, "dead")):
        site.wait_state(job, state)
    graph = q(site.conn, site.schema, "SELECT graph_id FROM {s}.jobs WHERE id = %s", dead)[0][0]

    def listed():
        return sorted(int(r.get_attribute("data-job"))
                      for r in browser.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr[data-job]"))

    _open(browser, site, f"/jobs/{dead}")
    _click(browser, "#graph-link")
    _text(browser, "#jobs-table")
    assert browser.current_url.endswith(f"/jobs?graph={graph}") and listed() == sorted([root, dead, ok])
    assert browser.find_element(By.NAME, "graph").get_attribute("value") == str(graph)
    assert f"jobs of graph {graph}" in _text(browser, "#scope")
    _open(browser, site, "/jobs")
    _type(browser, "#filters input[name=graph]", "12a")
    _click(browser, "#filters button[type=submit]")
    assert "write ids as plain digits 0-9" in _text(browser, "#filter-error")
    browser.get_log("browser")  # that page's 400 is logged as an error: expected, and read here
    browser.find_element(By.NAME, "graph").clear()
    _type(browser, "#filters input[name=graph]", str(graph))
    _on_fresh(browser, "#filters select[name=state]", lambda e: e.send_keys("dead"))
    _click(browser, "#filters button[type=submit]")
    _text(browser, "#jobs-table")
    assert listed() == [dead], browser.current_url
    site.heal("graph")
    browser.find_element(By.LINK_TEXT, "Replay all").click()
    assert "1" in _text(browser, "#bulk-count") and f"graph {graph}" in _text(browser, "main")
    _click(browser, "#bulk-start")
    _text(browser, "#op-state")
    wait_until(lambda: _open(browser, site, browser.current_url.replace(site.console.url, ""))
               and _text(browser, "#op-state") == "done", timeout=60, message="the operation to finish")
    assert _text(browser, "#op-applied") == "1"
    site.wait_state(dead, "succeeded")
    assert site.state(outside) == "dead"
    _no_alert(browser)
