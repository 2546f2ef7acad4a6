"""Issue 23's targets and its table, from the JSON document of one run.

Every figure is a ratio of two cases measured in the same run (same minutes, same
load): pgworker over the minimal lease queue (``reference.py``), over PGQueuer, over
itself untraced. The figures kept from earlier rounds (traps, idle fleet, LISTEN
latency, memory) are compared with the run at 85677f1 (benchmarks/results/2026-12-01T144524Z.md,
the one docs/benchmarks.md held before this round's).
"""

from __future__ import annotations

from typing import Any

# the run at 85677f1 (issue 23: "none worse than today"), with 20 % for noise
DOCS_IDLE_STATEMENTS_PER_MINUTE = 240
DOCS_LISTEN_MEDIAN_MS = 1.7
DOCS_CLAIMER_RSS_MIB = 47.6
NOISE = 1.2


def get(doc: dict[str, Any], key: str, name: str = "jobs_per_second") -> float | None:
    entry = doc["results"].get(key, {}).get(name)
    return None if entry is None else entry["median"]


def values(doc: dict[str, Any], key: str, name: str) -> list[float]:
    entry = doc["results"].get(key, {}).get(name)
    return [v for v in (entry or {}).get("values", []) if isinstance(v, (int, float))]


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def best(doc: dict[str, Any], prefix: str) -> float | None:
    return max((v["jobs_per_second"]["median"] for k, v in doc["results"].items()
                if k.startswith(prefix) and "jobs_per_second" in v), default=None)


def snapshot_flatness(doc: dict[str, Any], plan: Any) -> tuple[float | None, int]:
    """(claim ms at the largest milestone reached / at the first, the largest reached)."""
    key = "snapshot growth"
    first = get(doc, key, f"at_{plan.snap_milestones[0]}_claim_ms")
    reached = [m for m in plan.snap_milestones if get(doc, key, f"at_{m}_claim_ms") is not None]
    if first is None or not reached:
        return None, 0
    return ratio(get(doc, key, f"at_{reached[-1]}_claim_ms"), first), reached[-1]


