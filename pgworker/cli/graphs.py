"""Commands on graphs of jobs (docs/graphs.md): cancel and replay a whole graph."""

from __future__ import annotations

import argparse
import sys

from ..names import quantity, schema_flag
from .output import emit
from .settings import _make_app


def cmd_graphs(args: argparse.Namespace) -> int:
    """``pgworker graphs cancel|replay GRAPH_ID``: print what changed (JSON with --json);
    exit 1 when no job carries the graph id (nothing changed)."""
    from .. import graphs  # here, not at import: psycopg loads after `pgworker run`'s fork server starts

    app = _make_app(args)
    states = graphs.graph_states(app.core, args.graph_id)
    if not states:
        print(f"error: there is no graph {args.graph_id} in schema {app.settings.schema!r} (no job carries that "
              "graph id: a graph's id is its first job's, see `pgworker jobs show ID`; or its jobs were pruned)",
              file=sys.stderr)
        return 1
    if args.graphs_command == "cancel":
        done = app.cancel_graph(args.graph_id, reason=args.reason)
        after = graphs.graph_states(app.core, args.graph_id)
        if args.json:
            emit(args, {"graph_id": args.graph_id, **done, "states": after})
        else:
            print(f"graph {args.graph_id}: {quantity(done['jobs'], 'job')}; cancelled {done['cancelled']}, "
                  f"cancellation requested for {done['requested']} running (their handlers see it at their next "
                  "ctx.progress write or lease renewal; one that returns first ends succeeded); their waiting children were cancelled with them"
                  + _states_line(after))
        return 0
    replayed = app.replay_graph(args.graph_id)
    if args.json:
        emit(args, {"graph_id": args.graph_id, "jobs": sum(states.values()), "replayed": replayed.replayed,
                    "requeued": replayed.requeued, "held_by": {str(k): v for k, v in replayed.held_by.items()},
                    "states": graphs.graph_states(app.core, args.graph_id)})
    else:
        print(f"graph {args.graph_id}: replayed {quantity(len(replayed.replayed), 'dead job')}, "
              f"{quantity(len(replayed.requeued), 'job')} cancelled by a dead parent wait again"
              + _states_line(graphs.graph_states(app.core, args.graph_id)))
        for dead, holder in sorted(replayed.held_by.items()):
            print(f"note: job {dead} stayed dead: its dedupe key is held by job {holder}, which does its work",
                  file=sys.stderr)
        if not replayed:
            print(f"note: nothing to replay (no dead job, none cancelled by one); `pgworker jobs list --graph "
                  f"{args.graph_id}{schema_flag(app.settings.schema)}` lists the graph", file=sys.stderr)
    return 0


def _states_line(states: dict[str, int]) -> str:
    return "\nnow: " + ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
