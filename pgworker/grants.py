"""Least-privilege GRANTs for a producer, a worker and a read-only console (viewer) role
(``pgworker sql grants``).

The statements live in ``sql/grants.sql`` (one named block per role). Roles and the
schema are quoted with ``psycopg.sql.Identifier``, so any role name is safe. The roles
must exist already (``CREATE ROLE`` is the operator's call: passwords, LOGIN, pooling).
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources

import psycopg
from psycopg import sql

from .errors import ConfigError
from .names import check_schema_name

_NAME = re.compile(r"^-- name: (?P<name>[a-z_]+)\s*$", re.MULTILINE)


@lru_cache(maxsize=None)
def _blocks() -> dict[str, list[str]]:
    """{role kind: [statement template, ...]} from grants.sql (comments dropped)."""
    text = resources.files("pgworker.sql").joinpath("grants.sql").read_text(encoding="utf-8")
    out: dict[str, list[str]] = {}
    matches = list(_NAME.finditer(text))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = "\n".join(line for line in text[m.end():end].splitlines() if not line.lstrip().startswith("--"))
        out[m.group("name")] = [s.strip() for s in body.split(";") if s.strip()]
    return out


def grant_statements(schema: str, *, producer: str | None = None, worker: str | None = None,
                     viewer: str | None = None) -> list[sql.Composed]:
    """The GRANT statements for the given roles on ``schema``.

    Raises :class:`ConfigError` when neither role is given or a name is empty, and
    :class:`InvalidName` for a schema name PostgreSQL would not keep as is.
    """
    check_schema_name(schema)
    if not producer and not worker and not viewer:
        raise ConfigError("name at least one role: --producer ROLE, --worker ROLE and/or --viewer ROLE")
    roles = {"producer": producer, "worker": worker, "viewer": viewer}
    out: list[sql.Composed] = []
    for kind, role in roles.items():
        if role is None:
            continue
        if not isinstance(role, str) or not role or len(role.encode()) > 63:
            raise ConfigError(f"--{kind} must be a role name of 1-63 bytes, got {role!r}")
        for template in _blocks()[kind]:
            out.append(sql.SQL(template).format(schema=sql.Identifier(schema), **{kind: sql.Identifier(role)}))
    return out


def render(statements: list[sql.Composed], conn: psycopg.Connection | None = None) -> str:
    """The statements as SQL text, each ending with a semicolon."""
    return "\n".join(s.as_string(conn).strip() + ";" for s in statements)


def apply(conn: psycopg.Connection, statements: list[sql.Composed]) -> None:
    """Run the statements in one transaction (as the schema's owner)."""
    with conn.transaction():
        for s in statements:
            conn.execute(s)
