"""What docs/configuration.md documents that no ``Settings`` field defines: the variables
read elsewhere (the command line's, the test suite's and the benchmarks'), and the
options of ``@app.task`` with their units and meanings. Data only: rendered by
:mod:`pgworker.settings_docs`, which checks the task options against ``App.task``'s
signature, and a test checks that every ``PGWORKER_*`` name the project reads is here
or a ``Settings`` field.
"""

from __future__ import annotations

#: Variables of the command line and the library that are not Settings fields:
#: (variable, the flag it is the default of, default, meaning).
OTHER_VARIABLES: tuple[tuple[str, str, str, str], ...] = (
    ("PGWORKER_APP", "--app", "none", "Your App, as `--app` takes it: `package.module:app`, "
     "`path/to/file.py:app`, or `package.module:create_app()` for a factory."),
    ("PGWORKER_LOG_LEVEL", "--log-level", "INFO", "Log level of `pgworker run`: DEBUG, INFO, WARNING or ERROR."),
    ("PGWORKER_LOG_FORMAT", "--log-format", "text", "Log lines of `pgworker run` as text, or `json` "
     "(one object a line)."),
    ("PGWORKER_ACTOR", "", "user@host", "Who operator actions (cancel, replay, queue pause, resume, set, "
     "delete) are recorded as, in `job_events` and `queue_events`; the API's `actor=` wins."),
    ("PGWORKER_DEMO_DIR", "", "set by `pgworker demo`", "The demo worker's output folder (internal to the demo)."),
    ("PGWORKER_DEMO_URL", "", "set by `pgworker demo`", "The demo's webhook endpoint (internal to the demo)."),
    ("PGWORKER_DJANGO_WORKER", "", "set by `manage.py pgworker`", "Its claimers set Django up before loading "
     "the app, and close Django's stale connections around each job (internal to the Django integration)."),
    ("PGWORKER_FORKSERVER_SAFE_PATH", "", "set by `pgworker run`", "Marks the PYTHONSAFEPATH the claimers' fork "
     "server is started with, which the server then removes from its environment (internal to the worker)."),
)

#: Variables of the test suite and the benchmarks: (variable, default, meaning).
TEST_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("PGWORKER_TEST_DSN", "see the README", "The PostgreSQL the tests use; else a testcontainers server, "
     "the server on 127.0.0.1:5432, a throwaway `initdb` cluster or the embedded one."),
    ("PGWORKER_STRICT", "off", "`1`: a missing tool or data (promtool, pgbouncer, the CRDs, ...) fails its "
     "tests instead of skipping them; `.ci/run` sets it."),
    ("PGWORKER_CRD_DIR", "none: those tests skip", "Folder of the CustomResourceDefinitions (KEDA, "
     "Prometheus Operator) the chart's custom resources are validated against; `.ci/run` sets it to "
     "`../shared/k8s-crds`."),
    ("PGWORKER_IMAGE_BASE", "none: a Debian bookworm base made with debootstrap", "Base image the image "
     "tests build the Dockerfile on (its `BASE_IMAGE`), e.g. `docker.io/library/python:3.11.14-slim-bookworm` "
     "where that registry is reachable."),
    ("PGWORKER_BUILDAH_ROOT", "`/var/cache/pgworker-ci/containers`", "buildah storage of the image tests, "
     "where the debootstrapped base is kept between runs."),
    ("PGWORKER_BACKLOG_JOBS", "200000", "Jobs in the backlog of the memory-bound acceptance test."),
    ("PGWORKER_CHAOS_SEED", "11", "Seed of the chaos soak test."),
    ("PGWORKER_OUTAGE_SECONDS", "37", "Length of the database outage in the outage test, in seconds."),
    ("PGWORKER_BENCH_DSN", "PGWORKER_DSN, else 127.0.0.1:5432/test", "The PostgreSQL the benchmarks measure."),
    ("PGWORKER_CHROMIUM", "/usr/bin/chromium", "The browser of the console's tests (Debian's `chromium`)."),
    ("PGWORKER_CHROMEDRIVER", "/usr/bin/chromedriver", "Its driver (Debian's `chromium-driver`)."),
    ("PGWORKER_WEB_SCREENSHOTS", "none", "A folder the browser tests also write their screenshots to "
     "(`docs/web` refreshes docs/web.md's)."),
)

#: ``@app.task(...)`` options: name -> (unit, meaning). Defaults come from the signature
#: of ``App.task`` and the :class:`pgworker.Task` dataclass.
TASK_OPTIONS: dict[str, tuple[str, str]] = {
    "name": ("text", "The task's name, stored with each job (default: `module.function`)."),
    "queue": ("name", "The queue its jobs go to, unless `enqueue(queue=...)` says otherwise."),
    "max_attempts": ("attempts", "Attempts before a job is dead (1 to 1,000,000)."),
    "retry": ("RetryPolicy", "The backoff between attempts: see Retries."),
    "timeout": ("seconds", "An attempt running longer fails with TIMEOUT: an async handler is cancelled at "
                "the limit; a sync one, which cannot be interrupted, has its claimer process replaced once it "
                "runs 2 s past the limit (a sync handler that returns within those 2 s succeeds: its work is "
                "done)."),
    "max_runtime": ("seconds", "The lease is not renewed past this age (default: the worker's "
                    "`max_runtime_seconds`)."),
    "renew": ("`alive` or `progress`", "Renew the lease while the claimer lives, or only while the handler "
              "reported progress (`ctx.heartbeat()`) within the last lease."),
    "priority": ("integer", "Higher runs first, -32768 to 32767."),
    "permanent_errors": ("exception types", "Exceptions that make the job dead at once, without retries."),
    "payload_type": ("type or callable", "Decodes the payload: a dataclass, TypedDict or pydantic model is "
                     "checked field by field (default: the annotation of the handler's payload parameter, "
                     "when it is one of those); a failure makes the job dead at once with PAYLOAD_INVALID. "
                     "Checked at enqueue too (`PayloadError`, nothing stored) when the producer's App "
                     "registers the task; so is a handler annotated `dict`/`Mapping` (a JSON object "
                     "only). A decoding callable is not checked at enqueue."),
    "ordering_on_dead": ("`block` or `skip`", "Whether a dead job of an ordering key holds the key's later "
                         "jobs until replayed or discarded."),
    "dedupe_window": ("seconds", "How long after success a job keeps its dedupe key held."),
    "schedule": ("cron expression", "Enqueue a job (payload None) at every slot of this five-field cron "
                 "expression: see docs/scheduling.md."),
    "schedule_tz": ("IANA time zone", "The zone the cron expression is read in."),
    "schedule_missed": ("`latest` or `skip`", "After downtime, run the latest missed slot once, or skip it."),
}
