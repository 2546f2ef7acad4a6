"""The live updates of one row (a job page's SSE stream, over real HTTP).

A page is rendered before its stream's first read: a change in between (a job cancelled
while its page loaded after the cancel's redirect) was never sent, and the page showed
the old state for good (a CI run of tests/web/test_web_browser.py saw it: the job was
cancelled, its page still said running 20 s later). The page now puts the fingerprint of
what it rendered in the stream's URL (``seen``), and a stream whose first read differs
opens with a refresh (id 0); one that reads what the page shows, or a reconnection (the
browser sends Last-Event-ID), opens with none.
"""

from __future__ import annotations

import re

import pytest
import requests
from console_server import ConsoleServer

pytestmark = pytest.mark.integration


def _first_frames(console: ConsoleServer, path: str, headers: dict[str, str] | None = None, n: int = 2) -> list[str]:
    """The first ``n`` frames of an SSE stream (a frame ends with a blank line)."""
    frames: list[str] = []
    with requests.get(console.url + path, stream=True, timeout=10, headers=headers or {}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        buffer = ""
        for chunk in r.iter_content(chunk_size=None, decode_unicode=True):
            buffer += chunk
            while "\n\n" in buffer and len(frames) < n:
                frame, buffer = buffer.split("\n\n", 1)
                frames.append(frame)
            if len(frames) >= n:
                break
    return frames


def _quiet(console: ConsoleServer, path: str, headers: dict[str, str] | None = None) -> str:
    """All a stream sends within a second and a half (then requests' read timeout)."""
    received = ""
    with requests.get(console.url + path, stream=True, timeout=(10, 1.5), headers=headers or {}) as r:
        try:
            for chunk in r.iter_content(chunk_size=None, decode_unicode=True):
                received += chunk
        except requests.exceptions.ConnectionError:  # the read timeout, mid-stream
            pass
    return received


def test_a_stream_opens_with_a_refresh_when_the_row_changed_since_its_page_was_rendered(app, pg_dsn):
    job = app.enqueue("t", {"a": 1}, any_task=True, delay=3600)
    with ConsoleServer(pg_dsn, app.settings.schema) as console:
        page = console.get(f"/jobs/{job}").text
        url = re.search(r'data-live="([^"]+)"', page).group(1).replace("&amp;", "&")
        assert "?seen=" in url
        # nothing changed since the page: the stream opens quietly (the next frame would be a
        # keepalive, or a real change)
        assert _quiet(console, url) == "retry: 3000\n\n"
        app.cancel(job)  # a change between the page's render and its stream
        assert _first_frames(console, url) == ["retry: 3000", "id: 0\nevent: refresh\ndata: {}"]
        # a reconnection (Last-Event-ID) opens with none, whatever its URL says
        assert _quiet(console, url, {"Last-Event-ID": "0"}) == "retry: 3000\n\n"
