"""pgworker: a PostgreSQL-backed job queue and multiprocess worker.

Jobs are rows. Workers claim them with ``FOR UPDATE SKIP LOCKED`` in one short
statement, run them outside any transaction under an expiring lease, and record each
outcome with a write fenced by the claim's token. See docs/architecture.md.

The public names other than the errors load their modules on first use (PEP 562), not
when the package is imported: ``pgworker run`` (the ``pgworker`` command is
``pgworker.cli``, inside this package) starts the claimers' fork server before psycopg,
prometheus_client and OpenTelemetry load, so that its imports and the supervisor's
overlap (docs/architecture.md, "Start-up"). ``from pgworker import App`` and
``pgworker.App`` work as before; type checkers see the imports below.
"""

from importlib import import_module as _import_module
from importlib.util import find_spec as _find_spec
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    AlreadyEnqueued,
    ConfigError,
    DatabaseBusy,
    DatabaseRefused,
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

if TYPE_CHECKING:
    from .app import App
    from .config import Settings
    from .context import JobContext
    from .effects.steps import NOT_DONE
    from .jobs import ClaimedJob, FenceReport, JobState, Lease, Outcome, ReplayResult
    from .jobspec import JobSpec
    from .privileges import PermissionDenied
    from .retry import FailureClass, RetryPolicy
    from .tasks import Task

#: Each lazily loaded public name -> the module that defines it.
_LAZY = {"App": ".app", "Settings": ".config", "JobContext": ".context", "NOT_DONE": ".effects.steps",
         "ClaimedJob": ".jobs", "FenceReport": ".jobs", "JobState": ".jobs", "Lease": ".jobs", "Outcome": ".jobs",
         "ReplayResult": ".jobs", "JobSpec": ".jobspec", "PermissionDenied": ".privileges", "FailureClass": ".retry", "RetryPolicy": ".retry",
         "Task": ".tasks"}

__all__ = [
    "App", "Settings", "JobContext", "Task", "JobSpec", "RetryPolicy", "FailureClass",
    "ClaimedJob", "Lease", "FenceReport", "JobState", "Outcome", "ReplayResult",
    "PgworkerError", "ConfigError", "InvalidName", "InvalidJob", "PayloadError", "InvalidPayload",
    "DatabaseUnavailable", "DatabaseRefused", "DatabaseBusy", "PermissionDenied", "SchemaVersionError",
    "SchemaNotMigrated", "SchemaTooNew",
    "LeaseLost", "Permanent", "Retry", "Snooze", "JobCancelled", "UnknownTask",
    "QueuePaused", "AlreadyEnqueued", "StepError", "EffectUncertain", "NOT_DONE",
    "ResultNotReady", "JobDidNotSucceed", "JobNotFound", "ResultLost", "ResultTimeout",
    "__version__",
]


if not TYPE_CHECKING:  # hidden from type checkers, so that a misspelt name stays an error there

    def __getattr__(name: str) -> Any:
        """A public name (its module loads now), or a submodule (``pgworker.retry``, as a
        package that imported its modules at once had them)."""
        module = _LAZY.get(name)
        if module is not None:
            value = getattr(_import_module(module, __name__), name)
        elif not name.startswith("_") and _find_spec(f"{__name__}.{name}") is not None:
            value = _import_module(f"{__name__}.{name}")
        else:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        globals()[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*(n for n in globals() if not n.startswith("_") or n == "__version__"), *_LAZY}
                      - {"TYPE_CHECKING", "Any"})
