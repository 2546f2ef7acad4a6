"""Arguments no parser took: the usage error argparse would give (exit 2), with the fix
when it is known (a payload given as an argument, an app given without --app, an option
a command lacks on purpose, the closest spelling of a misspelt option)."""

from __future__ import annotations

import argparse
import difflib
import re
import shlex


#: Options a command lacks on purpose: (its prog, the option) -> what to do instead. Said
#: in place of the closest spelling, which named another option (`pgworker web --json`
#: said "did you mean --dsn?", a new user's trial).
NOT_OFFERED = {
    ("pgworker web", "--json"): "`pgworker web` serves pages and prints no result, so it has no --json: the "
                                "console's data as JSON is its API, `GET /api/overview`, `/api/jobs`, `/api/dead`, "
                                "... (docs/web.md); `pgworker status --json` and `pgworker jobs list --json` "
                                "print it on the command line",
}


def unrecognized(parser: argparse.ArgumentParser, args: argparse.Namespace, extras: list[str]) -> None:
    """Exit 2 for arguments no parser took, as argparse does, but with the fix for the
    usual slip: `pgworker enqueue send_email '{"to": ...}'` (the payload goes in
    --payload; argparse said only "unrecognized arguments"). The stray value is not
    echoed there: a payload may hold a secret."""
    # a value right after an unknown option is that option's (`--prio 5`), not a stray argument
    stray = [a for i, a in enumerate(extras) if not a.startswith("-")
             and not (i and extras[i - 1].startswith("-") and "=" not in extras[i - 1])]
    if args.command == "enqueue" and stray:
        options = [a for a in extras if a.startswith("-")]
        parser.commands["enqueue"].error(  # type: ignore[attr-defined]
            "unexpected argument after the task's name (a payload?): give the payload with --payload, e.g. "
            f"`pgworker enqueue {shlex.quote(args.task)} --payload '{{\"to\": \"a@example.com\"}}'`"
            + (f"; also unrecognized: {' '.join(options)}" if options else ""))
    command = _command_parser(parser, args)
    known = [o for a in command._actions for o in a.option_strings if o.startswith("--")]
    hints = []
    for option in (a.split("=", 1)[0] for a in extras if a.startswith("--")):
        if (command.prog, option) in NOT_OFFERED:
            hints.append(NOT_OFFERED[command.prog, option])
            continue
        close = difflib.get_close_matches(option, known, n=1, cutoff=0.6)
        if close and close[0] != option:
            hints.append(f"did you mean {close[0]}?")
    if "--app" in known:  # `pgworker run myapp.tasks:app`: the app goes in --app
        hints += [f"the app goes in --app: --app {shlex.quote(a)}" for a in stray if re.fullmatch(r"[\w.]+:[\w.]+", a)]
    listed = f"`{command.prog} --help` lists its options" if command is not parser else "`pgworker --help`"
    command.error(f"unrecognized arguments: {' '.join(extras)}" + "".join(f"; {h}" for h in hints) + f" ({listed})")


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command the arguments name: its usage and options are the
    ones an error should show (`pgworker jobs list`'s, not the top level's)."""
    current = parser
    while True:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = [a.choices[getattr(args, a.dest)] for a in subs if getattr(args, a.dest, None) in a.choices]
        if not chosen:
            return current
        current = chosen[0]
