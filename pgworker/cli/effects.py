"""`pgworker effects resolve`: an operator's answer for an external effect left uncertain."""

from __future__ import annotations

import argparse
import json

from ..errors import ConfigError
from ..names import schema_flag
from .output import emit
from .settings import _make_app


def _refuse_constant(name: str) -> object:
    # json.loads takes NaN and Infinity, which the stored result (strict JSON) cannot hold
    raise ValueError(f"{name} is not JSON")


def cmd_effects(args: argparse.Namespace) -> int:
    if getattr(args, "effects_command", None) != "resolve":
        raise ConfigError("usage: pgworker effects resolve ID NAME (--result JSON | --retry) [--replay]")
    # resolve_effect takes result= or retry=True, never both: --retry leaves result unset
    # (a None would mean "done, with a null result" and was refused beside retry=True)
    from ..operations import UNSET  # here, not at import: psycopg loads after `pgworker run`'s fork server starts

    result: object = UNSET
    if not args.retry:
        try:
            result = json.loads(args.result, parse_constant=_refuse_constant)
        except (json.JSONDecodeError, ValueError) as exc:
            raise ConfigError(f"--result is not valid JSON: {exc}; example: --result '{{\"charge\": \"ch_1\"}}'") \
                from None
    app = _make_app(args)
    state = app.resolve_effect(args.id, args.name, result=result, retry=args.retry)
    replayed = bool(args.replay and state == "dead" and list(app.replay([args.id])))
    how = "to be called again (same idempotency key)" if args.retry else "done"
    if args.json:
        emit(args, {"id": args.id, "name": args.name, "resolved": "retry" if args.retry else "done",
                    "state": "pending" if replayed else state, "replayed": replayed})
    else:
        then = "; replayed" if replayed else (
            f"; replay it with `pgworker dead replay {args.id}{schema_flag(app.settings.schema)}`"
            if state == "dead" else "")
        print(f"job {args.id}: effect {args.name!r} marked {how} (the job is {state}{then})")
    return 0
