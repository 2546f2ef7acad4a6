"""What pgworker raises when PostgreSQL refuses a statement to this role (SQLSTATE 42501,
insufficient_privilege): :class:`PermissionDenied`, the fix in its message.

Its own module, not :mod:`pgworker.errors`: the class is also psycopg's
``InsufficientPrivilege``, and ``import pgworker`` must not load psycopg (the worker's
fork server starts before it, docs/architecture.md "Start-up"). ``pgworker.PermissionDenied``
loads this module on first use.
"""

from __future__ import annotations

import psycopg

from .errors import PgworkerError

#: What each role of `pgworker sql grants` may do: the fix of a refusal.
PRIVILEGE_FIX = (
    "this role may not do that. The producer role of `pgworker sql grants --producer` may enqueue and "
    "read job state (result, wait_result, list_jobs), not a job's payload or errors (get_job) nor cancel or "
    "replay; the worker role claims and records outcomes; operator actions run as the schema's owner (the "
    "role that ran `pgworker migrate`). docs/reliability.md, 'Least privilege'")


class PermissionDenied(PgworkerError, psycopg.errors.InsufficientPrivilege):
    """PostgreSQL refused a statement to this role (SQLSTATE 42501).

    The message is the server's words and the fix (:data:`PRIVILEGE_FIX`), so that a log
    line of ``str(exc)`` keeps the fix: it was a note added to psycopg's exception
    (``add_note``), which only a traceback shows. Still a
    ``psycopg.errors.InsufficientPrivilege``, so code that catches that (or
    ``psycopg.Error``) goes on catching it: ``sqlstate`` is '42501', ``diag`` is the
    server's diagnostic, and ``refused`` psycopg's exception (also its ``__cause__``).
    """

    def __init__(self, message: str | None = None, refused: psycopg.Error | None = None) -> None:
        super().__init__(message)
        self.refused = refused

    @property
    def diag(self) -> psycopg.errors.Diagnostic:
        """The server's diagnostic (``message_primary``, ``schema_name``, ...) of the refusal."""
        return self.refused.diag if self.refused is not None else super().diag

    @classmethod
    def of(cls, exc: psycopg.Error) -> PermissionDenied:
        """The error for psycopg's ``exc``: the server's first line, then the fix."""
        said = exc.diag.message_primary or (str(exc).strip().splitlines() or ["permission denied"])[0]
        return cls(f"PostgreSQL refused the statement ({said}): {PRIVILEGE_FIX}", exc)
