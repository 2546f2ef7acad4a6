"""The Markdown table and the target check, from the JSON document of one run."""

from __future__ import annotations

from typing import Any

MiB = 1024 * 1024


def _get(doc: dict[str, Any], key: str, name: str = "jobs_per_second") -> float | None:
    entry = doc["results"].get(key, {}).get(name)
    return None if entry is None else entry["median"]


def _max(doc: dict[str, Any], key: str, name: str) -> float | None:
    entry = doc["results"].get(key, {}).get(name)
    vals = [v for v in (entry or {}).get("values", []) if isinstance(v, (int, float))]
    return max(vals) if vals else None


def _n(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "—"
    return f"{v:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or not b else f"{a / b:.2f}"


def targets(doc: dict[str, Any], plan: Any) -> list[dict[str, Any]]:
    """Each target (issue 15) with the measured value and whether it was met (None when
    the run did not measure it)."""
    c = max(plan.clients)
    out: list[dict[str, Any]] = []

    def add(name: str, value: float | None, limit: float, better: str, unit: str = "") -> None:
        met = None if value is None else (value >= limit if better == "higher" else value <= limit)
        out.append({"target": name, "value": None if value is None else round(value, 3), "limit": limit,
                    "unit": unit, "met": met})

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    plain = _get(doc, f"plain c{c} b100")
    api, sdk = _get(doc, "obs metrics+api"), _get(doc, "obs metrics+sdk")
    add(f"drain, defaults (metrics on, tracing API without an SDK), {c} claimers / plain loop b100 x {c}",
        ratio(api, plain), 0.9, "higher")
    add(f"drain, an SDK tracing every job, {c} claimers / plain loop b100 x {c}", ratio(sdk, plain), 0.5, "higher")
    mine = _get(doc, f"peer pgworker defaults, {c} claimers")
    for peer, factor in (("pgqueuer", 2.0), ("procrastinate", 20.0)):
        best = max((v["jobs_per_second"]["median"] for k, v in doc["results"].items()
                    if k.startswith(f"peer {peer}") and "jobs_per_second" in v), default=None)
        add(f"pgworker defaults / {peer}'s best (same jobs, same run)", ratio(mine, best), factor, "higher")
    rows100 = _get(doc, "insert pgbench 100 rows")
    add("enqueue_many, 100 jobs per call / pgbench 100-row INSERT (1 client)",
        ratio(_get(doc, "enqueue_many 100"), rows100), 0.8, "higher")
    add(f"enqueue_many, {plan.enqueue_many_batch:,} jobs per call / pgbench 100-row INSERT (1 client)",
        ratio(_get(doc, "enqueue_many"), rows100), 0.8, "higher")
    add("enqueue, one job per transaction / plain psycopg single-row INSERT loop",
        ratio(_get(doc, "enqueue single"), _get(doc, "insert plain loop")), 0.8, "higher")
    add(f"WAL per job (claim + complete), {c} claimers / plain loop",
        ratio(_get(doc, "obs metrics+api", "wal_bytes_per_job"), _get(doc, f"plain c{c} b100", "wal_bytes_per_job")),
        1.1, "lower")
    none_rate, none_lat = _get(doc, "trap none"), _get(doc, "trap none", "claim_mean_ms")
    for trap, label in (("scheduled", f"{plan.trap_rows:,} jobs scheduled later, a third at a higher priority"),
                        ("finished", f"{plan.trap_rows:,} finished jobs kept"),
                        ("snapshot", "a REPEATABLE READ snapshot held through the drain")):
        r_rate, r_lat = ratio(_get(doc, f"trap {trap}"), none_rate), ratio(_get(doc, f"trap {trap}", "claim_mean_ms"),
                                                                           none_lat)
        spread = None if r_rate is None or r_lat is None else max(abs(1 - r_rate), abs(1 - r_lat))
        add(f"drain rate and claim latency beside {label}: largest change from the plain case", spread, 0.2, "lower")
    mem = max((v for k in doc["results"] if k.startswith(("pgworker", "growth due", "obs", "trap"))
               for v in [_max(doc, k, "rss_claimer_max_mib")] if v), default=None)
    add("claimer resident memory, max over every run", mem, 80, "lower", "MiB")
    return out


def markdown(doc: dict[str, Any], plan: Any) -> str:
    m = doc["machine"]
    lines = [f"# pgworker benchmark, {doc['started']} ({doc['plan']} plan)", "",
             f"Machine: {m.get('cpus')} CPUs ({m.get('cpu', '?')}), {m.get('memory_gib', '?')} GiB; "
             f"PostgreSQL {m.get('pg_server_version')} on the same host, synchronous_commit="
             f"{m.get('pg_synchronous_commit')}, shared_buffers={m.get('pg_shared_buffers')}; "
             f"Python {m.get('python')}; pgworker {m.get('pgworker_commit', '?')}; load average "
             f"{', '.join(f'{x:.1f}' for x in m.get('load_average', []))} before, "
             f"{', '.join(f'{x:.1f}' for x in m.get('load_average_after', []))} after; "
             f"{m.get('duration_seconds', '?')} s.", "",
             f"Every figure is the median of {plan.repeat} repetition(s); no-op jobs; each case on a fresh schema.", ""]
    r = doc["results"]
    if any(k.startswith("ceiling ") for k in r):
        lines += ["## Drain rate (jobs/s)", "",
                  "pgbench runs pgworker's own `job_claim` and `job_complete` (rendered from pgworker/sql/queries/) on "
                  "pgworker's table; the plain loop is one psycopg connection per process running the same two "
                  "statements and nothing else; pgworker is `pgworker run --drain` with metrics on and tracing on "
                  "(SDK provider, default sampling, spans exported to a discarding exporter).", "",
                  "| claimers | batch | pgbench (ceiling) | plain psycopg loop | pgworker | pgworker / ceiling | "
                  "pgworker / plain | claim ms (pgbench / pgworker) |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for c in plan.clients:
            for b in plan.batches:
                ce, pl, pw = _get(doc, f"ceiling c{c} b{b}"), _get(doc, f"plain c{c} b{b}"), _get(doc, f"pgworker c{c} b{b}")
                lines.append(f"| {c} | {b} | {_n(ce)} | {_n(pl)} | {_n(pw)} | {_ratio(pw, ce)} | {_ratio(pw, pl)} | "
                             f"{_n(_get(doc, f'ceiling c{c} b{b}', 'claim_ms'), 2)} / "
                             f"{_n(_get(doc, f'pgworker c{c} b{b}', 'claim_mean_ms'), 2)} |")
            auto = _get(doc, f"pgworker c{c} auto")
            top = max(plan.batches)
            lines.append(f"| {c} | auto | {_n(_get(doc, f'ceiling c{c} b{top}'))} (b{top}) | "
                         f"{_n(_get(doc, f'plain c{c} b{top}'))} (b{top}) | **{_n(auto)}** | "
                         f"**{_ratio(auto, _get(doc, f'ceiling c{c} b{top}'))}** | "
                         f"{_ratio(auto, _get(doc, f'plain c{c} b{top}'))} | — / "
                         f"{_n(_get(doc, f'pgworker c{c} auto', 'claim_mean_ms'), 2)} |")
        lines.append("")
    if any(k.startswith("before c") for k in r):
        ref = doc["machine"].get("compared_with", "the earlier commit")
        lines += [f"## Against {ref} (drain rate, jobs/s, same run)", "",
                  "| claimers | batch | before | now | now / before |", "|---:|---:|---:|---:|---:|"]
        for c in plan.clients:
            for b in ("auto", f"b{max(plan.batches)}"):
                was, now = _get(doc, f"before c{c} {b}"), _get(doc, f"pgworker c{c} {b}")
                lines.append(f"| {c} | {b.lstrip('b') if b != 'auto' else 'auto'} | {_n(was)} | {_n(now)} | "
                             f"{_ratio(now, was)} |")
        lines.append("")
    if "idle fleet" in r:
        lines += [f"## An idle fleet ({plan.idle_pods} pods x {plan.idle_claimers} claimers, empty queue, "
                  "default poll)", "", "| code | statements per minute (server count) |", "|---|---:|",
                  f"| now | {_n(_get(doc, 'idle fleet', 'statements_per_minute'))} |"]
        if "idle fleet before" in r:
            lines.append(f"| {doc['machine'].get('compared_with', 'before')} | "
                         f"{_n(_get(doc, 'idle fleet before', 'statements_per_minute'))} |")
        lines.append("")
    if "enqueue single" in r or "enqueue_many" in r:
        ji, pi = _get(doc, "insert pgbench job_insert"), _get(doc, "insert pgbench plain")
        single, many = _get(doc, "enqueue single"), _get(doc, "enqueue_many")
        lines += ["## Enqueue (jobs/s, one connection)", "",
                  "| what | jobs/s | / pgbench plain INSERT | / pgbench job_insert |", "|---|---:|---:|---:|",
                  f"| pgbench: plain single-row INSERT | {_n(pi)} | 1.00 | {_ratio(pi, ji)} |",
                  f"| pgbench: pgworker's `job_insert` (with its NOTIFY) | {_n(ji)} | {_ratio(ji, pi)} | 1.00 |",
                  f"| `app.enqueue` | {_n(single)} | {_ratio(single, pi)} | {_ratio(single, ji)} |",
                  f"| `app.enqueue_many` (COPY, batches of {plan.enqueue_many_batch:,}) | {_n(many)} | "
                  f"{_ratio(many, pi)} | {_ratio(many, ji)} |", ""]
    if "latency listen" in r:
        lines += ["## Idle enqueue-to-start latency (ms; database clock: claim started_at - created_at)", "",
                  "| wake-up | median | p99 | max | jobs |", "|---|---:|---:|---:|---:|"]
        for key, label in (("latency listen", "LISTEN/NOTIFY"),
                           ("latency poll", f"polling only (every {plan.poll_interval:g} s)")):
            lines.append(f"| {label} | {_n(_get(doc, key, 'median_ms'), 1)} | {_n(_get(doc, key, 'p99_ms'), 1)} | "
                         f"{_n(_get(doc, key, 'max_ms'), 1)} | {_n(_get(doc, key, 'jobs'))} |")
        lines.append("")
    if any(k.startswith("obs ") for k in r):
        off = _get(doc, "obs off")
        lines += [f"## Cost of metrics and tracing ({max(plan.clients)} claimers, automatic batch)", "",
                  "| configuration | jobs/s | / all off | claimer CPU µs per job |", "|---|---:|---:|---:|"]
        for key, label in (("obs off", "metrics off, tracing off"), ("obs metrics", "metrics on, tracing off"),
                           ("obs metrics+api", "metrics on, tracing API only (no SDK configured: the default)"),
                           ("obs metrics+sdk", "metrics on, tracing SDK at default sampling (the target's \"on\")"),
                           ("obs metrics+sdk 10%", "metrics on, tracing SDK sampling 10% (parentbased_traceidratio)"),
                           ("obs metrics+sdk sync_commit=off",
                            "as \"on\", with the opt-in PGWORKER_SYNCHRONOUS_COMMIT=off")):
            v = _get(doc, key)
            lines.append(f"| {label} | {_n(v)} | {_ratio(v, off)} | {_n(_get(doc, key, 'cpu_claimers_us_per_job'), 1)} |")
        lines.append("")
    if any(k.startswith("growth due") for k in r):
        lines += [f"## How cost grows ({max(plan.clients)} claimers, automatic batch)", "",
                  "| due jobs | finished jobs kept | pgworker jobs/s | pgworker claim ms (mean) | "
                  "pgbench b100 jobs/s | pgbench b100 claim ms | claimer RSS MiB first → last |",
                  "|---:|---:|---:|---:|---:|---:|---|"]
        for due, fin in plan.growth:
            k, g = f"growth due {due} finished {fin}", f"growth ceiling due {due} finished {fin}"
            lines.append(f"| {due:,} | {fin:,} | {_n(_get(doc, k))} | {_n(_get(doc, k, 'claim_mean_ms'), 2)} | "
                         f"{_n(_get(doc, g))} | {_n(_get(doc, g, 'claim_ms'), 2)} | "
                         f"{_n(_get(doc, k, 'rss_claimer_first_mib'), 1)} → {_n(_get(doc, k, 'rss_claimer_last_mib'), 1)} |")
        lines.append("")
    rss_keys = [k for k in r if k.startswith(("pgworker", "growth due", "obs"))]
    if rss_keys:
        lines += ["## Resident memory (MiB, max over the runs)", "", "| process | RSS |", "|---|---:|",
                  f"| supervisor | {_n(max((_max(doc, k, 'rss_dispatcher_max_mib') or 0) for k in rss_keys), 1)} |",
                  f"| each claimer | {_n(max((_max(doc, k, 'rss_claimer_max_mib') or 0) for k in rss_keys), 1)} |", ""]
    peers = [k for k in r if k.startswith("peer ")]
    if peers:
        auto = _get(doc, f"peer pgworker defaults, {max(plan.clients)} claimers")
        lines += [f"## Peers ({plan.peer_jobs:,} no-op jobs each, drained; settings in the README)", "",
                  "| system | settings | jobs/s | pgworker defaults / peer |", "|---|---|---:|---:|"]
        for k in sorted(peers):
            _, name, label = k.split(" ", 2)
            label = label + (" (metrics on, tracing API without an SDK)" if name == "pgworker" else "")
            v = _get(doc, k)
            lines.append(f"| {name} | {label} | {_n(v)} | {_ratio(auto, v)} |")
        lines.append("")
    c = max(plan.clients)
    if "obs metrics+api" in r and f"plain c{c} b100" in r:
        lines += [f"## Where the time goes ({c} processes, no-op jobs; CPU µs per job, WAL bytes per job)", "",
                  "| what | jobs/s | client processes | supervisor | PostgreSQL server | WAL |", "|---|---:|---:|---:|---:|---:|",
                  f"| plain psycopg loop, b100 x {c} | {_n(_get(doc, f'plain c{c} b100'))} | "
                  f"{_n(_get(doc, f'plain c{c} b100', 'cpu_client_us_per_job'), 1)} | — | "
                  f"{_n(_get(doc, f'plain c{c} b100', 'cpu_server_us_per_job'), 1)} | "
                  f"{_n(_get(doc, f'plain c{c} b100', 'wal_bytes_per_job'))} |"]
        for key, label in (("obs metrics+api", "pgworker, defaults (tracing API, no SDK)"),
                           ("obs metrics+sdk", "pgworker, an SDK tracing every job")):
            lines.append(f"| {label} | {_n(_get(doc, key))} | {_n(_get(doc, key, 'cpu_claimers_us_per_job'), 1)} | "
                         f"{_n(_get(doc, key, 'cpu_supervisor_us_per_job'), 1)} | "
                         f"{_n(_get(doc, key, 'cpu_server_us_per_job'), 1)} | {_n(_get(doc, key, 'wal_bytes_per_job'))} |")
        lines.append("")
    if "insert plain loop" in r:
        lines += ["## Enqueue against its baselines (jobs/s, one connection)", "", "| what | jobs/s | ratio |",
                  "|---|---:|---:|",
                  f"| plain psycopg single-row INSERT loop | {_n(_get(doc, 'insert plain loop'))} | 1.00 |",
                  f"| `app.enqueue` | {_n(_get(doc, 'enqueue single'))} | "
                  f"{_ratio(_get(doc, 'enqueue single'), _get(doc, 'insert plain loop'))} |",
                  f"| pgbench 100-row INSERT | {_n(_get(doc, 'insert pgbench 100 rows'))} | 1.00 |",
                  f"| `app.enqueue_many`, 100 per call | {_n(_get(doc, 'enqueue_many 100'))} | "
                  f"{_ratio(_get(doc, 'enqueue_many 100'), _get(doc, 'insert pgbench 100 rows'))} |",
                  f"| `app.enqueue_many`, {plan.enqueue_many_batch:,} per call | {_n(_get(doc, 'enqueue_many'))} | "
                  f"{_ratio(_get(doc, 'enqueue_many'), _get(doc, 'insert pgbench 100 rows'))} |", ""]
    if any(k.startswith("trap ") for k in r):
        lines += [f"## Traps ({c} claimers, {plan.trap_due:,} due jobs, defaults)", "",
                  "| beside | jobs/s | claim ms | / plain rate | after | dead tuples reclaimed after |",
                  "|---|---:|---:|---:|---:|---:|"]
        for trap, label in (("none", "nothing (the plain case)"), ("scheduled", f"{plan.trap_rows:,} scheduled later"),
                            ("finished", f"{plan.trap_rows:,} finished"), ("snapshot", "an old snapshot held")):
            k = f"trap {trap}"
            lines.append(f"| {label} | {_n(_get(doc, k))} | {_n(_get(doc, k, 'claim_mean_ms'), 2)} | "
                         f"{_ratio(_get(doc, k), _get(doc, 'trap none'))} | {_n(_get(doc, k, 'after_jobs_per_second'))} | "
                         f"{_n(_get(doc, k, 'dead_tuples_reclaimed'))} |")
        lines.append("")
    if any(k.startswith("scale ") for k in r):
        lines += [f"## Scale-out (pods of {plan.scale_claimers} claimers on one server, {plan.scale_jobs:,} jobs)", "",
                  "| pods | jobs/s | claimer CPU µs/job | supervisor CPU µs/job | server CPU µs/job |",
                  "|---:|---:|---:|---:|---:|"]
        for pods in plan.scale_pods:
            k = f"scale {pods} pods"
            lines.append(f"| {pods} | {_n(_get(doc, k))} | {_n(_get(doc, k, 'cpu_claimers_us_per_job'), 1)} | "
                         f"{_n(_get(doc, k, 'cpu_supervisor_us_per_job'), 1)} | "
                         f"{_n(_get(doc, k, 'cpu_server_us_per_job'), 1)} |")
        lines.append("")
    ts = targets(doc, plan)
    lines += ["## Targets", "", "| target | measured | limit | met |", "|---|---:|---:|:---:|"]
    for t in ts:
        met = "—" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(f"| {t['target']} | {_n(t['value'], 2)} {t['unit']} | {t['limit']:,} {t['unit']} | {met} |")
    lines.append("")
    if doc.get("errors"):
        lines += ["## Errors", ""] + [f"- {e}" for e in doc["errors"]] + [""]
    return "\n".join(lines)
