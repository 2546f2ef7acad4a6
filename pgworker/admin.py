"""The operator's calls of :class:`pgworker.App` (a mixin, as :mod:`pgworker.aio` is for the
coroutines): cancel, replay, retry, prune and resolve an effect; pause, resume, configure
and delete a queue; read jobs, queues, their events and schedules; cancel or replay a
graph. Each delegates to :mod:`pgworker.operations` or :mod:`pgworker.graphs` with the
App's :class:`pgworker.core.Core`; the mixin sees nothing else of the App."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Sequence

import psycopg

from . import graphs, operations
from .jobs import REPLAY_LIMIT, ReplayResult
from .operations import PRUNE_BATCH, UNSET

if TYPE_CHECKING:
    from .core import Core
    from .schedules import Periodic


class Admin:
    """Operator actions (audited with ``actor``, default $PGWORKER_ACTOR or user@host), queue
    policies and reads; see each method."""

    core: Core
    schedules: dict[str, Periodic]

    # -- jobs -----------------------------------------------------------------------

    def cancel(self, job_id: int, *, actor: str | None = None,
               conn: psycopg.Connection | None = None, reason: str | None = None) -> str | None:
        """Cancel a job: pending or dead jobs become cancelled at once ('cancelled' is
        returned); a running job gets a cancellation request its worker sees at the next
        lease renewal ('running' is returned).

        Returns None, raising nothing and changing nothing, when the job has already
        finished (succeeded or cancelled) and when there is no job with that id in the
        App's schema (never enqueued, pruned, or another schema): ``get_job(job_id)``
        tells them apart (None: unknown). `pgworker cancel ID` makes both an error (exit
        1, naming which). An id that is not an int raises ``TypeError``; one outside 1 to
        2**63-1, ``ValueError``.

        ``reason``: kept in the audit trail (`jobs show`, the console), stripped; blank is
        none. Raises :class:`ConfigError` (nothing changed) for one longer than 500
        characters (:data:`pgworker.names.CANCEL_REASON_MAX_CHARS`) or not a string, as the
        command line, the API and bulk operations refuse it."""
        return operations.cancel(self.core, job_id, actor=actor, conn=conn, reason=reason)

    def replay(self, job_ids: Sequence[int] = (), *, queue: str | None = None, limit: int = REPLAY_LIMIT,
               actor: str | None = None, clean: bool = False) -> ReplayResult:
        """Put dead jobs back to pending (same ids, history kept, audited), each with a
        fresh retry budget (attempt 1 of its ``max_attempts`` again); by id, or up to
        ``limit`` (:data:`pgworker.jobs.REPLAY_LIMIT`, 10,000, as `pgworker dead replay
        --queue Q --all`) dead jobs of ``queue``, lowest ids first: call again for the rest
        while the result's ``limit_reached`` is true.
        Returns a :class:`ReplayResult`, the list of replayed ids with ``held_by`` ({id: id
        of the job holding its dedupe key}) and ``not_dead``: the ids asked for that were
        not replayed because they are not dead, or unknown (no such job in the App's
        schema), which raises nothing; ``get_job`` tells which. An id that is not an int
        raises ``TypeError`` (so does a single int: ``[42]``, not ``42``); one outside 1 to
        2**63-1, ``ValueError``. The jobs keep their recorded steps and effects
        (``ctx.step``, ``ctx.effect``) unless ``clean``: then they are forgotten in the
        same transaction and run again."""
        return operations.replay(self.core, job_ids, queue=queue, limit=limit, actor=actor, clean=clean)

    def resolve_effect(self, job_id: int, name: str, *, result: Any = UNSET, retry: bool = False,
                       actor: str | None = None) -> str:
        """Resolve an external effect left uncertain (``EFFECT_UNCERTAIN``: started by an
        attempt that never recorded its end): ``result`` (JSON) marks it done, as if the
        call had returned it (the destination says it happened); ``retry=True`` forgets the
        record, so that the next attempt calls again with the same idempotency key. Only
        while the job is not running; replay a dead job afterwards. Returns the job's
        state; raises :class:`ConfigError` when there is no such started effect, or when
        neither (or both) of ``result`` and ``retry=True`` is given (``result=None`` marks
        it done with a null result)."""
        return operations.resolve_effect(self.core, job_id, name, result=result, retry=retry, actor=actor)

    def prune(self, older_than: "float | timedelta", *, batch: int = PRUNE_BATCH) -> int:
        """Delete succeeded and cancelled jobs finished more than ``older_than`` (seconds
        or timedelta) ago, in batches of ``batch``; returns how many were deleted. (The
        worker's pruner does this by itself, per state: see the ``retention_*`` settings.)"""
        return operations.prune(self.core, older_than, batch=batch)

    def retry(self, job_id: int, *, actor: str | None = None) -> dict[str, Any] | None:
        """Retry now: a pending job scheduled later (a retry's backoff, a delay) becomes due
        at once, audited ('retried_now', with the run_at it had). Returns {id, queue,
        previous_run_at}, or None when it is not pending with a run_at still ahead."""
        return operations.retry(self.core, job_id, actor=actor)

    def get_job(self, job_id: int) -> dict[str, Any] | None:
        """The job's row (payload, error history, audit events), or None."""
        return operations.get_job(self.core, job_id)

    def list_jobs(self, *, queue: str | None = None, state: str | None = None,
                  limit: int = 50, graph_id: int | None = None, task: str | None = None) -> list[dict[str, Any]]:
        """Jobs, newest first, by queue, state and task (exact names), or the jobs of one
        graph (``graph_id``, by state and task). Raises :class:`InvalidName` for a queue
        or task name no job can have (empty, too long, control characters)."""
        return operations.list_jobs(self.core, queue=queue, state=state, limit=limit, graph_id=graph_id, task=task)

    # -- queues ---------------------------------------------------------------------

    def pause_queue(self, queue: str, *, actor: str | None = None) -> dict[str, Any]:
        """Pause ``queue``: no claim of any pod takes its jobs from the commit on; running
        jobs finish; enqueues go on. Audited with ``actor`` (default $PGWORKER_ACTOR or
        user@host). Returns the queue's row (paused_at, paused_by)."""
        return operations.pause_queue(self.core, queue, actor=actor)

    def resume_queue(self, queue: str, *, actor: str | None = None) -> bool:
        """Resume a paused queue (and wake idle claimers); False if it was not paused."""
        return operations.resume_queue(self.core, queue, actor=actor)

    def configure_queue(self, queue: str, *, concurrency_limit: "int | None" = UNSET,
                        rate_limit: "float | None" = UNSET, burst: "float | None" = None,
                        aging: "float | timedelta | None" = UNSET, actor: str | None = None) -> dict[str, Any]:
        """Set a queue's policies, enforced by every pod's claims (docs/scheduling.md).

        ``concurrency_limit``: most jobs of the queue running at once across all pods.
        ``rate_limit``: jobs per second (a token bucket holding up to ``burst`` tokens,
        default max(1, rate_limit)). ``aging``: seconds after which a due job is claimed
        before higher-priority work. None removes a setting; omitted ones stay as they
        are. Audited with ``actor``. Raises :class:`ConfigError` for invalid values.
        """
        return operations.configure_queue(self.core, queue, concurrency_limit=concurrency_limit, rate_limit=rate_limit,
                                          burst=burst, aging=aging, actor=actor)

    def delete_queue(self, queue: str, *, actor: str | None = None) -> dict[str, Any] | None:
        """Delete ``queue``'s settings row: its limits, token bucket and aging bound (a
        row is made by :meth:`pause_queue` or :meth:`configure_queue`, for a typo too).
        Jobs are not touched; those of the queue then run without its policies. Audited
        with ``actor``, the removed settings in the event's detail. Returns the removed
        settings (concurrency_limit, rate_per_second, rate_burst, aging_seconds), or None
        when the queue had no row.

        Raises :class:`QueuePaused` for a paused queue: deleting its row would resume it
        with no 'resumed' event and no wake-up; :meth:`resume_queue` first.
        """
        return operations.delete_queue(self.core, queue, actor=actor)

    def queue_usage(self, queue: str) -> dict[str, bool]:
        """Whether anything uses the queue name: ``has_jobs`` (claimable, running or dead
        jobs), ``recently_finished`` (among the last 1000 succeeded or cancelled), ``scheduled``
        (a recorded schedule enqueues into it), ``configured`` (a settings row), ``has_events``
        (an audit event), ``in_app`` (one of :meth:`queues`: a registered task's, or a configured one)."""
        return operations.queue_usage(self.core, queue)

    def queue_settings(self) -> list[dict[str, Any]]:
        """Every configured queue: pause, limits, aging, and its running jobs."""
        return operations.queue_settings(self.core)

    def queue_events(self, queue: str, *, limit: int = 50) -> list[dict[str, Any]]:
        """The audit trail of a queue (pause, resume, configuration), newest first."""
        return operations.queue_events(self.core, queue, limit=limit)

    def list_schedules(self) -> list[dict[str, Any]]:
        """Recorded and declared schedules with their next run (database clock)."""
        return operations.list_schedules(self.core, self.schedules)

    # -- graphs (docs/graphs.md) ----------------------------------------------------

    def cancel_graph(self, graph_id: int, *, actor: str | None = None, reason: str | None = None) -> dict[str, Any]:
        """Cancel every unfinished job of a graph; see :func:`pgworker.graphs.cancel_graph`
        (``reason`` as :meth:`cancel`'s: over 500 characters, refused before any job changes)."""
        return graphs.cancel_graph(self.core, graph_id, actor=actor, reason=reason)

    def replay_graph(self, graph_id: int, *, actor: str | None = None) -> graphs.ReplayedGraph:
        """Replay a graph's dead jobs and what their death cancelled; see :func:`pgworker.graphs.replay_graph`."""
        return graphs.replay_graph(self.core, graph_id, actor=actor)
