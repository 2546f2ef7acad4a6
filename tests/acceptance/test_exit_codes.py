"""The exit codes of `pgworker run`: the table in docs/deploy.md lists exactly the codes the
code can return (what a CronJob's podFailurePolicy, a supervisor or an alert reads), and
real processes return them."""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pgworker.worker.supervisor import STOP_SIGNALS
from worker import Worker, q

DEPLOY_DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"
TABLE = re.compile(r"<!-- exit-codes -->\n(?P<table>.*?)<!-- /exit-codes -->", re.S)
ROW = re.compile(r"^\|\s*(?P<code>\d+)\s*\|(?P<meaning>.*)\|\s*$", re.M)
#: The signals whose second delivery makes the supervisor exit at once, with 128 + the
#: signal's number (pgworker/worker/supervisor/main.py, Supervisor._on_signal).
SECOND_SIGNALS = STOP_SIGNALS


def documented() -> dict[int, str]:
    """{exit code: meaning} from the table of docs/deploy.md."""
    m = TABLE.search(DEPLOY_DOC.read_text())
    assert m, "docs/deploy.md lost its <!-- exit-codes --> table"
    return {int(r["code"]): r["meaning"].strip() for r in ROW.finditer(m["table"])}


def literal_returns(func) -> set[int]:
    """The integer literals a function returns (`return 141`), read from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    return {n.value.value for n in ast.walk(tree) if isinstance(n, ast.Return)
            and isinstance(n.value, ast.Constant) and isinstance(n.value.value, int)}


@pytest.mark.unit
def test_the_documented_exit_codes_are_those_the_code_can_return():
    from pgworker import cli
    from pgworker.worker import supervisor

    from pgworker import demo

    code = {v for k, v in vars(supervisor).items() if k.startswith("EXIT_")}  # what Supervisor.run returns
    code |= {v for k, v in vars(cli).items() if k.startswith("EXIT_")}
    code |= literal_returns(cli.main)  # errors, a closed stdout, Ctrl-C, caught by the CLI
    for command in {*cli.COMMANDS.values(), demo.main}:  # what each command returns by itself
        code |= literal_returns(command)
    code |= {128 + s for s in SECOND_SIGNALS}
    with pytest.raises(SystemExit) as usage:  # argparse's own exit for a command line it cannot parse
        cli.main(["run", "--no-such-flag"])
    code.add(usage.value.code)
    table = documented()
    assert set(table) == code, (f"docs/deploy.md documents {sorted(table)}, the code can return {sorted(code)}: "
                                "update the <!-- exit-codes --> table")
    for s in SECOND_SIGNALS:
        assert s.name in table[128 + s], f"the row of {128 + s} must name {s.name}"


def _second_signal(env, pg_dsn, conn, sig: signal.Signals) -> int:
    """A real `pgworker run` running a job gets ``sig`` twice; returns its exit code."""
    schema = env.settings.schema
    job_id = env.enqueue("sleep", {"seconds": 60})
    with Worker(pg_dsn, schema, "--concurrency", "1", "--shutdown-grace", "60") as w:
        from pg import wait_until

        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'"), 30)
        w.signal(sig)
        time.sleep(0.3)
        w.signal(sig)
        code = w.wait(10)
    # exited at once: the job was neither finished nor released; its lease will expire
    assert q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job_id) == [("running",)]
    return code


@pytest.mark.acceptance
def test_two_sigterms_exit_143(env, pg_dsn, conn):
    assert _second_signal(env, pg_dsn, conn, signal.SIGTERM) == 143 == 128 + signal.SIGTERM
    assert 143 in documented()


@pytest.mark.acceptance
def test_two_sigints_exit_130(env, pg_dsn, conn):
    assert _second_signal(env, pg_dsn, conn, signal.SIGINT) == 130 == 128 + signal.SIGINT
    assert 130 in documented()


@pytest.mark.acceptance
@pytest.mark.parametrize("mode, sig, code", [
    ("--drain", signal.SIGINT, 130),  # Ctrl-C of a drain run in a shell script
    ("--drain", signal.SIGTERM, 143),  # a drain CronJob's pod stopped
    ("--drain", signal.SIGHUP, 129),  # the terminal or ssh session of a drain run closed
    (None, signal.SIGHUP, 0),
    (None, signal.SIGINT, 0),  # an always-on worker's graceful stop is its normal end
])
def test_a_first_signal_stops_gracefully_and_a_drain_run_says_it_was_stopped(env, pg_dsn, conn, mode, sig,
                                                                            code):
    """A new user's trial: the first Ctrl-C of `pgworker run --drain` stopped it gracefully
    and exited 0, as a drain that completed does, while its summary said "interrupted": a
    script (`pgworker run --drain && next`) or a CronJob could not tell them apart."""
    schema = env.settings.schema
    job_id = env.enqueue("sleep", {"seconds": 2})
    with Worker(pg_dsn, schema, "--concurrency", "1", "--shutdown-grace", "30", *filter(None, [mode])) as w:
        from pg import wait_until

        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'"), 30)
        # to the process group, as a terminal delivers SIGINT and SIGHUP: the claimers ignore
        # both (the supervisor stops the pod), and the fork server does
        if sig == signal.SIGTERM:
            w.signal(sig)
        else:
            w.signal_group(sig)
        assert w.wait(30) == code, w.logs()[-3000:]
        out = w.stdout()
    # graceful: the running job had its grace and finished
    assert q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job_id) == [("succeeded",)]
    if mode:
        summary = json.loads(out.strip().splitlines()[-1])
        assert (summary["result"], summary["succeeded"]) == ("interrupted", 1)
    assert code in documented()


@pytest.mark.acceptance
@pytest.mark.parametrize("args, code", [
    (["run", "--no-such-flag"], 2),  # the command line does not parse
    (["run"], 1),  # a ConfigError: no --app
])
def test_usage_and_configuration_errors(pg_dsn, args, code):
    env = {k: v for k, v in os.environ.items() if k != "PGWORKER_APP"}
    out = subprocess.run([sys.executable, "-m", "pgworker.cli", *args, "--dsn", pg_dsn], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == code, out.stderr
    assert code in documented() and "Traceback" not in out.stderr


@pytest.mark.acceptance
def test_a_handlers_subprocess_ignores_sigint_and_sighup_unless_it_restores_them(env, pg_dsn, conn):
    """docs/reliability.md (Known limits): the claimers ignore SIGINT and SIGHUP, so that a
    terminal's Ctrl-C and hangup leave the stop to the supervisor; an ignored signal stays
    ignored across exec, so a handler's `subprocess` child ignores them too (a terminal's
    Ctrl-C does not kill it mid-job) while SIGTERM reaches it with its default; the fix the
    docs give, `os.posix_spawn(..., setsigdef=...)`, restores both. A no-op handler in place
    of SIG_IGN would change the first half, and the docs with it."""
    schema = env.settings.schema
    job_id = env.enqueue("child_signals", None)
    with Worker(pg_dsn, schema, "--concurrency", "1", "--drain") as w:
        assert w.wait(60) == 0, w.logs()[-3000:]
    assert q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job_id) == [("succeeded",)]
    masks = dict(q(conn, schema, "SELECT event, note FROM {s}.ledger WHERE job_id = %s", job_id))

    def ignored(event: str) -> set[signal.Signals]:
        bits = int(masks[event], 16)
        return {s for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM) if bits >> (s - 1) & 1}

    assert ignored("popen") == {signal.SIGINT, signal.SIGHUP}, masks
    assert ignored("posix_spawn") == set(), masks
