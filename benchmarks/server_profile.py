"""Where the server's CPU per job goes: the backend of a claim + completion loop, sampled.

    python -m benchmarks.server_profile [--dsn DSN] [--jobs 40000] [--batch 100]
        [--variant ref,today,...] [--frequency 2000] [--json FILE]

``benchmarks.claim_cost`` measures what each statement costs (the backend's CPU from
/proc) and attributes it by ablation: the same statements on a table without one part.
This shows the same cost from inside PostgreSQL: each variant (``claim_cost.VARIANTS``:
``ref`` the minimal lease queue, ``today`` pgworker's claim and completion, an ablation)
claims and completes ``--jobs`` jobs in batches of ``--batch`` on its own connection,
while ``perf record`` samples that backend (the cpu-clock event, which virtual machines
without hardware counters still have; call graphs unwound from DWARF, which Debian's
stripped postgres binary keeps in .eh_frame), and ``perf report`` gives each function's
share including what it calls. The shares of a few executor parts that do not contain one
another, times the backend's CPU per job (/proc, measured around the same loop), give
microseconds per job by part, side by side for the variants; "the rest" is expression
evaluation, the plan's other nodes (sorts, aggregates, CTE scans), the protocol.

The sampling slows the backend down alike for every variant (read the ratios). Needs a
local server, ``perf`` (Debian's linux-perf) and permission to sample another process
(root, or kernel.perf_event_paranoid <= 1 for the server's user).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from . import claim_cost
from .common import LOCAL_DSN

# part -> the functions whose inclusive shares make it up (PostgreSQL 15's executor; none
# of a part's functions calls another part's, so the shares add up)
PARTS: dict[str, tuple[str, ...]] = {
    "index entries inserted (non-HOT row versions)": ("ExecInsertIndexTuples",),
    "new row versions (heap_update, heap_insert)": ("heap_update", "heap_insert"),
    "table constraints (CHECK, NOT NULL)": ("ExecConstraints",),
    "index scans (the claim's candidates, the fenced rows by key)": ("index_getnext_slot",),
    "row locks (FOR NO KEY UPDATE SKIP LOCKED)": ("heap_lock_tuple",),
    "triggers (the WHEN of the dependency trigger, its queue)": ("ExecARUpdateTriggers", "AfterTriggerEndQuery"),
    "executor start and end (per statement: plan nodes, relations, indexes opened)": (
        "standard_ExecutorStart", "standard_ExecutorEnd"),
    "planning (custom plans)": ("pg_plan_queries",),
    "commit (WAL flush)": ("CommitTransactionCommand",),
}
LINE = re.compile(r"^\s+(?P<children>[\d.]+)%\s+(?P<self>[\d.]+)%\s+\[[.k]\]\s+(?P<symbol>\S+)")


def perf() -> str:
    found = shutil.which("perf")
    if found is None:
        raise SystemExit("server_profile: needs perf (Debian: apt-get install linux-perf)")
    return found


def inclusive_shares(report: str) -> dict[str, float]:
    """{symbol: inclusive %} from ``perf report --children --stdio -g none`` text."""
    out: dict[str, float] = {}
    for line in report.splitlines():
        m = LINE.match(line)
        if m:
            out[m["symbol"]] = max(out.get(m["symbol"], 0.0), float(m["children"]))
    return out


def profile_variant(dsn: str, name: str, jobs: int, batch: int, frequency: int, folder: str) -> dict[str, Any]:
    """Claim and complete ``jobs`` jobs of one variant under perf; its parts in µs per job."""
    subject = claim_cost.Subject(dsn, name, jobs, 1, batch)
    data = os.path.join(folder, f"{name}.data")
    try:
        for _ in range(3):  # prepared statements and plans in place before the sampling
            subject.step(explain=False)
        sampler = subprocess.Popen([perf(), "record", "-q", "-e", "cpu-clock", "-F", str(frequency),
                                    "--call-graph", "dwarf,16384", "-p", str(subject.pid), "-o", data],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # perf attaches
        cpu0, done = claim_cost.backend_ns(subject.pid), 0
        while True:
            n = subject.step(explain=False)
            if not n:
                break
            done += n
        cpu = claim_cost.backend_ns(subject.pid) - cpu0
        sampler.send_signal(2)
        _, err = sampler.communicate(timeout=120)
    finally:
        subject.close()
    if not os.path.exists(data):
        raise SystemExit(f"server_profile: perf record wrote nothing ({err.decode(errors='replace').strip()})")
    report = subprocess.run([perf(), "report", "-i", data, "--stdio", "--children", "--sort", "symbol",
                             "-g", "none", "--percent-limit", "0.3"],
                            capture_output=True, text=True, timeout=900, check=True).stdout
    shares = inclusive_shares(report)
    us_per_job = cpu / 1000 / max(done, 1)
    parts = {part: round(us_per_job * sum(shares.get(f, 0.0) for f in funcs) / 100, 2)
             for part, funcs in PARTS.items()}
    parts["the rest (expressions, the plan's other nodes, protocol)"] = round(us_per_job - sum(parts.values()), 2)
    top = sorted(((s, sym) for sym, s in shares.items() if not sym.startswith("0x")), reverse=True)
    return {"jobs": done, "us_per_job": round(us_per_job, 2), "parts": parts,
            "top": [(sym, s) for s, sym in top[:40]]}


def table(results: dict[str, dict[str, Any]]) -> str:
    names = list(results)
    lines = ["| part (µs per job, claim + completion) | " + " | ".join(names) + " |",
             "|---|" + "---:|" * len(names)]
    for part in [*PARTS, "the rest (expressions, the plan's other nodes, protocol)"]:
        lines.append(f"| {part} | " + " | ".join(f"{results[n]['parts'][part]:.2f}" for n in names) + " |")
    lines.append("| **backend CPU per job, sampled** | " + " | ".join(
        f"**{results[n]['us_per_job']:.2f}**" for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.server_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("PGWORKER_BENCH_DSN", LOCAL_DSN))
    p.add_argument("--jobs", type=int, default=40_000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--variant", default="ref,today", help=f"comma-separated: ref, {', '.join(claim_cost.VARIANTS)}")
    p.add_argument("--frequency", type=int, default=2000, help="samples a second")
    p.add_argument("--json", help="also write the results (with each variant's top functions) here")
    a = p.parse_args(argv)
    names = [x.strip() for x in a.variant.split(",") if x.strip()]
    for n in names:
        if n != "ref" and n not in claim_cost.VARIANTS:
            p.error(f"unknown variant {n!r}; choose from ref, {', '.join(claim_cost.VARIANTS)}")
    with tempfile.TemporaryDirectory(prefix="pgworker-server-profile-") as folder:
        results = {n: profile_variant(a.dsn, n, a.jobs, a.batch, a.frequency, folder) for n in names}
    print(table(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
