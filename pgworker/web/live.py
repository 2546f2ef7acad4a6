"""Live updates: Server-Sent Events that tell an open page to fetch itself again.

The overview listens on the schema's NOTIFY channel (``pgworker.store.notify_channel``:
enqueues, resumes and replays announce their queue there) through one LISTEN
connection per console process, and also ticks every ``TICK_SECONDS`` (completions send
no NOTIFY). A job's page and a bulk operation's page poll their row instead. Events are
debounced, so a burst of enqueues is one refresh; a page without JavaScript, or whose
stream breaks, is simply as fresh as its last load.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from typing import Any, AsyncIterator, Awaitable, Callable

import psycopg

from ..db import connect
from ..worker.service import Backoff

log = logging.getLogger("pgworker.web")

TICK_SECONDS = 5.0
DEBOUNCE_SECONDS = 0.5
KEEPALIVE_SECONDS = 15.0
POLL_SECONDS = 2.0
SUBSCRIBER_QUEUE = 4


class Broadcaster:
    """One LISTEN connection fanned out to every open overview (asyncio queues)."""

    def __init__(self, settings: Any, channel: str) -> None:
        self.settings = settings
        self.channel = channel
        self.subscribers: set[tuple[asyncio.AbstractEventLoop, asyncio.Queue[str]]] = set()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def subscribe(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue[str]]:
        entry = (asyncio.get_running_loop(), asyncio.Queue(maxsize=SUBSCRIBER_QUEUE))
        with self.lock:
            self.subscribers.add(entry)
            if self.thread is None:
                self.thread = threading.Thread(target=self._listen, name="pgworker-web-listen", daemon=True)
                self.thread.start()
        return entry

    def unsubscribe(self, entry: tuple[asyncio.AbstractEventLoop, asyncio.Queue[str]]) -> None:
        with self.lock:
            self.subscribers.discard(entry)

    def _publish(self, event: str) -> None:
        with self.lock:
            targets = list(self.subscribers)
        for loop, queue in targets:
            loop.call_soon_threadsafe(_offer, queue, event)

    def _listen(self) -> None:
        backoff = Backoff()
        dsn = self.settings.effective_listen_dsn
        while not self.stop.is_set():
            try:
                with connect(dsn, application_name="pgworker:web-listen") as conn:
                    conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(self.channel)))
                    backoff.reset()
                    self._publish("refresh")  # what happened while not listening
                    while not self.stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            self._publish("refresh")
                            break
            except Exception as exc:  # noqa: BLE001 - the pages stay right without it
                log.warning("live updates: LISTEN failed (%s); the overview refreshes on its timer", type(exc).__name__)
                self.stop.wait(backoff.next())

    def close_service(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(3)


def _offer(queue: "asyncio.Queue[str]", event: str) -> None:
    if not queue.full():
        queue.put_nowait(event)


async def overview_stream(broadcaster: Broadcaster, disconnected: Callable[[], Awaitable[bool]]) -> AsyncIterator[str]:
    """SSE frames for the overview: 'refresh' on a NOTIFY (debounced) or every tick."""
    entry = broadcaster.subscribe()
    queue = entry[1]
    try:
        yield "retry: 3000\n\n"
        while not await disconnected():
            try:
                await asyncio.wait_for(queue.get(), timeout=TICK_SECONDS)
                await asyncio.sleep(DEBOUNCE_SECONDS)
                while not queue.empty():
                    queue.get_nowait()
            except asyncio.TimeoutError:
                pass
            yield "event: refresh\ndata: {}\n\n"
    finally:
        broadcaster.unsubscribe(entry)


def fingerprint(value: Any) -> str:
    """A short digest of what a live row stream compares (``poll_stream``'s ``read()``),
    which its page renders into the stream's URL (``seen``)."""
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


async def poll_stream(read: Callable[[], Awaitable[Any]], disconnected: Callable[[], Awaitable[bool]], *,
                      until: Callable[[Any], bool], seen: str | None = None,
                      reconnected: bool = False) -> AsyncIterator[str]:
    """SSE frames for one row (a job, a bulk operation): 'refresh' when ``read()`` changes;
    ends after the change that makes ``until(value)`` true (a finished job).

    The page was rendered before this stream's first read: a change in between (a job
    cancelled while its page loaded after the cancel's redirect) was never sent, and the
    page showed the old state for good. So the page puts the :func:`fingerprint` of what
    it rendered in the stream's URL (``seen``), and a new stream whose first read differs
    opens with a 'refresh' (id 0). A reconnection (the browser sends Last-Event-ID:
    ``reconnected``) gets none: its URL's ``seen`` is the page's first render."""
    yield "retry: 3000\n\n"
    last = await read()
    if seen is not None and not reconnected and fingerprint(last) != seen:
        yield "id: 0\nevent: refresh\ndata: {}\n\n"
    quiet = 0.0
    while not await disconnected():
        await asyncio.sleep(POLL_SECONDS)
        value = await read()
        if value != last:
            last = value
            quiet = 0.0
            yield "event: refresh\ndata: {}\n\n"
            if until(value):
                return
        else:
            quiet += POLL_SECONDS
            if quiet >= KEEPALIVE_SECONDS:
                quiet = 0.0
                yield ": keepalive\n\n"
