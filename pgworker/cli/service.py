"""Commands that set up and run the service: migrate, run, schedules, sql grants, web, demo."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from ..errors import ConfigError
from .output import emit
from .settings import _make_app


def _prepare_metrics_dir(args: argparse.Namespace) -> str | None:
    """Give this run a fresh prometheus multiprocess directory, before any import of
    prometheus_client (the library reads the variable at import time)."""
    from .. import error_classes

    path = args.metrics_dir or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):
            if name.endswith((".db", ".db.partial")):  # values, and a merge cut short (metrics_files)
                os.unlink(os.path.join(path, name))
        error_classes.clear(path)  # the pod's error_class budget starts again with its series
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
        return None
    path = tempfile.mkdtemp(prefix="pgworker-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    return path


def cmd_migrate(args: argparse.Namespace) -> int:
    app = _make_app(args)
    report = app.migrate()
    if args.json:
        emit(args, {"schema": report.schema, "version_before": report.version_before,
                    "version_after": report.version_after, "applied": list(report.applied)})
    elif report.applied:
        print(f"schema {report.schema!r}: applied {', '.join(report.applied)} "
              f"(version {report.version_before} -> {report.version_after})")
    else:
        print(f"schema {report.schema!r} is up to date (version {report.version_after})")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    created = _prepare_metrics_dir(args)
    try:
        from ..worker.forkserver import start_early

        start_early()  # the claimers' fork server imports their modules while this process imports its own
        from ..worker import Supervisor
        from ..logs import setup_logging

        setup_logging(args.log_level, args.log_format)
        if args.max_duration is not None and not args.drain:
            raise ConfigError("--max-duration applies to --drain runs")
        app = _make_app(args, need_app=True)
        return Supervisor(app, args.app, drain=args.drain, max_duration=args.max_duration,
                          pushgateway_url=args.pushgateway_url, log_level=args.log_level.upper(),
                          log_format=args.log_format).run()
    finally:
        if created:
            shutil.rmtree(created, ignore_errors=True)


def cmd_schedules(args: argparse.Namespace) -> int:
    app = _make_app(args)
    emit(args, app.list_schedules(), ["name", "task", "cron", "timezone", "missed", "next_run", "last_slot",
                                      "last_job_id", "last_job_state", "declared"])
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    from .. import grants
    from ..config import DEFAULT_SCHEMA

    if getattr(args, "sql_command", None) != "grants":
        raise ConfigError("use: pgworker sql grants --producer ROLE --worker ROLE --viewer ROLE [--schema S] [--apply]")
    schema = args.schema or os.environ.get("PGWORKER_SCHEMA") or DEFAULT_SCHEMA
    statements = grants.grant_statements(schema, producer=args.producer, worker=args.worker, viewer=args.viewer)
    if not args.apply:
        print(grants.render(statements))
        return 0
    app = _make_app(args)
    with app.connection() as conn:
        grants.apply(conn, statements, schema, {"producer": args.producer, "worker": args.worker,
                                                "viewer": args.viewer})
    print(f"granted on schema {schema!r}: " + ", ".join(
        f"{kind} {role!r}" for kind, role in (("producer", args.producer), ("worker", args.worker),
                                              ("viewer", args.viewer)) if role))
    return 0


def cmd_web(args: argparse.Namespace) -> int:
    from ..web import require_extra
    from ..web.config import WebConfig

    require_extra()  # names the fix when the 'web' extra is not installed
    from ..logs import log_level_number, setup_logging
    from ..web.standalone import serve

    setup_logging(args.log_level, "text")
    overrides = {"read_only": True} if args.read_only else {}
    if args.trace_url:
        overrides["trace_url"] = args.trace_url
    config = WebConfig.from_env(**overrides)
    app = _make_app(args)
    app.check_schema()
    if args.root_path and not args.root_path.startswith("/"):
        raise ConfigError(f"--root-path {args.root_path!r} must start with '/', e.g. /pgworker")
    return serve(app, host=args.host, port=args.port, config=config, root_path=args.root_path.rstrip("/"),
                 log_level=log_level_number(args.log_level))  # a number: uvicorn knows only its own names


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import main as demo_main

    return demo_main(args)