def targets(doc: dict[str, Any], plan: Any) -> list[dict[str, Any]]:
    """Each target with the measured value and whether it was met (None: not measured)."""
    c = plan.clients
    out: list[dict[str, Any]] = []

    def add(name: str, value: float | None, limit: float, better: str, unit: str = "",
            also: bool = True) -> None:
        met = None if value is None else (value >= limit if better == "higher" else value <= limit) and also
        out.append({"target": name, "value": None if value is None else round(value, 3), "limit": limit,
                    "unit": unit, "met": met})

    ref = "ref loop"
    untraced = get(doc, "obs metrics+api")
    add(f"drain, defaults (metrics on, tracing API without an SDK), {c} claimers / minimal loop b100 x {c}",
        ratio(untraced, get(doc, ref)), 0.8, "higher")
    add(f"server CPU per job (its backends), claim + complete b100 x {c}: pgworker / minimal loop",
        # a CPU of 0 is a run too small for one clock tick of /proc (10 ms), not a free claim
        ratio(get(doc, "cost pgworker b100", "cpu_backends_us_per_job") or None,
              get(doc, ref, "cpu_backends_us_per_job")), 1.15, "lower")
    add(f"WAL per job, claim + complete b100 x {c}: pgworker / minimal loop",
        ratio(get(doc, "cost pgworker b100", "wal_bytes_per_job"), get(doc, ref, "wal_bytes_per_job")), 1.15, "lower")
    mine = get(doc, f"peer pgworker defaults, {c} claimers")
    add("pgworker defaults / pgqueuer's best (same jobs, same run)", ratio(mine, best(doc, "peer pgqueuer")), 2.0,
        "higher")
    add("pgworker defaults / procrastinate's best (same run)", ratio(mine, best(doc, "peer procrastinate")), 20.0,
        "higher")
    none_rate, none_lat = get(doc, "trap none"), get(doc, "trap none", "claim_mean_ms")
    for trap, label in (("snapshot", "a REPEATABLE READ snapshot held through the drain"),
                        ("scheduled", f"{plan.trap_rows:,} jobs scheduled later, a third at a higher priority"),
                        ("finished", f"{plan.trap_rows:,} finished jobs kept")):
        r_rate = ratio(get(doc, f"trap {trap}"), none_rate)
        r_lat = ratio(get(doc, f"trap {trap}", "claim_mean_ms"), none_lat)
        spread = None if r_rate is None or r_lat is None else max(abs(1 - r_rate), abs(1 - r_lat))
        add(f"drain rate and claim latency beside {label}: largest change from the plain case", spread, 0.2, "lower")
    flat, reached = snapshot_flatness(doc, plan)
    top = max(plan.snap_milestones)
    add(f"claim latency under a held snapshot, {reached:,} / {plan.snap_milestones[0]:,} jobs processed"
        + ("" if reached == top else f" (the budget did not reach {top:,}: not met)"), flat, 1.2, "lower",
        also=reached == top)
    rows100 = get(doc, "ref pgbench 100 rows")
    add("enqueue_many, 100 jobs per call / pgbench 100-row INSERT into the minimal table (1 client)",
        ratio(get(doc, "enqueue_many 100"), rows100), 0.8, "higher")
    add(f"enqueue_many, {plan.enqueue_many_batch:,} jobs per call / pgbench 100-row INSERT into the minimal table",
        ratio(get(doc, "enqueue_many"), rows100), 0.8, "higher")
    add("enqueue, one job per transaction / the minimal single-row INSERT loop",
        ratio(get(doc, "enqueue single"), get(doc, "ref insert loop")), 0.9, "higher")
    add(f"OTLP tracing, every job, batch span processor to a local receiver, {c} claimers / untraced",
        ratio(get(doc, "obs otlp 100%"), untraced), 0.6, "higher")
    firsts = [get(doc, f"startup {n}", "first_claim_seconds") for n in plan.startup_claimers]
    add(f"start-up of a drain run: process start to the first claim, worst of {plan.startup_claimers} claimers",
        max(firsts) if all(v is not None for v in firsts) else None, 1.0, "lower", "s")
    idle, before = get(doc, "idle fleet", "statements_per_minute"), get(doc, "idle fleet before", "statements_per_minute")
    if before:  # --compare-with: the earlier commit's fleet in the same run is the better reference
        add(f"an idle fleet's statements per minute / {doc['machine'].get('compared_with')}'s in the same run (+20 %)",
            ratio(idle, before), NOISE, "lower")
    else:
        add("an idle fleet's statements per minute (85677f1's run: 240, +20 %; --compare-with 85677f1 "
            "measures the earlier fleet in the same run)", idle, DOCS_IDLE_STATEMENTS_PER_MINUTE * NOISE, "lower")
    add("idle enqueue-to-start latency with LISTEN, median (85677f1's run: 1.7 ms, +20 %)",
        get(doc, "latency listen", "median_ms"), round(DOCS_LISTEN_MEDIAN_MS * NOISE, 2), "lower", "ms")
    # the OTLP exporter's own imports (protobuf, requests) are the exporter's, not pgworker's:
    # 85677f1's figure is over runs with at most the SDK
    mem = max((v for k in doc["results"] if not k.startswith("obs otlp")
               for v in values(doc, k, "rss_claimer_max_mib")), default=None)
    add("claimer resident memory, max over every run but the OTLP ones (85677f1's run: 47.6 MiB, +20 %)", mem,
        round(DOCS_CLAIMER_RSS_MIB * NOISE, 1), "lower", "MiB")
    return out


def _n(v: float | None, digits: int = 0) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


