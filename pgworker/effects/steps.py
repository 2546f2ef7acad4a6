"""Durable steps (``ctx.step``) and external effects (``ctx.effect``) of a job.

A **step** runs a function at most once across the job's attempts: its JSON result is
recorded against the job (``job_steps``, fenced by the lease token) and a later attempt
gets the recorded result without calling the function. Inside ``ctx.transaction()`` the
record is written on the transaction's connection and commits with the handler's
writes: a same-database step is then exactly-once. Outside one, the record commits on
its own right after the function returned: a crash between the two runs the function
again on the next attempt (at-least-once, for the few milliseconds between them).

An **effect** is a call to a system outside PostgreSQL. Before the call a ``started``
record (fenced, committed) carries a stable idempotency key, derived from the job and
the effect's name, which the call receives and passes to the destination; after the call
a ``done`` record holds its result. An attempt that finds ``started`` without ``done``
(an earlier attempt crashed or lost its lease in the call) does not call blindly again:
``reconcile(key)`` asks the destination; it returns the effect's result if it happened,
or :data:`NOT_DONE`, and the call is then made once more with the same key. Without
``reconcile``, the attempt fails :class:`pgworker.errors.EffectUncertain`
(``EFFECT_UNCERTAIN``, dead, counted) for an operator to resolve.

Results go through JSON both ways, so the first attempt and a later one see the same
value (a tuple comes back as a list). Bounds: ``step_max_per_job`` records per job,
``step_result_max_bytes`` per result (settings); breaking either, or a result that is
not JSON, fails the attempt permanently with a code naming which
(:class:`pgworker.errors.StepError`). A record the fence refuses raises
:class:`pgworker.LeaseLost`.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from typing import TYPE_CHECKING, Any, Callable

import psycopg

from ..errors import EffectUncertain, LeaseLost, StepError
from ..names import schema_flag

if TYPE_CHECKING:
    from ..context import JobContext

log = logging.getLogger("pgworker.effects")

NAME_MAX_CHARS = 200
# a JSON \u0000 escape (not an escaped backslash followed by "u0000"), which jsonb refuses
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class _NotDone:
    """What a ``reconcile`` function returns when the destination says the effect did not happen."""

    _instance: "_NotDone | None" = None

    def __new__(cls) -> "_NotDone":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "pgworker.NOT_DONE"


NOT_DONE: Any = _NotDone()


def effect_key(ctx: "JobContext", name: str) -> str:
    """The idempotency key of effect ``name`` of this job: the job's own key (stable
    across attempts and replays) and the name."""
    return f"{ctx.idempotency_key}:{name}"


def run_step(ctx: "JobContext", name: str, fn: Callable[[], Any]) -> Any:
    """``ctx.step(name, fn)`` (see the module)."""
    _check_name(name)
    _check_attempt(ctx, "step", name)
    result = _step(ctx, name, fn)
    _used(ctx, name)
    return result


def run_effect(ctx: "JobContext", name: str, fn: Callable[[str], Any],
               reconcile: Callable[[str], Any] | None = None) -> Any:
    """``ctx.effect(name, fn, reconcile=None)`` (see the module)."""
    _check_name(name)
    _check_attempt(ctx, "effect", name)
    result = _effect(ctx, name, fn, reconcile)
    _used(ctx, name)
    return result


def _step(ctx: "JobContext", name: str, fn: Callable[[], Any]) -> Any:
    res = _resources(ctx)
    conn, in_tx = _connection(ctx, res)
    found = res.store.step_get(conn, ctx.job_id, name)
    if found is not None and in_tx and name in ctx._tx.step_names:
        # recorded earlier in this block (and still there: a savepoint rolled back would
        # have taken it): the same reuse as outside one
        raise StepError(_reused(ctx, "step", name), code="STEP_NAME_REUSED")
    if found is not None:
        if found.kind != "step":
            raise StepError(f"job {ctx.job_id}: {name!r} is recorded as an effect, not a step; give the step "
                            "another name", code="STEP_NAME_INVALID")
        res.count("step_skipped", ctx.job.queue)
        return found.result
    value = fn()
    text = _result_json(ctx, name, value, res.settings.step_result_max_bytes)
    _record(ctx, res, conn, name, kind="step", status="done", text=text, key=None)
    if not in_tx:
        log.debug("job %s: step %r recorded", ctx.job_id, name)
    return json.loads(text)


def _effect(ctx: "JobContext", name: str, fn: Callable[[str], Any], reconcile: Callable[[str], Any] | None) -> Any:
    res = _resources(ctx)
    if ctx._tx.open:
        # the same code fails the same way on every attempt: permanent, not retried
        raise StepError(f"job {ctx.job_id}: ctx.effect({name!r}) inside ctx.transaction(): an effect's "
                        "'started' record must commit before its call; call ctx.effect outside the block",
                        code="EFFECT_IN_TRANSACTION")
    conn = res.connections.get()
    key = effect_key(ctx, name)
    found = res.store.step_get(conn, ctx.job_id, name)
    if found is not None and found.kind != "effect":
        raise StepError(f"job {ctx.job_id}: {name!r} is recorded as a step, not an effect; give the effect "
                        "another name", code="STEP_NAME_INVALID")
    if found is not None and found.status == "done":
        res.count("step_skipped", ctx.job.queue)
        return found.result
    if found is not None:  # started by an earlier attempt, never recorded done: did it happen?
        key = found.idempotency_key or key
        if reconcile is None:
            res.count("effect_uncertain", ctx.job.queue)
            flag = schema_flag(res.settings.schema)  # the hint, followed as printed, reaches this schema
            raise EffectUncertain(
                f"effect {name!r} (idempotency key {key}) was started by an earlier attempt that did not record "
                f"its end, and the handler gives no reconcile function: check the destination, then "
                f"`pgworker effects resolve {ctx.job_id} {shlex.quote(name)} --result JSON --replay{flag}` (it "
                f"happened) or `pgworker effects resolve {ctx.job_id} {shlex.quote(name)} --retry --replay{flag}` "
                "(it did not): --replay puts the dead job back to pending in the same command")
        answer = reconcile(key)
        if answer is not NOT_DONE:
            res.count("effect_reconciled", ctx.job.queue, "happened")
            text = _result_json(ctx, name, answer, res.settings.step_result_max_bytes)
            _done(ctx, res, conn, name, text, by="reconcile")
            return json.loads(text)
        res.count("effect_reconciled", ctx.job.queue, "not_happened")
    else:
        _record(ctx, res, conn, name, kind="effect", status="started", text=None, key=key)
    value = fn(key)
    text = _result_json(ctx, name, value, res.settings.step_result_max_bytes)
    _done(ctx, res, conn, name, text, by="worker")
    return json.loads(text)


def _check_attempt(ctx: "JobContext", kind: str, name: str) -> None:
    """Before anything runs: not after the job's transaction committed (the job has ended,
    so nothing more can be recorded: a trial saw the function run and its record refused
    as a lost lease), and not a name this attempt has completed (its recorded value would
    be returned again, the function skipped without a sign; a step whose function raised
    may be tried again under its name)."""
    if ctx._tx.committed:
        raise RuntimeError(f"job {ctx.job_id}: ctx.{kind}({name!r}) after ctx.transaction() committed the job's "
                           f"success: the job has ended, nothing more can be recorded, and the {kind} was not run; "
                           "do this work inside the transaction block or before it")
    names = ctx._step_names  # completed and committed: outside a transaction block
    if names is not None and name in names:
        raise StepError(_reused(ctx, kind, name), code="STEP_NAME_REUSED")


def _reused(ctx: "JobContext", kind: str, name: str) -> str:
    return (f"job {ctx.job_id}: the name {name!r} was already used by a step or effect of this attempt, so this "
            f"{kind} would return that one's recorded result without running: give each its own name (in a loop, "
            f"put the item in it: f\"{name}:{{item_id}}\")")


def _used(ctx: "JobContext", name: str) -> None:
    if ctx._tx.open:  # its record commits or rolls back with the block
        ctx._tx.step_names.add(name)
        return
    if ctx._step_names is None:
        ctx._step_names = set()
    ctx._step_names.add(name)


def _resources(ctx: "JobContext") -> Any:
    if ctx._effects is None:
        raise RuntimeError("ctx.step() and ctx.effect() need a context given by a worker (pgworker run, "
                           "pgworker.testing.drain); this one was built by hand")
    return ctx._effects


def _connection(ctx: "JobContext", res: Any) -> tuple[psycopg.Connection, bool]:
    """The open handler transaction's connection if there is one (the record commits
    with it), else the handler connection (autocommit: the record commits at once)."""
    if ctx._tx.open and ctx._tx.is_async:
        raise RuntimeError(f"job {ctx.job_id}: ctx.step() inside ctx.atransaction() is not supported (the step "
                           "API is synchronous); call it before the block, or use a sync handler's ctx.transaction()")
    if ctx._tx.open and ctx._tx.conn is not None:
        return ctx._tx.conn, True
    return res.connections.get(), False


def _check_name(name: Any) -> None:
    if not (isinstance(name, str) and 0 < len(name) <= NAME_MAX_CHARS and name.isprintable()):
        raise StepError(f"a step or effect name must be 1-{NAME_MAX_CHARS} printable characters, got {name!r:.80}",
                        code="STEP_NAME_INVALID")


def _result_json(ctx: "JobContext", name: str, value: Any, max_bytes: int) -> str:
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StepError(f"job {ctx.job_id}: the result of {name!r} is not JSON ({exc}); return a dict, list, "
                        "str, number, bool or None", code="STEP_RESULT_INVALID") from None
    if "\\u0000" in text and _NUL_ESCAPE.search(text):  # jsonb refuses \u0000
        raise StepError(f"job {ctx.job_id}: the result of {name!r} holds a NUL character, which PostgreSQL's "
                        "jsonb cannot store", code="STEP_RESULT_INVALID")
    try:
        size = len(text.encode())
    except UnicodeEncodeError:  # a lone surrogate: permanent, as every other refused result
        raise StepError(f"job {ctx.job_id}: the result of {name!r} holds a lone surrogate character (not valid "
                        "Unicode text), which PostgreSQL cannot store", code="STEP_RESULT_INVALID") from None
    if size > max_bytes:
        raise StepError(f"job {ctx.job_id}: the result of {name!r} is {size} bytes of JSON, over the "
                        f"{max_bytes} of step_result_max_bytes; store large data elsewhere and return its "
                        "reference (or raise PGWORKER_STEP_RESULT_MAX_BYTES)", code="STEP_RESULT_TOO_LARGE")
    return text


def _record(ctx: "JobContext", res: Any, conn: psycopg.Connection, name: str, *, kind: str, status: str,
            text: str | None, key: str | None) -> None:
    limit = res.settings.step_max_per_job
    owned, before, recorded = res.store.step_record(conn, ctx.job.lease, name, kind=kind, status=status,
                                                    result_json=text, key=key, max_steps=limit)
    operation = "step" if kind == "step" else "effect_started"
    if not owned:
        res.fenced(ctx, operation)
        raise LeaseLost(job_id=ctx.job_id, lease_token=ctx.lease_token, operation=operation)
    if before >= limit:
        raise StepError(f"job {ctx.job_id}: {name!r} would be record {before + 1}, over the {limit} of "
                        "step_max_per_job; fewer, larger steps (or raise PGWORKER_STEP_MAX_PER_JOB)",
                        code="STEP_LIMIT")
    if not recorded:  # the same name was recorded since we looked: only another owner can have done it
        res.fenced(ctx, operation)
        raise LeaseLost(f"job {ctx.job_id}: {name!r} was recorded by another attempt meanwhile; this attempt "
                        "is no longer the job's owner", job_id=ctx.job_id, lease_token=ctx.lease_token,
                        operation=operation)
    res.traced(ctx, operation, name)


def _done(ctx: "JobContext", res: Any, conn: psycopg.Connection, name: str, text: str, *, by: str) -> None:
    if not res.store.effect_done(conn, ctx.job.lease, name, text, by):
        res.fenced(ctx, "effect_done")
        raise LeaseLost(job_id=ctx.job_id, lease_token=ctx.lease_token, operation="effect_done")
    res.traced(ctx, "effect_done", name)
