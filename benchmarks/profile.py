"""Where a missed target's time goes: sampling profiles of the benchmark's own cases.

    python -m benchmarks.profile                        # every case at its default size
    python -m benchmarks.profile --cases drain,otlp --jobs 100000

Cases (the same code paths as ``benchmarks.run``'s figures):

- ``drain``: ``pgworker run --drain`` with its defaults (4 claimers, metrics on, the
  tracing API without an SDK) over ``--jobs`` no-op jobs; every claimer and the
  supervisor sampled from the start gate to their exit.
- ``otlp``: the same with pgworker's own OTLP set-up (SDK, batch span processor,
  OTLP/HTTP) exporting every job's spans to the benchmark's local sink.
- ``enqueue_many``: ``App.enqueue_many`` of 100 jobs per call; ``enqueue``: one job per
  transaction; this process sampled for ``--seconds``.
- ``startup``: ``python -X importtime`` of what ``pgworker run`` imports before its
  fork server starts (``pgworker.cli``) and of what the fork server preloads for the
  claimers: the largest imports, cumulative.

The sampler is py-spy (``pip install py-spy``; it reads another process's stack from
outside, so the code measured is unchanged), 100 samples a second, without stopping the
process (``--nonblocking``), and only while a thread holds the GIL (``--gil``): a sample
is a moment the process was running Python, or a C call made from Python that kept the
GIL (the JSON encoder, psycopg's row parsing). Waiting for the server does not count
(psycopg releases the GIL while it waits on the socket): the share of the time a process
held the GIL is its samples over 100 a second times the seconds sampled (the drain cases
also print their CPU per job from /proc). The
sampling slows the run down (py-spy reads the stacks on the same 2 cores); the shares
are what to read.
The report groups the samples by the *area* of the running frame (a pgworker module,
psycopg, prometheus_client, opentelemetry, a standard-library module, the job handler)
and lists the functions with the most samples, their own and including what they call.
The server's side of a job is measured elsewhere: ``benchmarks.transition_costs`` (WAL
records, index entries, HOT updates per transition) and ``benchmarks.sqlprofile`` (time
per statement, pg_stat_statements). Results: ``benchmarks/results/<UTC>-profile.md``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Callable, Iterable

from .common import TASK, BenchSchema, find_dsn

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("drain", "otlp", "enqueue_many", "enqueue", "startup")
FRAME = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
Stacks = Counter[tuple[tuple[str, str], ...]]  # (function, file) frames, outermost first -> samples
FEW_SAMPLES = 200  # below this a share moves in steps of half a percent or more: said, not hidden


def py_spy() -> str:
    """The py-spy executable (this virtualenv's, else the PATH's)."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    found = here if os.path.exists(here) else shutil.which("py-spy")
    if not found:
        raise RuntimeError("the profiles need py-spy, a sampling profiler: pip install py-spy "
                           "(the test extra has it: pip install -e '.[test]')")
    return found


class Samplers:
    """Running py-spy recorders, one per process; each writes its file when its process
    exits, or when :meth:`stop` interrupts it."""

    def __init__(self, procs: list[subprocess.Popen[bytes]]) -> None:
        self.procs = procs

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGINT)  # py-spy writes what it has and exits
        self.wait()

    def wait(self, timeout: float = 60) -> None:
        for p in self.procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def sample_processes(groups: dict[str, list[int]], folder: str, rate: int = 100) -> Samplers:
    """Start one py-spy recorder per pid, writing ``folder/<group>-<pid>.txt`` (collapsed
    stacks: ``frame;frame;... samples`` per line, outermost frame first)."""
    exe = py_spy()
    procs = []
    for group, pids in groups.items():
        for pid in pids:
            out = os.path.join(folder, f"{group}-{pid}.txt")
            procs.append(subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
                                           "--nonblocking", "--nolineno", "--gil", "--full-filenames", "--output", out],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(0.5)  # py-spy attaches in a few milliseconds; the gate opens after
    return Samplers(procs)


def read_stacks(paths: Iterable[str]) -> Stacks:
    """Collapsed-stack files summed into one Counter (lines py-spy could not name, such as
    a thread's label, are left out of the frames)."""
    stacks: Stacks = Counter()
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                body, _, count = line.rstrip("\n").rpartition(" ")
                if not count.isdigit():
                    continue
                frames = tuple((m["name"], m["file"]) for part in body.split(";")
                               if (m := FRAME.match(part)) and not m["file"].startswith("0x"))  # not a thread's label
                if frames:
                    stacks[frames] += int(count)
    return stacks


