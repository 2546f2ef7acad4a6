"""Test helpers: test your own tasks against a real PostgreSQL without starting a worker.

- :func:`drain` runs an App's due jobs in the test's process until none is due, through
  the worker's own claim, executor and fenced writes, and returns a
  :class:`DrainResult` (attempts by outcome, each job's final row).
- :func:`assert_enqueued`, :func:`refute_enqueued` and :func:`enqueued_jobs` check what
  was enqueued, filtering in SQL and reading the newest candidates first; a failure lists
  what was enqueued instead, and a read cut at its ``limit`` is never a silent answer
  (:class:`TooManyJobs`).
- :func:`throwaway_schema` and :func:`bind`: a migrated schema of the test's own, and
  your module-level App pointed at it for the test.
- The pytest plugin (:mod:`pgworker.testing.plugin`, loaded automatically) provides
  the fixtures ``pgworker_dsn``, ``pgworker_schema`` and ``pgworker_app``.

See docs/testing.md. Importing this module does not import pytest.
"""

from .drain import DEFAULT_MAX_JOBS, DrainedAttempt, DrainLimitExceeded, DrainResult, drain
from .enqueued import ANY, TooManyJobs, assert_enqueued, enqueued_jobs, refute_enqueued
from .rows import JobRow
from .schema import bind, dsn_from_env, throwaway_schema

__all__ = [
    "drain", "DrainResult", "DrainedAttempt", "DrainLimitExceeded", "DEFAULT_MAX_JOBS",
    "assert_enqueued", "refute_enqueued", "enqueued_jobs", "ANY", "JobRow", "TooManyJobs",
    "bind", "throwaway_schema", "dsn_from_env",
]
