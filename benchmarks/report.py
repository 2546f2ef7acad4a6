"""The Markdown tables of one run, from its JSON document (the targets: targets.py)."""

from __future__ import annotations

from typing import Any

from . import capacity
from .targets import issue_table, targets

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
    lines += issue_table(doc, plan)
    if any(k.startswith("ceiling ") for k in r):
        lines += ["## Drain rate (jobs/s)", "",
                  "pgbench runs pgworker's own `job_claim` and `job_complete` (rendered from pgworker/sql/queries/) on "
                  "pgworker's table; the plain loop is one psycopg connection per process running the same two "
                  "statements and nothing else; pgworker is `pgworker run --drain` with metrics on and tracing on "
                  "(SDK provider, default sampling, spans exported to a discarding exporter).", "",
                  "| claimers | batch | pgbench (ceiling) | plain psycopg loop | pgworker | pgworker / ceiling | "
                  "pgworker / plain | claim ms (pgbench / pgworker) |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for c in plan.matrix_clients:
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
        for c in plan.matrix_clients:
            for b in ("auto", f"b{max(plan.batches)}"):
                was, now = _get(doc, f"before c{c} {b}"), _get(doc, f"pgworker c{c} {b}")
                lines.append(f"| {c} | {b.lstrip('b') if b != 'auto' else 'auto'} | {_n(was)} | {_n(now)} | "
                             f"{_ratio(now, was)} |")
        lines.append("")
    if "idle fleet" in r:
        lines += [f"## An idle fleet ({plan.idle_pods} pods x {plan.idle_claimers} claimers, empty queue, "
                  "default poll; " + ("a database of its own" if _get(doc, "idle fleet", "own_database") else
                                      "the shared database: other sessions counted too") + ")", "",
                  "| code | statements per minute (server count) |", "|---|---:|",
                  f"| now | {_n(_get(doc, 'idle fleet', 'statements_per_minute'))} |"]
        if "idle fleet before" in r:
            lines.append(f"| {doc['machine'].get('compared_with', 'before')} | "
                         f"{_n(_get(doc, 'idle fleet before', 'statements_per_minute'))} |")
        lines.append("")
    if "enqueue single" in r or "enqueue_many" in r:
        lines += ["## Enqueue (jobs/s, one connection; the minimal table is the reference's)", "",
                  "| what | jobs/s | / its baseline |", "|---|---:|---:|"]
        for key, label, base in (
                ("ref insert loop", "minimal table: plain psycopg single-row INSERT loop", None),
                ("insert plain loop", "pgworker's table: plain psycopg single-row INSERT loop", "ref insert loop"),
                ("enqueue single", "`app.enqueue`, one job per transaction", "ref insert loop"),
                ("insert pgbench plain", "pgworker's table: pgbench single-row INSERT", None),
                ("insert pgbench job_insert", "pgworker's table: pgbench `job_insert` (with its NOTIFY)",
                 "insert pgbench plain"),
                ("ref pgbench 100 rows", "minimal table: pgbench 100-row INSERT", None),
                ("insert pgbench 100 rows", "pgworker's table: pgbench 100-row INSERT", "ref pgbench 100 rows"),
                ("enqueue_many 100", "`app.enqueue_many`, 100 per call", "ref pgbench 100 rows"),
                ("enqueue_many", f"`app.enqueue_many`, {plan.enqueue_many_batch:,} per call (COPY)",
                 "ref pgbench 100 rows")):
            if key in r:
                lines.append(f"| {label} | {_n(_get(doc, key))} | "
                             f"{_ratio(_get(doc, key), _get(doc, base)) if base else '1.00'} |")
        lines.append("")
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
        lines += [f"## Cost of metrics and tracing ({plan.clients} claimers, automatic batch)", "",
                  "| configuration | jobs/s | / all off | / untraced (the default) | claimer CPU µs per job | "
                  "spans received per job |", "|---|---:|---:|---:|---:|---:|"]
        for key, label in (("obs off", "metrics off, tracing off"), ("obs metrics", "metrics on, tracing off"),
                           ("obs metrics+api", "metrics on, tracing API only (no SDK configured: the default)"),
                           ("obs metrics+sdk", "metrics on, SDK at default sampling, batch processor, discarding exporter"),
                           ("obs otlp 100%", "metrics on, OTLP/HTTP to a local receiver, every job sampled"),
                           ("obs otlp 10%", "metrics on, OTLP/HTTP to a local receiver, 10 % (parentbased_traceidratio)")):
            v = _get(doc, key)
            spans = _get(doc, key, "spans_per_job")
            lines.append(f"| {label} | {_n(v)} | {_ratio(v, off)} | {_ratio(v, _get(doc, 'obs metrics+api'))} | "
                         f"{_n(_get(doc, key, 'cpu_claimers_us_per_job'), 1)} | {_n(spans, 2) if spans is not None else '—'} |")
        lines.append("")
    if any(k.startswith("growth due") for k in r):
        lines += [f"## How cost grows ({plan.clients} claimers, automatic batch)", "",
                  "| due jobs | finished jobs kept | pgworker jobs/s | pgworker claim ms (mean) | "
                  "pgbench b100 jobs/s | pgbench b100 claim ms | claimer RSS MiB first → last |",
                  "|---:|---:|---:|---:|---:|---:|---|"]
        for due, fin in plan.growth:
            k, g = f"growth due {due} finished {fin}", f"growth ceiling due {due} finished {fin}"
            lines.append(f"| {due:,} | {fin:,} | {_n(_get(doc, k))} | {_n(_get(doc, k, 'claim_mean_ms'), 2)} | "
                         f"{_n(_get(doc, g))} | {_n(_get(doc, g, 'claim_ms'), 2)} | "
                         f"{_n(_get(doc, k, 'rss_claimer_first_mib'), 1)} → {_n(_get(doc, k, 'rss_claimer_last_mib'), 1)} |")
        lines.append("")
    rss_keys = [k for k in r if "rss_claimer_max_mib" in r[k]]
    if rss_keys:
        lines += ["## Resident memory (MiB, max over the runs)", "", "| process | RSS |", "|---|---:|",
                  f"| supervisor | {_n(max((_max(doc, k, 'rss_dispatcher_max_mib') or 0) for k in rss_keys), 1)} |",
                  f"| each claimer | {_n(max((_max(doc, k, 'rss_claimer_max_mib') or 0) for k in rss_keys), 1)} |", ""]
    peers = [k for k in r if k.startswith("peer ")]
    if peers:
        auto = _get(doc, f"peer pgworker defaults, {plan.clients} claimers")
        lines += [f"## Peers ({plan.peer_jobs:,} no-op jobs each, drained; settings in the README)", "",
                  "| system | settings | jobs/s | pgworker defaults / peer |", "|---|---|---:|---:|"]
        for k in sorted(peers):
            _, name, label = k.split(" ", 2)
            label = label + (" (metrics on, tracing API without an SDK)" if name == "pgworker" else "")
            v = _get(doc, k)
            lines.append(f"| {name} | {label} | {_n(v)} | {_ratio(auto, v)} |")
        lines.append("")
    c = plan.clients
    if "ref loop" in r or "cost plain" in r:
        lines += [f"## Server cost per job (claim + complete, batch 100, {c} processes, no-op jobs)", "",
                  "CPU µs per job of the client processes, of the run's own backends (/proc; the whole server's "
                  "in brackets, other sessions included) and WAL bytes per job.", "",
                  "| what | jobs/s | client processes | supervisor | backends (whole server) | WAL |",
                  "|---|---:|---:|---:|---:|---:|"]
        for key, label in (("ref loop", f"minimal lease queue, plain psycopg loop b100 x {c}"),
                           ("ref pgbench", f"minimal lease queue, pgbench b100 c={c}"),
                           ("cost plain", f"pgworker's statements, plain psycopg loop b100 x {c}"),
                           ("cost pgbench", f"pgworker's statements, pgbench b100 c={c}"),
                           ("cost pgworker b100", f"pgworker run --drain, batch 100, {c} claimers, defaults"),
                           ("obs metrics+api", f"pgworker run --drain, defaults (automatic batch), {c} claimers"),
                           ("obs otlp 100%", "the same, OTLP tracing of every job")):
            if key not in r:
                continue
            client = _get(doc, key, "cpu_client_us_per_job")
            client = client if client is not None else _get(doc, key, "cpu_claimers_us_per_job")
            whole = _get(doc, key, "cpu_server_us_per_job")
            lines.append(f"| {label} | {_n(_get(doc, key))} | {_n(client, 1)} | "
                         f"{_n(_get(doc, key, 'cpu_supervisor_us_per_job'), 1)} | "
                         f"{_n(_get(doc, key, 'cpu_backends_us_per_job'), 1)}"
                         f"{f' ({_n(whole, 1)})' if whole is not None else ''} | "
                         f"{_n(_get(doc, key, 'wal_bytes_per_job'))} |")
        lines.append("")
    lines += capacity.markdown(doc)
    if "snapshot growth" in r:
        k = "snapshot growth"
        lines += [f"## Claims under a held snapshot ({c} claimers, defaults; {_n(_get(doc, k, 'jobs'))} due jobs, "
                  f"a REPEATABLE READ transaction opened before the drain, {plan.snap_budget:g} s at most)", "",
                  "As the jobs processed under the snapshot cross each milestone: the claimers' own mean claim "
                  "since the milestone before (their metric files), and pgworker's `job_claim` of 100 jobs, "
                  "rolled back, from a floor at the first claimable job (as the claimers start, "
                  "pgworker.claim_floors) and from the start of the queue's range (as every claim did before "
                  "floors; median of 5 ms); buffers from EXPLAIN ANALYZE.", "",
                  "| jobs processed | probed at (processed) | seconds into the drain | claimers' claim ms | "
                  "buffers from the floor | from the start: ms | buffers |",
                  "|---:|---:|---:|---:|---:|---:|---:|",
                  f"| before the drain | 0 | — | — | {_n(_get(doc, k, 'before_buffers'))} | "
                  f"{_n(_get(doc, k, 'before_start_ms'), 2)} | {_n(_get(doc, k, 'before_start_buffers'))} |"]
        for m in plan.snap_milestones:
            lines.append(f"| {m:,} | {_n(_get(doc, k, f'at_{m}_processed'))} | {_n(_get(doc, k, f'at_{m}_seconds'), 1)} | "
                         f"{_n(_get(doc, k, f'at_{m}_claim_ms'), 2)} | {_n(_get(doc, k, f'at_{m}_buffers'))} | "
                         f"{_n(_get(doc, k, f'at_{m}_start_ms'), 2)} | {_n(_get(doc, k, f'at_{m}_start_buffers'))} |")
        lines += ["", f"Drain rate under the snapshot: {_n(_get(doc, k))} jobs/s over {_n(_get(doc, k, 'processed'))} "
                  f"jobs; mean claim {_n(_get(doc, k, 'claim_mean_ms'), 2)} ms.", ""]
    if any(k.startswith("startup ") for k in r):
        lines += ["## Start-up of a drain run (seconds from spawning `pgworker run --drain`)", "",
                  "| claimers | first claim | first job | every claimer's first job |", "|---:|---:|---:|---:|"]
        for n in plan.startup_claimers:
            k = f"startup {n}"
            lines.append(f"| {n} | {_n(_get(doc, k, 'first_claim_seconds'), 2)} | "
                         f"{_n(_get(doc, k, 'first_job_seconds'), 2)} | {_n(_get(doc, k, 'every_claimer_seconds'), 2)} |")
        lines.append("")
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