def area(file: str) -> str:
    """What a frame's file belongs to: ``pgworker.<module>``, a package installed in
    site-packages (its top-level name), ``stdlib <module>``, or the benchmark's handler."""
    if "site-packages/" in file:
        top = file.split("site-packages/", 1)[1].split("/", 1)[0]
        return top.removesuffix(".py").split("-")[0]
    if "/pgworker/" in file or file.startswith("pgworker/"):
        rel = file.rsplit("/pgworker/", 1)[-1] if "/pgworker/" in file else file.split("/", 1)[1]
        module = rel.removesuffix(".py").replace("/", ".").removesuffix("__init__").rstrip(".")
        return "pgworker." + module if module else "pgworker"
    if "/benchmarks/" in file:
        return "the job handler (benchmarks)"
    m = re.search(r"/lib/python3\.\d+/(.+)$", file)
    if m:
        return "stdlib " + m.group(1).split("/", 1)[0].removesuffix(".py")
    return os.path.basename(file) or file


def _table(title: str, rows: list[tuple[str, int]], total: int, limit: int) -> list[str]:
    lines = [f"| {title} | samples | share |", "|---|---:|---:|"]
    for name, n in rows[:limit]:
        lines.append(f"| {name} | {n:,} | {100 * n / total:.1f} % |")
    return lines


def summarize(title: str, stacks: Stacks, limit: int = 12, note: str = "") -> list[str]:
    """The Markdown of one profile: samples by area (own time), the functions with the
    most own samples, and pgworker's functions with the most samples including callees."""
    total = sum(stacks.values())
    out = [f"### {title}", ""]
    if note:
        out += [note, ""]
    if not total:
        return out + ["No samples (py-spy could not attach: run as the processes' user, or as root).", ""]
    by_area: Counter[str] = Counter()
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for frames, n in stacks.items():
        name, file = frames[-1]
        by_area[area(file)] += n
        own[f"{name} ({area(file)})"] += n
        for fn in {f"{fname} ({area(ffile)})" for fname, ffile in frames if area(ffile).startswith("pgworker.")}:
            inclusive[fn] += n
    out += [f"{total:,} samples.", ""]
    if total < FEW_SAMPLES:
        out += [f"**Few samples** (under {FEW_SAMPLES}: each is {100 / total:.1f} % of the whole), so read only "
                "the large shares; more jobs (--jobs) or a longer run (--seconds) gives more.", ""]
    out += _table("area of the running frame", by_area.most_common(), total, limit) + [""]
    out += _table("function (own samples)", own.most_common(), total, limit) + [""]
    out += _table("pgworker function (including what it calls)", inclusive.most_common(), total, limit) + [""]
    return out


