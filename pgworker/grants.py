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


def apply(conn: psycopg.Connection, statements: list[sql.Composed], schema: str | None = None,
          roles: dict[str, str | None] | None = None) -> None:
    """Run the statements in one transaction (as the schema's owner), then, given
    ``schema``, check that each role of ``roles`` ({kind: role or None}) holds its block. Raises :class:`ConfigError`
    naming what a role still lacks: PostgreSQL only warns ("no privileges were granted")
    when the connected role may not grant, so without the check a GRANT run as another
    role said "granted" and granted nothing."""
    with conn.transaction():
        for s in statements:
            conn.execute(s)
    for kind, role in (roles or {}).items():
        lacking = missing_privileges(conn, schema, kind, role=role) if role and schema else []
        if lacking:
            raise ConfigError(
                f"role {current_role(conn)!r} could not grant {kind} {role!r} what it needs on schema {schema!r} "
                f"(PostgreSQL granted only what this role may pass on); still missing: {'; '.join(lacking)}. "
                f"Run `pgworker sql grants ... --apply` as the schema's owner (the role that ran "
                f"`pgworker migrate`: --dsn with its DSN), or print the SQL without --apply for the owner to run")


def current_role(conn: psycopg.Connection) -> str:
    """The role privileges are checked and granted as: current_user (a login role whose
    `SET role` default names another makes it differ from the DSN's user)."""
    row = conn.execute("SELECT current_user").fetchone()
    return str(row[0]) if row else conn.info.user


# One GRANT of grants.sql: its privileges, the object's kind and the object.
_GRANT = re.compile(r"^GRANT (?P<privs>.+?) ON (?:(?P<kind>SCHEMA|SEQUENCE|FUNCTION) )?(?P<objects>\{schema\}.*?) "
                    r"TO \{\w+\}$", re.DOTALL)
_OBJECT = re.compile(r"\{schema\}(?:\.\w+(?:\([^)]*\))?)?")
_PRIVILEGE = re.compile(r"(?P<name>[A-Z]+)(?: \((?P<columns>[^)]*)\))?")


def _checks(kind: str) -> list[tuple[str, str, str, str | None]]:
    """The privileges a ``kind`` block of grants.sql gives, as (object kind, object
    template, privilege, column or None), one per privilege and column. Raises
    ValueError on a statement this reader does not know (a test reads every block)."""
    out: list[tuple[str, str, str, str | None]] = []
    for statement in _blocks()[kind]:
        m = _GRANT.match(" ".join(statement.split()))
        if m is None:
            raise ValueError(f"grants.sql: cannot read {statement!r}")
        obj_kind = (m.group("kind") or "TABLE").lower()
        objects = _OBJECT.findall(m.group("objects"))
        if ", ".join(objects) != m.group("objects"):
            raise ValueError(f"grants.sql: cannot read the objects of {statement!r}")
        for obj in objects:
            for p in _PRIVILEGE.finditer(m.group("privs")):
                columns = [c.strip() for c in (p.group("columns") or "").split(",") if c.strip()]
                for column in columns or [None]:
                    out.append((obj_kind, obj, p.group("name"), column))
    return out


def missing_privileges(conn: psycopg.Connection, schema: str, kind: str = "worker",
                       skip: frozenset[str] = frozenset(), role: str | None = None) -> list[str]:
    """What the connected role (or ``role``) lacks of what ``pgworker sql grants --<kind>`` gives on
    ``schema``, one entry per privilege and object, as ['UPDATE (state, run_at, attempts,
    lease_owner, and 14 more) ON jobs', 'USAGE ON jobs_id_seq', ...] (empty when it has it all: an
    owner or a superuser always has). ``skip``: objects not to check, by name (e.g. the
    pruner's functions when pruning is off). Read with PostgreSQL's has_*_privilege
    functions: one statement, nothing is written. The schema must be migrated (a missing
    object raises psycopg's UndefinedTable / UndefinedFunction)."""
    check_schema_name(schema)
    functions = {"schema": "has_schema_privilege", "sequence": "has_sequence_privilege",
                 "function": "has_function_privilege", "table": "has_table_privilege"}
    labels: list[tuple[str, str, str | None]] = []
    terms: list[sql.Composable] = []
    params: list[str] = []
    for obj_kind, template, privilege, column in _checks(kind):
        name = template.split(".", 1)[1] if "." in template else ""
        if name.split("(")[0] in skip:
            continue
        # a schema goes by its plain name; a table, sequence or function by its quoted one
        target = schema if obj_kind == "schema" else sql.SQL(template).format(
            schema=sql.Identifier(schema)).as_string(conn)
        who = [] if role is None else [role]
        if column is not None:
            terms.append(sql.SQL("has_column_privilege({}%s, %s, %s)").format(sql.SQL("%s, " if who else "")))
            params += [*who, target, column, privilege]
        else:
            terms.append(sql.SQL("{}({}%s, %s)").format(sql.Identifier(functions[obj_kind]),
                                                      sql.SQL("%s, " if who else "")))
            params += [*who, target, privilege]
        labels.append((privilege, f"SCHEMA {schema}" if obj_kind == "schema" else name.split("(")[0], column))
    if not terms:  # everything skipped (ARRAY[] has no type)
        return []
    row = conn.execute(sql.SQL("SELECT ARRAY[{}]").format(sql.SQL(", ").join(terms)), params).fetchone()
    lacking: dict[tuple[str, str], list[str]] = {}  # (privilege, object) -> its columns lacking
    for (privilege, where, column), ok in zip(labels, row[0] if row else []):
        if not ok:
            lacking.setdefault((privilege, where), []).extend([column] if column else [])
    return [f"{privilege}{_columns(columns)} ON {where}" for (privilege, where), columns in lacking.items()]


def _columns(columns: list[str], shown: int = 4) -> str:
    if not columns:
        return ""
    more = f", and {len(columns) - shown} more" if len(columns) > shown else ""
    return f" ({', '.join(columns[:shown])}{more})"
