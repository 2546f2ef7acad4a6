"""The app of the image test's drain run: mounted read-only into the container at /app
and loaded with ``--app /app/image_app.py:app``. Each job writes one ledger row, from
inside the container, saying who ran it: the user id and the interpreter (the image's
/opt/venv), so the test sees that the image's own pgworker and psycopg did the work.

Environment: PGWORKER_DSN, PGWORKER_SCHEMA (the test's), as the worker reads them.
"""

from __future__ import annotations

import os
import sys

import psycopg
from psycopg import sql

import pgworker

app = pgworker.App()


@app.task(name="image.square", queue="image")
def square(payload, ctx):
    statement = sql.SQL("INSERT INTO {}.image_ledger (job_id, square, uid, executable) VALUES (%s, %s, %s, %s)")
    with psycopg.connect(os.environ["PGWORKER_DSN"], autocommit=True) as conn:
        conn.execute(statement.format(sql.Identifier(os.environ["PGWORKER_SCHEMA"])),
                     [ctx.job_id, payload["n"] ** 2, os.getuid(), sys.executable])
