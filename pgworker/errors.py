"""One exception hierarchy for pgworker.

Every error pgworker raises on purpose is a :class:`PgworkerError`. The first line of
each class's docstring is its default message; the message given at raise time names
the fix.
"""

from __future__ import annotations


class PgworkerError(Exception):
    """A pgworker operation failed."""

    def __init__(self, message: str | None = None) -> None:
        # the docstring's first line, not all of it (a break-it trial: Permanent("") stored
        # the whole docstring, its usage example included, as the job's error)
        blank = message is None or (isinstance(message, str) and not message.strip())
        super().__init__((self.__doc__ or type(self).__name__).strip().splitlines()[0] if blank else message)


class ConfigError(PgworkerError, ValueError):
    """A setting is invalid; the message names the setting and how to fix it."""


class InvalidName(ConfigError):
    """A queue, task or schema name is invalid."""


class PayloadError(PgworkerError, ValueError):
    """A job payload cannot be stored: not JSON-serialisable, or too large."""


class InvalidJob(PgworkerError, ValueError):
    """A job option is invalid (max_attempts, priority, run_at, delay)."""


class UnknownTask(InvalidJob):
    """The task name is not one of the App's registered tasks (likely a typo); pass
    ``any_task=True`` (CLI: ``--any-task``) to enqueue a task another worker handles."""


class DatabaseUnavailable(PgworkerError):
    """PostgreSQL cannot be reached; check the DSN (PGWORKER_DSN) and that the server is up."""


class DatabaseRefused(DatabaseUnavailable):
    """The server answered and refused the connection for a reason that retrying with the
    same settings cannot change: the DSN's database or role does not exist, or its
    credentials were refused (password, pg_hba.conf). A worker starting up exits on it
    (a drain run reports ``failed``) instead of retrying; the message names what to fix."""


