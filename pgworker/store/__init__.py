"""The thin database boundary: one method per named statement in ``sql/queries/*.sql``.

Nothing else in pgworker touches a cursor. Methods take an open psycopg connection and
leave transaction control to the caller, except where a transition needs more than one
statement to stay correct (the ordering-key locks, the transition and the promotion of
the next job of a key; a limited queue's lock and its claim; a cancel and its audit
entry): those run in :func:`atomic`, a transaction of their own on an autocommit
connection, or simply inside the caller's transaction otherwise (never committing it).
Every write that can change which job heads an ordering key goes through
:mod:`pgworker.store.keyed` (lock the keys, run the statement, promote the next head).
"""

from __future__ import annotations

import json
from typing import Any
from .base import StoreBase, atomic, notify_channel


from .console import ConsoleStatements
from .effects import EffectStatements
from .dependencies import DependencyStatements
from .enqueue import EnqueueStatements
from .lifecycle import LifecycleStatements
from .maintenance import MaintenanceStatements
from .operations import OperationStatements
from .reads import QueueStats, ReadStatements
from .results import ResultStatements

__all__ = ["QueueStats", "Store", "atomic", "json_or_none", "notify_channel"]


class Store(EnqueueStatements, LifecycleStatements, MaintenanceStatements, OperationStatements, ReadStatements,
            ResultStatements, DependencyStatements, ConsoleStatements, EffectStatements, StoreBase):
    """Every named statement of one schema, one method each, grouped by area in the
    modules of this package as the statements are in ``sql/queries/``."""


def json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))
