"""pgworker: a PostgreSQL-backed job queue and multiprocess worker.

Jobs are rows. Workers claim them with ``FOR UPDATE SKIP LOCKED`` in one short
statement, run them outside any transaction under an expiring lease, and record each
outcome with a write fenced by the claim's token. See docs/architecture.md.
"""

from ._version import __version__
from .app import App
from .config import Settings
from .context import JobContext
from .errors import (
    AlreadyEnqueued,
    ConfigError,
    DatabaseBusy,
    DatabaseUnavailable,
    EffectUncertain,
    InvalidJob,
    InvalidName,
    InvalidPayload,
    JobCancelled,
    JobDidNotSucceed,
    JobNotFound,
    LeaseLost,
    PayloadError,
    Permanent,
    PgworkerError,
    QueuePaused,
    ResultLost,
    ResultNotReady,
    ResultTimeout,
    Retry,
    SchemaNotMigrated,
    SchemaTooNew,
    SchemaVersionError,
    Snooze,
    StepError,
    UnknownTask,
)
from .effects.steps import NOT_DONE
from .jobs import ClaimedJob, FenceReport, JobState, Lease, Outcome, ReplayResult
from .jobspec import JobSpec
from .retry import FailureClass, RetryPolicy
from .tasks import Task

__all__ = [
    "App", "Settings", "JobContext", "Task", "JobSpec", "RetryPolicy", "FailureClass",
    "ClaimedJob", "Lease", "FenceReport", "JobState", "Outcome", "ReplayResult",
    "PgworkerError", "ConfigError", "InvalidName", "InvalidJob", "PayloadError", "InvalidPayload",
    "DatabaseUnavailable", "DatabaseBusy", "SchemaVersionError", "SchemaNotMigrated", "SchemaTooNew",
    "LeaseLost", "Permanent", "Retry", "Snooze", "JobCancelled", "UnknownTask",
    "QueuePaused", "AlreadyEnqueued", "StepError", "EffectUncertain", "NOT_DONE",
    "ResultNotReady", "JobDidNotSucceed", "JobNotFound", "ResultLost", "ResultTimeout",
    "__version__",
]