class DatabaseBusy(PgworkerError):
    """The server answered, but a statement gave up: it waited past ``lock_timeout`` for a
    lock another session holds (SQLSTATE 55P03), ran past ``statement_timeout`` or was
    cancelled (57014), or lost a deadlock or a serialization conflict (40P01, 40001), or a
    migration changed what a prepared statement returns (0A000; the connection is replaced).
    Nothing the statement did was kept; ``sqlstate`` says which, the message names the
    fix (retry; find the session holding the lock; raise the timeout)."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class DatabaseReadOnly(DatabaseUnavailable):
    """The server accepts connections but refuses writes (a standby after a failover, or
    ``default_transaction_read_only`` is on); point PGWORKER_DSN at the writable primary."""


class PoolerError(ConfigError):
    """A transaction-mode pooler between pgworker and PostgreSQL broke something that needs
    a session; the message names the setting to change."""


class MissingGrants(ConfigError):
    """The role lacks privileges a worker needs on the schema; the message lists them and
    names ``pgworker sql grants --worker ROLE --apply``."""


class SchemaVersionError(PgworkerError):
    """The database schema does not match this version of pgworker."""


class SchemaNotMigrated(SchemaVersionError):
    """The pgworker schema is missing or behind; run `pgworker migrate`. ``absent``: no
    pgworker schema by that name at all (a typo or another case is likelier than an
    unmigrated database)."""

    absent = False


class SchemaTooNew(SchemaVersionError):
    """The database schema is newer than this pgworker knows; upgrade pgworker."""


class LeaseLost(PgworkerError):
    """The lease on this job is gone: its fencing token moved on or the lease expired.

    A fenced write (renew, complete, fail, release) updated zero rows. The caller is no
    longer the owner and must not act as one; another worker may be running the job.
    """

    def __init__(self, message: str | None = None, *, job_id: int | None = None,
                 lease_token: int | None = None, operation: str | None = None) -> None:
        self.job_id = job_id
        self.lease_token = lease_token
        self.operation = operation
        if message is None and job_id is not None:
            message = (f"lease lost on job {job_id} (lease token {lease_token}) during {operation}: "
                       "its lease expired or moved on (the job reaped or claimed again, or its lease presumed lost "
                       "here, unrenewed); this worker must not act as its owner")
        super().__init__(message)


class QueuePaused(PgworkerError):
    """The queue is paused: resume it first (`pgworker queue resume NAME`)."""


class JobNotFound(PgworkerError, LookupError):
    """No job has this id."""


class ResultNotReady(PgworkerError):
    """The job has not finished yet: it has no result to read (App.wait_result waits for one)."""


class JobDidNotSucceed(PgworkerError):
    """The job ended without succeeding (dead or cancelled): it has no result.

    ``job_id``, ``state`` ('dead' or 'cancelled') and ``code`` (its last error code) say
    how it ended; ``pgworker jobs show ID`` has its error history."""

    def __init__(self, message: str | None = None, *, job_id: int | None = None, state: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.job_id, self.state, self.code = job_id, state, code


class ResultLost(PgworkerError):
    """The job succeeded but its result was not stored: the claimer process died after
    the handler returned, and the result was too large for the shared-memory slot
    (docs/results.md). The job is not run again."""


class ResultTimeout(PgworkerError, TimeoutError):
    """App.wait_result gave up: the job had not finished within the timeout."""


class DedupeConflict(PgworkerError):
    """Another active job holds this dedupe key."""


class AlreadyEnqueued(DedupeConflict):
    """An enqueue with ``on_conflict='raise'`` found its dedupe key held: nothing was
    inserted. ``dedupe_key``: the key; ``job_id``: the id of the job holding it;
    ``held_by``: for a batch, {position in the batch: holder's id} (every refused job)."""

    def __init__(self, dedupe_key: str, job_id: int, *, held_by: "dict[int, int] | None" = None) -> None:
        self.dedupe_key = dedupe_key
        self.job_id = job_id
        self.held_by = dict(held_by) if held_by else {}
        more = f" ({len(self.held_by)} jobs of the batch refused; nothing of it was inserted)" if self.held_by else ""
        super().__init__(f"dedupe key {dedupe_key!r} is held by job {job_id}: nothing was enqueued{more}; "
                         "without on_conflict='raise' the enqueue returns the holder's id")

    def __reduce__(self) -> tuple[object, ...]:
        return (_already_enqueued, (self.dedupe_key, self.job_id, self.held_by))


def _already_enqueued(dedupe_key: str, job_id: int, held_by: "dict[int, int]") -> "AlreadyEnqueued":
    return AlreadyEnqueued(dedupe_key, job_id, held_by=held_by)


# --- control flow for handlers -------------------------------------------------------
# Handlers raise these (or return Retry/Snooze instances) to steer what happens next.


class Permanent(PgworkerError):
    """A permanent failure: the job goes to dead at once, without retries.

    ``raise Permanent("customer 42 does not exist")``. Use for failures that another
    attempt cannot fix (invalid input, a resource that is gone).
    """

    code = "PERMANENT"

    def __init__(self, reason: str = "permanent failure", *, code: str | None = None) -> None:
        super().__init__(reason if reason and str(reason).strip() else "permanent failure")
        if code:
            self.code = code


class InvalidPayload(Permanent):
    """The payload cannot be decoded by the handler; the job goes to dead with PAYLOAD_INVALID."""

    code = "PAYLOAD_INVALID"


class Retry(PgworkerError):
    """Ask for another attempt after ``after`` seconds instead of the policy's backoff.

    The attempt counts; when attempts are spent the job goes to dead as usual.
    """

    code = "RETRY"

    def __init__(self, after: float | None = None, reason: str = "retry requested") -> None:
        if after is not None and after < 0:
            raise ValueError("Retry(after=...) must be >= 0 seconds")
        self.after = after
        super().__init__(reason if reason and str(reason).strip() else "retry requested")

    def __reduce__(self) -> tuple[type, tuple[float | None, str]]:
        # pickled by its arguments, not by ``args`` (the reason alone: it would come back
        # as ``after``), so it crosses a process pool's boundary
        return type(self), (self.after, str(self))


class Snooze(PgworkerError):
    """Run the job again after ``seconds`` without spending an attempt."""

    def __init__(self, seconds: float) -> None:
        # NaN passes this check; the executor gives a NaN snooze the task's backoff (it
        # once ran the job again at once, thousands of times)
        if seconds < 0:
            raise ValueError("Snooze(seconds) must be >= 0")
        self.seconds = float(seconds)
        super().__init__(f"snoozed for {self.seconds:g} s")

    def __reduce__(self) -> tuple[type, tuple[float]]:
        return type(self), (self.seconds,)  # its argument, not its message (see Retry)


class JobCancelled(PgworkerError):
    """The job was cancelled while running; raise it from a handler to stop early."""


class StepError(Permanent):
    """A durable step or effect (``ctx.step``, ``ctx.effect``) that cannot be recorded:
    its result is not JSON (``STEP_RESULT_INVALID``) or too large
    (``STEP_RESULT_TOO_LARGE``, setting ``step_result_max_bytes``), the job has recorded
    as many as it may (``STEP_LIMIT``, setting ``step_max_per_job``), or its name is not
    1-200 printable characters (``STEP_NAME_INVALID``) or was completed by another step or
    effect of the same attempt (``STEP_NAME_REUSED``), or ``ctx.effect`` is called inside
    ``ctx.transaction()`` (``EFFECT_IN_TRANSACTION``). The attempt fails permanently: the
    same code would fail the same way again."""

    code = "STEP_RESULT_INVALID"


class EffectUncertain(Permanent):
    """An external effect was started by an earlier attempt that did not record its end,
    and the handler gave no ``reconcile`` function to ask the destination: the job goes
    dead with ``EFFECT_UNCERTAIN`` for an operator to resolve (`pgworker effects resolve`)."""

    code = "EFFECT_UNCERTAIN"
