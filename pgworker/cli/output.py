"""What the commands print: a readable table (or key/value lines for one row) on a
terminal, JSON with ``--json``."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timedelta
from typing import Any, Sequence

from ..jobs import UndecodablePayload
from ..names import visible


def _jsonable(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, timedelta):
        return v.total_seconds()
    if isinstance(v, UndecodablePayload):  # a value written by hand that Python cannot decode
        return repr(v)
    return v


def emit(args: argparse.Namespace, rows: Any, columns: Sequence[str] | None = None) -> None:
    if getattr(args, "json", False):
        print(json.dumps(rows, default=_jsonable, indent=None if isinstance(rows, list) else 2))
        return
    if isinstance(rows, dict):
        width = max((len(k) for k in rows), default=0)
        for k, v in rows.items():
            if isinstance(v, (list, dict)):
                # continuation lines start under the value's first line, not at column 0 (JSON
                # has escaped every control character already)
                v = json.dumps(v, default=_jsonable, indent=2).replace("\n", "\n" + " " * (width + 2))
                print(f"{k.rjust(width)}  {v}")
            else:
                print(f"{k.rjust(width)}  {visible(_fmt(v))}")
        return
    if not rows:
        print("(none)")
        return
    columns = list(columns or rows[0].keys())
    # a cell of stored text (a task or queue name written by another producer) cannot
    # print escape sequences or a line of its own
    cells = [[visible(_fmt(r.get(c))) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, datetime):
        return v.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")  # local time, its zone named (UTC, CET)
    if isinstance(v, float):  # one decimal, or three significant digits below 0.1 (a rate of 0.001/s)
        return f"{v:.3g}" if 0 < abs(v) < 0.1 else f"{v:.1f}"
    if isinstance(v, (dict, list)):  # a jsonb column in a table cell: JSON, as the database holds it
        return json.dumps(v, default=_jsonable, separators=(",", ":"))
    return str(v)
