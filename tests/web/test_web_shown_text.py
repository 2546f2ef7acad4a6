"""What the console shows of stored text it did not write: a task name a raw SQL writer
stored with ESC or a bidi override (U+202E; the API refuses both) reads as its visible
escape, as the CLI prints it, on the list and the job pages; a form that posts a
filter back (a bulk action's confirmation) keeps the exact name."""

from __future__ import annotations

import html
import re

import pytest
from console_server import ConsoleServer
from worker import q

pytestmark = pytest.mark.integration

TOKEN = "ops:operator:shown-token-0123456789"
AUTH = {"Authorization": "Bearer shown-token-0123456789"}
SPOOF = "invoice\u202etxt.exe"   # shows as "invoiceexe.txt" where it is not escaped
ESCAPES = "paint\x1b[31mred"     # a terminal or a page would act on it
HTMLISH = 'a<b>&"c\''             # printable: the API accepts it, escaped for HTML alone


def test_control_characters_of_stored_names_show_as_escapes_and_forms_keep_them_exact(app, pg_dsn, conn):
    schema = app.settings.schema
    spoof, escapes = (q(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload) VALUES ('default', %s, '{{}}') "
                        "RETURNING id", name)[0][0] for name in (SPOOF, ESCAPES))
    app.enqueue(HTMLISH, {}, any_task=True)
    with ConsoleServer(pg_dsn, schema, env={"PGWORKER_WEB_TOKENS": TOKEN}, app=None) as console:
        for path in ("/jobs", f"/jobs/{spoof}", f"/jobs/{escapes}"):
            page = console.get(path, headers=AUTH)
            assert page.status_code == 200, (path, page.text[:500])
            assert "\u202e" not in page.text and "\x1b" not in page.text, path
        listed = console.get("/jobs", headers=AUTH).text
        assert "invoice\\u202etxt.exe" in listed and "paint\\x1b[31mred" in listed

        confirm = console.get("/bulk/new", headers=AUTH, params={"kind": "cancel", "state": "pending",
                                                                 "task": HTMLISH})
        assert confirm.status_code == 200, confirm.text[:500]
        posted = re.search(r'<input type="hidden" name="task" value="([^"]*)">', confirm.text)
        assert posted and html.unescape(posted.group(1)) == HTMLISH  # what the action acts on
        assert HTMLISH not in confirm.text  # escaped wherever it is shown
        assert 'name="expected" value="1"' in confirm.text  # the one job of that name
