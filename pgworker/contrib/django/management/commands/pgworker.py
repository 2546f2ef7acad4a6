"""``manage.py pgworker COMMAND ...``: the ``pgworker`` command line (``migrate``,
``run``, ``status``, ``jobs``, ``dead``, ...) with the DSN and schema of the Django
settings (pgworker.contrib.django). ``run`` uses ``PGWORKER["APP"]`` unless ``--app`` is
given. The DSN goes to the command through ``PGWORKER_DSN`` in the environment (inherited
by the worker's processes), never on a command line where ``ps`` would show a password."""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Run a pgworker command (migrate, run, status, ...) on the database and schema of the Django settings."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs="*", metavar="COMMAND [OPTIONS]",
                            help="the pgworker command and its options, e.g. `migrate`, `run --drain`, `status`")

    def run_from_argv(self, argv: list[str]) -> None:
        # everything after `pgworker` is the CLI's (its own --help, --queues, ...): Django's
        # parser would refuse options it does not know
        try:
            self.execute(*argv[2:])
        except CommandError as exc:
            self.stderr.write(f"error: {exc}")
            raise SystemExit(exc.returncode) from None

    def execute(self, *args: Any, **options: Any) -> None:
        from pgworker import cli
        from pgworker.worker.claimer.process import DJANGO_WORKER_ENV
        from pgworker.contrib.django import _settings, dsn

        alias, schema, app_ref = _settings()
        argv = list(args)
        if not argv:
            raise CommandError("give a pgworker command: migrate, run, status, ... (manage.py pgworker --help)")
        os.environ["PGWORKER_DSN"] = dsn(alias)
        os.environ["PGWORKER_SCHEMA"] = schema  # the Django settings win over the environment
        os.environ[DJANGO_WORKER_ENV] = "1"  # claimers set Django up: handlers may use the ORM
        if argv[0] in ("run", "schedules") and app_ref and not any(a == "--app" or a.startswith("--app=") for a in argv):
            argv[1:1] = ["--app", app_ref]
        code = cli.main(argv)
        if code:
            raise SystemExit(code)
