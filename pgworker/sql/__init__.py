"""Loading the named SQL blocks and the migrations shipped in this package.

``queries/*.sql`` hold every statement, one file per area (enqueue, claim, lease,
ordering, maintenance, operations, queues, reads, schedules, testing, health), each statement a block that starts
with ``-- name: NAME`` followed by comment lines describing it. ``{schema}`` in the text is replaced by the
quoted schema identifier (``psycopg.sql.Identifier``); values are always parameters.

A block that starts with ``-- fragment: NAME`` is not a statement: it is a piece of SQL that several
statements must share word for word (a rule written once, such as the head probe of an ordering key in
ordering.sql), pasted where a statement says ``{NAME}`` before the schema is rendered. A fragment's
comment says which names of the statement around it it reads.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from psycopg import sql

_NAME = re.compile(r"^-- (?P<kind>name|fragment): (?P<name>[a-z_]+)\s*$", re.MULTILINE)
_MIGRATION_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    template: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.template.encode()).hexdigest()


def _read(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def query_files() -> list[str]:
    """The statement files, ``queries/<area>.sql``, in name order."""
    folder = resources.files(__package__).joinpath("queries")
    return sorted(f"queries/{entry.name}" for entry in folder.iterdir() if entry.name.endswith(".sql"))


@lru_cache(maxsize=None)
def query_templates() -> dict[str, str]:
    """Every named block of ``queries/*.sql``, unrendered (``{schema}`` still in place).

    Fragments (``-- fragment: NAME`` blocks) are pasted in place of ``{NAME}``. Raises
    RuntimeError when two blocks share a name.
    """
    out: dict[str, str] = {}
    fragments = query_fragments()
    for path in query_files():
        for kind, name, statement in _blocks(_read(path)):
            if kind == "fragment":
                continue
            if name in out:
                raise RuntimeError(f"statement {name!r} is defined twice (again in {path})")
            for fragment, text in fragments.items():
                statement = statement.replace("{" + fragment + "}", text)
            out[name] = f"/* pgworker:{name} */ " + statement
    return out


@lru_cache(maxsize=None)
def query_fragments() -> dict[str, str]:
    """Every ``-- fragment: NAME`` block of ``queries/*.sql``: {name: its SQL, unrendered}."""
    out: dict[str, str] = {}
    for path in query_files():
        for kind, name, text in _blocks(_read(path)):
            if kind == "fragment":
                if name in out:
                    raise RuntimeError(f"fragment {name!r} is defined twice (again in {path})")
                out[name] = text
    return out


def _blocks(text: str) -> list[tuple[str, str, str]]:
    """The (kind: 'name' or 'fragment', name, SQL) triples of one file."""
    out: list[tuple[str, str, str]] = []
    matches = list(_NAME.finditer(text))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[m.end():end].strip()
        # The purpose comment stays in the file. What is sent starts with the statement's
        # name in a block comment (added by query_templates): pg_stat_activity and the
        # server log show which statement runs, and SQL spans (--trace-sql) are named after
        # the first SQL word (the instrumentation skips a leading /* */ comment, not -- lines).
        lines = body.rstrip(";").strip().splitlines()
        while lines and lines[0].lstrip().startswith("--"):
            lines.pop(0)
        out.append((m.group("kind"), m.group("name"), "\n".join(lines).strip()))
    return out


@lru_cache(maxsize=None)
def migrations() -> tuple[Migration, ...]:
    """The shipped migrations in version order."""
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        m = _MIGRATION_FILE.match(entry.name)
        if m:
            found.append(Migration(int(m.group("version")), m.group("name"),
                                   entry.read_text(encoding="utf-8")))
    found.sort(key=lambda mig: mig.version)
    versions = [mig.version for mig in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return tuple(found)


def schema_template() -> str:
    """schema.sql: the whole current schema in one file (tested equal to the migrations)."""
    return _read("schema.sql")


def render(template: str, schema: str) -> str:
    """The template with ``{schema}`` replaced by the quoted identifier."""
    return sql.SQL(template).format(schema=sql.Identifier(schema)).as_string(None)
