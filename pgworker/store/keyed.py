"""The one keyed-transition path: every write that can change which job heads an
ordering key goes through :meth:`KeyedTransitions.keyed_plan` (docs/scheduling.md,
docs/architecture.md).

A keyed transition is three steps, always in this order:

1. lock the ordering keys it may touch (``ordering_keys_lock``: transaction-level advisory
   locks in hash order, BEFORE any job row lock, so that two writers never wait on each
   other in a cycle; maintenance tries them instead, ``ordering_keys_try_lock``, and skips
   a key locked elsewhere; the pruner tries them inside its statement);
2. run the statement(s) that change the jobs (:data:`KEYED_STATEMENTS`), which can only be
   built through the :class:`KeyedScope` the path hands them (``StoreBase._step`` and
   ``_exec`` refuse those names);
3. promote the next head of each key the statement says it changed
   (``ordering_keys_promote``, a new statement: its snapshot sees every job committed by
   the writers that held the keys before us), only ever a key this transaction holds.

Who decides which job heads a key is one piece of SQL, the fragment ``ordering_key_head``
(sql/queries/ordering.sql), shared by the promotion and by the inserts' blocked flag.
Callers (the methods of the other store modules) say which keys, which statement, and
which keys of its rows changed; the path holds the rule.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence, TypeVar

import psycopg

from ..jobs import Lease
from .base import StoreBase
from .plan import Exec, Plan, atomically, run

T = TypeVar("T")

#: The named statements that may change which job heads an ordering key: they run only
#: inside :meth:`KeyedTransitions.keyed_plan` (tests/unit/test_keyed_path.py checks that
#: every statement writing jobs is here or in :data:`NOT_HEAD_CHANGING`).
KEYED_STATEMENTS = frozenset({
    "job_insert", "jobs_insert_many",                       # a new job of a key: blocked or not
    "job_complete", "job_fail", "job_release", "job_snooze", "job_cancel_finish",  # outcomes
    "job_cancel", "jobs_replay",                            # operator actions
    "jobs_reap", "jobs_prune",                              # maintenance
})

#: The path's own statements: nothing else runs them.
PATH_STATEMENTS = frozenset({"ordering_keys_lock", "ordering_keys_try_lock", "ordering_keys_promote"})

#: Statements that write jobs but can never change a key's head, and why.
NOT_HEAD_CHANGING: Mapping[str, str] = {
    "job_insert_plain": "inserts a job without an ordering key",
    "jobs_insert_batch": "inserts jobs without ordering keys (the keyed ones take jobs_insert_many)",
    "jobs_insert_graph": "jobs with dependencies carry no ordering key (refused in pgworker.dependencies)",
    "schedule_fire": "a schedule's job has no ordering key",
    "job_claim": "claims only heads (not blocked); a running head is still its key's head",
    "job_take_over": "changes a running job's lease owner only",
    "job_renew": "extends a lease only", "job_renew_skip_locked": "extends leases only",
    "job_progress": "records progress only",
    "job_reap_failure_note": "notes an error on a job left running",
    "dedupe_holders": "releases a succeeded job's dedupe hold (a succeeded job heads nothing)",
    "job_retry_now": "changes a pending job's run_at only",
    "job_parents_lock": "marks parents has_children",
    "dependents_requeue": "requeues jobs with dependencies, which carry no ordering key",
    "testing_run_now": "changes a pending job's run_at only",
}

#: How a keyed transition takes its keys' locks: wait for them (every caller that is
#: asked to do something), try them and skip the others (the reaper: maintenance never
#: waits), or in the statement itself (the pruner: the try-lock is a filter of its scan).
LockMode = str
WAIT, TRY, IN_STATEMENT = "wait", "try", "in_statement"


class KeyedScope(NamedTuple):
    """What a keyed transition's body may use: the keys whose locks it holds and the
    keyed statements, as plan steps."""

    granted: frozenset[str]
    queries: Mapping[str, str]

    def step(self, name: str, params: Mapping[str, Any] | None = None) -> Exec:
        """The keyed statement ``name`` as a plan step (answered with its rows)."""
        return Exec(self.queries[name], params)

    def rows(self, name: str, params: Mapping[str, Any] | None = None) -> Plan[list[Any]]:
        """A body of one statement: its rows."""
        out: list[Any] = yield self.step(name, params)
        return out


def no_heads(_: Any) -> tuple[()]:
    """For a transition that changes no existing head (an insert decides its own job's
    blocked flag with the head probe; nothing else of the key moves)."""
    return ()


def distinct_keys(keys: Iterable[str | None]) -> list[str]:
    """The keys, without None and duplicates, sorted (the order the statements take them in)."""
    return sorted({k for k in keys if k is not None})


class KeyedTransitions(StoreBase):
    """Lock the keys, run the statement, promote the next head: the one path of every
    keyed write."""

    def _step(self, name: str, params: dict[str, Any] | None = None, prepare: bool | None = None) -> Exec:
        _refuse_keyed(name)
        return super()._step(name, params, prepare)

    def _exec(self, conn: psycopg.Connection, name: str, params: dict[str, Any] | None = None,
              prepare: bool | None = None) -> psycopg.Cursor:
        _refuse_keyed(name)
        return super()._exec(conn, name, params, prepare)

    def keyed_plan(self, keys: Iterable[str | None], body: Callable[[KeyedScope], Plan[T]],
                   heads: Callable[[T], Iterable[str | None]], *, lock: LockMode = WAIT) -> Plan[T]:
        """The keyed transition as a plan: lock ``keys`` (as ``lock`` says), run
        ``body(scope)``, then promote the keys ``heads(result)`` names (those whose head
        may have ended), in a new statement. Returns the body's result.

        Run it atomically (``Atomic``, or inside a transaction the caller opened): the
        locks are transaction-level. With ``lock=TRY`` the body reads ``scope.granted``
        and leaves the jobs of the other keys alone; with ``lock=IN_STATEMENT`` the body's
        statement tries the locks itself and ``heads`` names only keys it holds.
        """
        wanted = distinct_keys(keys)
        if lock == WAIT:
            if wanted:
                yield Exec(self.queries["ordering_keys_lock"],
                           {"namespace": self._ordering_namespace, "keys": wanted})
            granted = frozenset(wanted)
        elif lock == TRY:
            rows = (yield Exec(self.queries["ordering_keys_try_lock"],
                               {"namespace": self._ordering_namespace, "keys": wanted})) if wanted else []
            granted = frozenset(r[0] for r in rows)
        elif lock == IN_STATEMENT:
            granted = frozenset()
        else:
            raise ValueError(f"keyed_plan: lock must be {WAIT!r}, {TRY!r} or {IN_STATEMENT!r}, got {lock!r}")
        result = yield from body(KeyedScope(granted, self.queries))
        changed = distinct_keys(heads(result))
        if lock != IN_STATEMENT:
            changed = [k for k in changed if k in granted]  # never promote a key we do not hold
        if changed:
            yield Exec(self.queries["ordering_keys_promote"], {"keys": changed, "channel": self.channel})
        return result

    def keyed_rows(self, conn: psycopg.Connection, name: str, params: dict[str, Any],
                   keys: Iterable[str | None], key_of: Callable[[tuple[Any, ...]], str | None]) -> list[Any]:
        """One keyed statement on ``conn``: its rows. ``key_of(row)`` is the key whose head
        the row's transition may have ended, or None. Atomic when there are keys; a
        statement without keys runs alone (no transaction of its own, no promotion)."""
        wanted = distinct_keys(keys)
        plan = self.keyed_plan(wanted, lambda scope: scope.rows(name, params),
                               lambda rows: [key_of(r) for r in rows])
        result: list[Any] = run(conn, atomically(plan) if wanted else plan)
        return result

    # -- the keys a transition takes ------------------------------------------------

    def ordering_keys_of(self, conn: psycopg.Connection, ids: Sequence[int]) -> dict[int, str]:
        """{job id: ordering key} for those of ``ids`` that have one."""
        return run(conn, self.ordering_keys_of_plan(ids))

    def ordering_keys_of_plan(self, ids: Sequence[int]) -> Plan[dict[int, str]]:
        if not ids:
            return {}
        rows = yield self._step("jobs_ordering_keys", {"ids": list(ids)})
        return {r[0]: r[1] for r in rows}

    def _keys_for(self, conn: psycopg.Connection, leases: Sequence[Lease],
                  ordering_keys: Iterable[str | None] | None) -> list[str | None]:
        """The ordering keys of ``leases``' jobs: as the caller knows them, or read first
        (an ordering key never changes), so that the key locks precede the row locks."""
        if ordering_keys is not None:
            return list(ordering_keys)
        return list(self.ordering_keys_of(conn, [le.job_id for le in leases]).values())


def _refuse_keyed(name: str) -> None:
    if name in KEYED_STATEMENTS or name in PATH_STATEMENTS:
        raise RuntimeError(f"statement {name!r} may change which job heads an ordering key: run it through "
                           "KeyedTransitions.keyed_plan (pgworker/store/keyed.py)")
