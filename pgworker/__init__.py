"""pgworker: a PostgreSQL-backed job queue and multiprocess worker.

Jobs are rows. Workers claim them with ``FOR UPDATE SKIP LOCKED`` in one short
statement, run them outside any transaction under an expiring lease, and record each
outcome with a write fenced by the claim's token. See docs/architecture.md.
"""

__version__ = "0.1.0"

from .app import App  # noqa: E402
from .config import Settings  # noqa: E402
from .context import JobContext  # noqa: E402
from .errors import (  # noqa: E402
    AlreadyEnqueued,
    ConfigError,
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
from .effects.steps import NOT_DONE  # noqa: E402
from .jobs import ClaimedJob, FenceReport, JobState, Lease, Outcome, ReplayResult  # noqa: E402
from .producer import JobSpec  # noqa: E402
from .retry import FailureClass, RetryPolicy  # noqa: E402
from .tasks import Task  # noqa: E402

__all__ = [
    "App", "Settings", "JobContext", "Task", "JobSpec", "RetryPolicy", "FailureClass",
    "ClaimedJob", "Lease", "FenceReport", "JobState", "Outcome", "ReplayResult",
    "PgworkerError", "ConfigError", "InvalidName", "InvalidJob", "PayloadError", "InvalidPayload",
    "DatabaseUnavailable", "SchemaVersionError", "SchemaNotMigrated", "SchemaTooNew",
    "LeaseLost", "Permanent", "Retry", "Snooze", "JobCancelled", "UnknownTask",
    "QueuePaused", "AlreadyEnqueued", "StepError", "EffectUncertain", "NOT_DONE",
    "ResultNotReady", "JobDidNotSucceed", "JobNotFound", "ResultLost", "ResultTimeout",
    "__version__",
]
