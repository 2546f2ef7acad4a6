"""The overview's throughput chart: jobs finished per minute over the last hour, an SVG
drawn on the server (no script, no library). Numbers only go into attributes; the one
text (each bar's title) is escaped."""

from __future__ import annotations

from typing import Any, Iterable

from markupsafe import Markup, escape

MINUTES = 60
STATES = ("succeeded", "dead", "cancelled")


def per_minute(rows: Iterable[dict[str, Any]], queue: str | None = None) -> list[dict[str, int]]:
    """60 buckets, oldest first, each {state: jobs}, from console_throughput's rows (one
    queue's, or all)."""
    buckets = [{s: 0 for s in STATES} for _ in range(MINUTES)]
    for r in rows:
        if (queue is None or r["queue"] == queue) and 0 <= r["minutes_ago"] < MINUTES and r["state"] in STATES:
            buckets[MINUTES - 1 - r["minutes_ago"]][r["state"]] += int(r["jobs"])
    return buckets


def svg(buckets: list[dict[str, int]], *, width: int = 360, height: int = 48, label: str = "") -> Markup:
    """Stacked bars: succeeded, dead and cancelled per minute (classes styled by the CSS)."""
    peak = max((sum(b.values()) for b in buckets), default=0) or 1
    bar = width / len(buckets)
    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
             f'role="img" aria-label="{escape(label)}">']
    for i, b in enumerate(buckets):
        x = i * bar
        y = float(height)
        minute = len(buckets) - 1 - i
        title = escape(f"{minute} min ago: " + ", ".join(f"{b[s]} {s}" for s in STATES))
        parts.append(f"<g><title>{title}</title>")
        parts.append(f'<rect class="slot" x="{x:.1f}" y="0" width="{max(bar - 1, 1):.1f}" height="{height}"/>')
        for state in STATES:
            h = b[state] / peak * height
            if h <= 0:
                continue
            y -= h
            parts.append(f'<rect class="{state}" x="{x:.1f}" y="{y:.1f}" width="{max(bar - 1, 1):.1f}" '
                         f'height="{h:.1f}"/>')
        parts.append("</g>")
    parts.append("</svg>")
    return Markup("".join(parts))


def covered_minutes(rows: Iterable[dict[str, Any]], limit: int) -> int | None:
    """How far back the chart is complete when a state reached the read limit (the
    newest ``limit`` jobs of it covered fewer than 60 minutes), else None."""
    totals: dict[str, int] = {}
    oldest: dict[str, int] = {}
    for r in rows:
        totals[r["state"]] = totals.get(r["state"], 0) + int(r["jobs"])
        oldest[r["state"]] = max(oldest.get(r["state"], 0), r["minutes_ago"])
    cut = [oldest[s] for s, n in totals.items() if n >= limit]
    return min(cut) if cut else None
