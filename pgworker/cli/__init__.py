"""The ``pgworker`` command line.

Settings come from flags, else ``PGWORKER_*`` environment variables, else the App's
own. Output is a readable table on a terminal and JSON with ``--json``. Exit codes: 0
success, 1 error, 2 bad usage, 75 a drain run hit its deadline with due work left, 130
Ctrl-C, 143 SIGTERM and 129 SIGHUP (a drain run stopped by one, any run's second;
docs/deploy.md).

The package: :mod:`.parser` (the arguments), :mod:`.unrecognized` (arguments no parser
took, with the fix), :mod:`.settings` (flags -> Settings and the App), :mod:`.output`
(tables and JSON), and the commands by area: :mod:`.jobs` (jobs), :mod:`.dead` (dead
jobs), :mod:`.graphs` (graph cancel and replay), :mod:`.queues` (status and queue
policies), :mod:`.service` (migrate, run, schedules, sql grants, demo).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

from ..errors import PgworkerError
from .effects import cmd_effects
from .graphs import cmd_graphs
from .dead import cmd_dead
from .jobs import cmd_cancel, cmd_enqueue, cmd_jobs, cmd_prune
# The parser's names, importable from here as they were from the single module (the
# settings reference, pgworker.settings_docs, reads the private value types too).
from .parser import (ENV_FLAGS, SETTING_FLAGS, SETTING_SWITCHES, _ABSENT, _duration_or_none,  # noqa: F401
                     _float_or_none, _int_or_none, attach_negative_values, build_parser, parse_duration)
from .queues import cmd_queue, cmd_status
from .unrecognized import unrecognized
from .service import cmd_demo, cmd_migrate, cmd_run, cmd_schedules, cmd_sql, cmd_web
from .values import EXIT_USAGE



COMMANDS = {"migrate": cmd_migrate, "run": cmd_run, "enqueue": cmd_enqueue, "jobs": cmd_jobs,
            "dead": cmd_dead, "effects": cmd_effects, "graphs": cmd_graphs, "cancel": cmd_cancel, "prune": cmd_prune, "status": cmd_status,
            "queue": cmd_queue, "schedules": cmd_schedules, "sql": cmd_sql, "web": cmd_web, "demo": cmd_demo}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        # Options belong to a command. argparse would say "invalid choice: '<the value>'",
        # naming neither the option nor the fix, and echoing the value (a DSN's password).
        option = argv[0].split("=", 1)[0]
        print(f"error: {option} goes after the command's name: `pgworker COMMAND {option} ...` "
              "(`pgworker --help` lists the commands, `pgworker COMMAND --help` their options)", file=sys.stderr)
        return EXIT_USAGE
    args, extras = parser.parse_known_args(attach_negative_values(parser, argv))
    if extras:
        unrecognized(parser, args, extras)  # exits 2, as parse_args would, with the fix when known
    for dest, (variable, default) in ENV_FLAGS.items():
        if hasattr(args, dest) and getattr(args, dest) is None:
            setattr(args, dest, os.environ.get(variable) or default)
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    if args.command != "run":
        # Only `pgworker run` aggregates metrics across processes; a one-shot command
        # (say, in a container whose image sets the variable) keeps them in memory.
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    try:
        return COMMANDS[args.command](args)
    except PgworkerError as exc:
        if "psycopg" in sys.modules:  # only a statement can have been refused (the import stays lazy)
            from ..privileges import PermissionDenied

            if isinstance(exc, PermissionDenied) and exc.refused is not None:
                return _refused(args, exc.refused)  # the fix in the command line's terms, not the API's
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the reader went away (`pgworker jobs list | head`): exit quietly, as a shell tool
        # does; stdout goes to devnull so the interpreter's final flush cannot raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # a statement the server refused (privileges, constraints): no traceback, no secrets
        import psycopg

        if not isinstance(exc, psycopg.Error):
            raise
        return _refused(args, exc)
    except KeyboardInterrupt:
        return 130


def _refused(args: Any, exc: Exception) -> int:
    """Say a statement PostgreSQL refused (psycopg's ``exc``), with the command line's fix
    for a role that may not do it; exit 1."""
    from ..names import dsn_password, one_line, redact

    dsn = getattr(args, "dsn", None) or os.environ.get("PGWORKER_DSN")
    text = redact(one_line(str(exc)), dsn_password(dsn), dsn)
    hint = ("; this role may not do that. Operator commands (jobs show, dead replay, cancel, prune, queue "
            "pause/resume/set) run as the schema's owner (the role that ran `pgworker migrate`); what the "
            "producer and worker roles may do: `pgworker sql grants`"
            if getattr(exc, "sqlstate", None) == "42501" else "")
    print(f"error: PostgreSQL refused the statement ({type(exc).__name__}): {text}{hint}", file=sys.stderr)
    return 1
