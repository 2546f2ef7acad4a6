"""`pgworker jobs show` on a terminal: free text a handler (or a raw INSERT) stored cannot
write lines of its own: line breaks, tabs and other control characters are printed as
visible escapes; what is stored, and the --json output, are unchanged."""

from __future__ import annotations

import json

import pytest
from psycopg import sql

from pgworker.cli import main
from pgworker.testing import drain

pytestmark = pytest.mark.integration


def test_control_characters_of_stored_text_are_printed_as_escapes(app, conn, pg_dsn, capsys):
    @app.task(name="spoof")
    def spoof(payload, ctx):
        ctx.progress(0.3, "RED\r\nFAKE LOG LINE\tcol\x85c1\u2028sep")
        raise RuntimeError("boom\nFAKE ERROR LINE")

    job = app.enqueue("spoof", None, max_attempts=1)
    drain(app)
    # ctx.progress keeps a message on one line (its white space folded)
    assert app.get_job(job)["progress_message"] == "RED FAKE LOG LINE col c1 sep"
    # a raw INSERT or UPDATE is not bound by the API's checks: a code, a key and a progress
    # message with line breaks
    conn.execute(sql.SQL("UPDATE {}.jobs SET last_error_code = %s, ordering_key = %s, progress_message = %s "
                         "WHERE id = %s").format(sql.Identifier(app.settings.schema)),
                 ("CODE\nFAKE CODE LINE", "k\r\nFAKE KEY LINE", "RED\r\nFAKE LOG LINE\tcol\x85c1\u2028sep", job))
    stored = app.get_job(job)
    assert stored["progress_message"] == "RED\r\nFAKE LOG LINE\tcol\x85c1\u2028sep"  # stored as given
    capsys.readouterr()
    args = ["jobs", "show", str(job), "--dsn", pg_dsn, "--schema", app.settings.schema]
    assert main(args) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for fake in ("FAKE LOG LINE", "FAKE ERROR LINE", "FAKE KEY LINE", "FAKE CODE LINE"):
        assert fake in out and not any(line.startswith(fake) for line in lines), out
    assert "progress_message  RED\\r\\nFAKE LOG LINE\\tcol\\x85c1\\u2028sep" in out, out
    assert "ordering_key  k\\r\\nFAKE KEY LINE" in out and "last_error_code  CODE\\nFAKE CODE LINE" in out, out
    assert not any(c in out for c in "\r\t\x85\u2028"), repr(out)
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["progress_message"] == stored["progress_message"]