def profile_drain(dsn: str, jobs: int, otlp: bool) -> list[str]:
    from .drain_runs import Observability, drain

    folder = tempfile.mkdtemp(prefix="pgworker-profile-")
    try:
        if otlp:
            from .otlp_sink import Sink

            with Sink() as sink:
                result = _drain(dsn, jobs, Observability("otlp", True, otlp_endpoint=sink.endpoint), folder, drain)
        else:
            result = _drain(dsn, jobs, Observability("api", True), folder, drain)
        names = os.listdir(folder)
        claimers = read_stacks(os.path.join(folder, n) for n in names if n.startswith("claimer-"))
        supervisor = read_stacks(os.path.join(folder, n) for n in names if n.startswith("supervisor-"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    label = "OTLP tracing of every job" if otlp else "defaults (metrics on, tracing API without an SDK)"
    note = (f"{result['jobs']:,} jobs in {result['seconds']} s ({result['jobs_per_second']:,} jobs/s, slowed by "
            f"the sampling); CPU per job: claimers {result['cpu_claimers_us_per_job']} µs, supervisor "
            f"{result['cpu_supervisor_us_per_job']} µs, the run's own server backends "
            f"{result['cpu_backends_us_per_job']} µs.")
    return (summarize(f"Drain, {label}, 4 claimers: the claimers", claimers, note=note)
            + summarize("The same drain: the supervisor", supervisor, limit=8))


def _drain(dsn: str, jobs: int, obs: object, folder: str, drain: Callable[..., object]) -> dict[str, object]:
    with BenchSchema(dsn, "profile") as s:
        s.fill(jobs)
        r = drain(s, concurrency=4, obs=obs, since_id=s.max_id() - jobs, profile_dir=folder)
    return r.as_dict()  # type: ignore[attr-defined, no-any-return]


def profile_enqueue(dsn: str, seconds: float, batch: int | None) -> list[str]:
    """Sample this process while it enqueues (``batch`` jobs per ``enqueue_many`` call,
    or one ``enqueue`` per transaction when None)."""
    from .cases import _app

    folder = tempfile.mkdtemp(prefix="pgworker-profile-")
    try:
        with BenchSchema(dsn, "profile") as s, _app(s) as app:
            specs = [(TASK, {"i": i}) for i in range(batch or 1)]
            for _ in range(200):  # warm-up: the pool, prepared statements
                app.enqueue_many(specs) if batch else app.enqueue(TASK, {"i": 0})
            samplers = sample_processes({"enqueue": [os.getpid()]}, folder)
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                if batch:
                    app.enqueue_many(specs)
                    n += batch
                else:
                    app.enqueue(TASK, {"i": n})
                    n += 1
            elapsed = time.perf_counter() - t0
            samplers.stop()
        stacks = read_stacks(os.path.join(folder, n) for n in os.listdir(folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    what = f"enqueue_many, {batch} jobs per call" if batch else "enqueue, one job per transaction"
    return summarize(f"{what}: the producer", stacks,
                     note=f"{n:,} jobs in {elapsed:.1f} s ({n / elapsed:,.0f} jobs/s, slowed by the sampling).")


def profile_startup(limit: int = 12) -> list[str]:
    """``python -X importtime`` of ``pgworker.cli`` and of the claimers' preload: each
    import's own time summed by top-level package, milliseconds (a fresh interpreter each)."""
    out = ["### Start-up: imports", "",
           "`python -X importtime`, one fresh interpreter each: the imports' own time, summed by top-level "
           "package (what `pgworker run` imports before its fork server starts, and what the fork server "
           "preloads for the claimers).", ""]
    for module in ("pgworker.cli", "pgworker.worker.claimer.preload"):
        err = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True,
                             text=True, check=True, cwd=os.path.dirname(HERE)).stderr
        own: Counter[str] = Counter()
        for line in err.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
            if m:
                own[m.group(2).split(".")[0]] += int(m.group(1))
        total = sum(own.values())
        out += [f"`import {module}`: {total / 1000:,.0f} ms of imports in all.", "",
                "| package | ms (own, summed) | share |", "|---|---:|---:|"]
        out += [f"| {name} | {n / 1000:,.1f} | {100 * n / total:.0f} % |" for name, n in own.most_common(limit)] + [""]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: PGWORKER_BENCH_DSN, else PGWORKER_DSN, else "
                                      "postgresql://postgres@127.0.0.1:5432/test)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per drain (default 100,000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per enqueue case (default 10)")
    parser.add_argument("--no-save", action="store_true", help="print only, write no file in benchmarks/results")
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case {', '.join(unknown)}: choose from {', '.join(CASES)}")
    if not cases:
        parser.error(f"--cases names no case: choose from {', '.join(CASES)}")
    if args.jobs < 1000:
        parser.error(f"--jobs {args.jobs}: give at least 1000 jobs (a drain of fewer ends before it is sampled)")
    if not args.seconds > 0:
        parser.error(f"--seconds {args.seconds}: give a positive number of seconds")
    sampled = [c for c in cases if c != "startup"]  # the imports need neither py-spy nor a server
    dsn = ""
    if sampled:
        try:
            py_spy()
        except RuntimeError as exc:
            raise SystemExit(f"benchmark profile: {exc}") from None
        dsn = find_dsn(args.dsn)
    lines = [f"# Profiles ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", ""]
    for case in cases:
        if case in ("drain", "otlp"):
            lines += profile_drain(dsn, args.jobs, otlp=case == "otlp")
        elif case == "enqueue_many":
            lines += profile_enqueue(dsn, args.seconds, 100)
        elif case == "enqueue":
            lines += profile_enqueue(dsn, args.seconds, None)
        else:
            lines += profile_startup()
    text = "\n".join(lines)
    print(text)
    if not args.no_save:
        path = os.path.join(HERE, "results", time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime()) + "-profile.md")
        with open(path, "w") as f:
            f.write(text + "\n")
        print(f"\nwritten to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
