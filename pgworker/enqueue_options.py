"""The keyword options of an enqueue, as types: what ``Task.enqueue``,
``Task.aenqueue`` and ``pgworker.contrib.django.enqueue`` accept besides the payload
(``**options: Unpack[EnqueueOptions]``), so that a type checker catches a misspelt option
(``dealy=5``) or a wrong value (``on_conflict="explode"``) before it runs. The meaning of
each is :meth:`pgworker.App.enqueue`'s."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal, Sequence, TypedDict

import psycopg

#: What an enqueue does when its dedupe key is held: return the holder's id, or raise
#: :class:`pgworker.AlreadyEnqueued`.
OnConflict = Literal["return", "raise"]


class JobOptions(TypedDict, total=False):
    """A job's options (each as :meth:`pgworker.App.enqueue` documents it)."""

    queue: str | None
    priority: int | None
    run_at: datetime | None
    delay: float | timedelta | None
    max_attempts: int | None
    dedupe_key: str | None
    ordering_key: str | None
    dedupe_window: float | timedelta | None
    ordering_on_dead: Literal["block", "skip"] | None
    depends_on: Sequence[int] | None
    on_parent_failure: Literal["hold", "cancel"] | None
    graph_id: int | None
    any_task: bool
    on_conflict: OnConflict


class EnqueueOptions(JobOptions, total=False):
    """:class:`JobOptions` and the connection whose transaction the enqueue joins."""

    conn: psycopg.Connection | None


class AsyncEnqueueOptions(JobOptions, total=False):
    """:class:`JobOptions` and the async connection whose transaction the enqueue joins."""

    conn: psycopg.AsyncConnection | None