def _r(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def issue_table(doc: dict[str, Any], plan: Any) -> list[str]:
    """The issue's table: each pgworker figure beside its reference in the same run."""
    c = plan.clients
    if not doc["results"]:
        return []
    ref, untraced = get(doc, "ref loop"), get(doc, "obs metrics+api")
    cpu = lambda k: get(doc, k, "cpu_backends_us_per_job")  # noqa: E731
    wal = lambda k: get(doc, k, "wal_bytes_per_job")  # noqa: E731
    pgq = best(doc, "peer pgqueuer")
    mine = get(doc, f"peer pgworker defaults, {c} claimers")
    flat, reached = snapshot_flatness(doc, plan)
    first = plan.snap_milestones[0]
    rows = [
        (f"drain, defaults, {c} claimers (jobs/s)", _n(untraced),
         f"minimal loop b100 x {c}: {_n(ref)}; pgbench b100 c={c}: {_n(get(doc, 'ref pgbench'))}",
         _r(ratio(untraced, ref)), "≥ 0.8"),
        (f"pgworker's own statements, plain psycopg loop b100 x {c} (jobs/s)", _n(get(doc, "cost plain")),
         f"minimal loop: {_n(ref)}", _r(ratio(get(doc, "cost plain"), ref)), "—"),
        (f"server CPU µs per job (backends), drain b100 x {c}", _n(cpu("cost pgworker b100"), 1),
         f"minimal loop: {_n(cpu('ref loop'), 1)}", _r(ratio(cpu("cost pgworker b100"), cpu("ref loop"))), "≤ 1.15"),
        ("server CPU µs per job, pgworker's statements: plain loop / pgbench", f"{_n(cpu('cost plain'), 1)} / "
         f"{_n(cpu('cost pgbench'), 1)}", f"minimal loop / pgbench: {_n(cpu('ref loop'), 1)} / "
         f"{_n(cpu('ref pgbench'), 1)}", _r(ratio(cpu("cost plain"), cpu("ref loop"))), "—"),
        (f"WAL bytes per job (claim + complete), drain b100 x {c}", _n(wal("cost pgworker b100")),
         f"minimal loop: {_n(wal('ref loop'))}; pgbench: {_n(wal('ref pgbench'))}",
         _r(ratio(wal("cost pgworker b100"), wal("ref loop"))), "≤ 1.15"),
        ("WAL bytes per job, pgworker's statements: plain loop / pgbench",
         f"{_n(wal('cost plain'))} / {_n(wal('cost pgbench'))}", f"minimal loop: {_n(wal('ref loop'))}",
         _r(ratio(wal("cost plain"), wal("ref loop"))), "—"),
        ("defaults vs PGQueuer's best (jobs/s)", _n(mine), f"PGQueuer's best: {_n(pgq)}", _r(ratio(mine, pgq)),
         "≥ 2"),
        ("OTLP tracing, 100 % sampled (jobs/s; spans per job received)",
         f"{_n(get(doc, 'obs otlp 100%'))} ({_n(get(doc, 'obs otlp 100%', 'spans_per_job'), 2)})",
         f"untraced: {_n(untraced)}", _r(ratio(get(doc, "obs otlp 100%"), untraced)), "≥ 0.6"),
        ("OTLP tracing, 10 % sampled (jobs/s)", _n(get(doc, "obs otlp 10%")), f"untraced: {_n(untraced)}",
         _r(ratio(get(doc, "obs otlp 10%"), untraced)), "—"),
        ("`enqueue_many`, 100 per call (jobs/s)", _n(get(doc, "enqueue_many 100")),
         f"pgbench 100-row INSERT c=1, minimal table: {_n(get(doc, 'ref pgbench 100 rows'))}",
         _r(ratio(get(doc, "enqueue_many 100"), get(doc, "ref pgbench 100 rows"))), "≥ 0.8"),
        (f"`enqueue_many`, {plan.enqueue_many_batch:,} per call (jobs/s)", _n(get(doc, "enqueue_many")),
         f"same: {_n(get(doc, 'ref pgbench 100 rows'))}",
         _r(ratio(get(doc, "enqueue_many"), get(doc, "ref pgbench 100 rows"))), "≥ 0.8"),
        ("`enqueue`, one per transaction (jobs/s)", _n(get(doc, "enqueue single")),
         f"minimal single-row INSERT loop: {_n(get(doc, 'ref insert loop'))}",
         _r(ratio(get(doc, "enqueue single"), get(doc, "ref insert loop"))), "≥ 0.9"),
        (f"claim ms under a held snapshot, at {first:,} → {reached:,} jobs processed",
         f"{_n(get(doc, 'snapshot growth', f'at_{first}_claim_ms'), 2)} → "
         f"{_n(get(doc, 'snapshot growth', f'at_{reached}_claim_ms'), 2)}", "itself at the first milestone",
         _r(flat), "≤ 1.2 (flat)"),
    ]
    for n in plan.startup_claimers:
        rows.append((f"start-up, {n} claimer(s): to the first claim / every claimer's first job (s)",
                     f"{_n(get(doc, f'startup {n}', 'first_claim_seconds'), 2)} / "
                     f"{_n(get(doc, f'startup {n}', 'every_claimer_seconds'), 2)}", "—", "—", "≤ 1 s to the first"))
    lines = ["## Issue 23: pgworker beside the minimal lease queue (same run)", "",
             "The minimal lease queue: its own table (primary key, one partial claim index, the seeds' columns), "
             "the seeds' one-statement claim and fenced completion (benchmarks/reference.py). Server CPU is "
             "the CPU of the run's own backends (/proc), WAL the server's insert position before and after.", "",
             "| figure | pgworker | reference in the same run | ratio | target |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {a} | {b} | {r} | {x} | {t} |" for a, b, r, x, t in rows]
    return lines + [""]
