"""The command line's parser itself: no abbreviations, and every command and flag the
README gives exists as written."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pgworker.cli import build_parser

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _subparsers(parser):
    """{command path: its parser}, every level ('queue set' included)."""
    out = {}

    def walk(p, path):
        out[path] = p
        for action in p._actions:
            if action.__class__.__name__ == "_SubParsersAction":
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}".strip())

    walk(parser, "")
    return out


def test_no_parser_accepts_abbreviations():
    for path, p in _subparsers(build_parser()).items():
        assert p.allow_abbrev is False, f"`pgworker {path}` accepts abbreviated flags"


def test_every_command_line_in_the_readme_parses():
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)
    commands = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()
                if line.startswith("pgworker ")]
    assert len(commands) >= 10
    # the commands a new user looks for first: enqueueing a job (with its --payload) and
    # finding jobs by task
    assert any(c.startswith("pgworker enqueue ") and "--payload" in c for c in commands), commands
    assert any(c.startswith("pgworker jobs list ") and "--task" in c for c in commands), commands
    parser = build_parser()
    for command in commands:
        try:
            parser.parse_args(shlex.split(command)[1:])
        except SystemExit:
            pytest.fail(f"the README's `{command}` does not parse")


def test_flags_the_readme_pairs_with_a_variable_are_flags_of_run():
    """'`--queues`/`PGWORKER_QUEUES`': the README names a worker setting by its flag and its
    variable; the flag must be one of `pgworker run`, and set that variable's setting."""
    from pgworker.cli import ENV_FLAGS, SETTING_FLAGS
    from pgworker.config import env_var_names

    pairs = re.findall(r"`(--[a-z-]+)`/`(PGWORKER_[A-Z_]+)`", README.read_text())
    assert pairs
    run = _subparsers(build_parser())["run"]
    for flag, variable in pairs:
        assert flag in run._option_string_actions, f"README: {flag} (with {variable}) is not a flag of `pgworker run`"
        dest = run._option_string_actions[flag].dest
        named = env_var_names().get(SETTING_FLAGS.get(dest, "")) or ENV_FLAGS.get(dest, ("",))[0]
        assert named == variable, f"README: {flag} sets {named or 'no variable'}, not {variable}"


def test_every_command_and_flag_has_help():
    for path, p in _subparsers(build_parser()).items():
        for action in p._actions:
            if action.__class__.__name__ == "_SubParsersAction":
                listed = {a.dest for a in action._choices_actions}
                assert listed == set(action.choices), f"`pgworker {path}`: no help line for " \
                                                      f"{sorted(set(action.choices) - listed)}"
                continue
            assert action.help, f"`pgworker {path}`: {action.option_strings or action.dest} has no help"


def test_help_shows_no_internal_names(tmp_path):
    """`queue set --help` used to show `--concurrency LIMIT_CONCURRENCY`: the dest names
    that keep it apart from `run --concurrency`, not what to type."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pgworker.cli", "queue", "set", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "LIMIT_" not in out
    assert "--concurrency N" in out and "--aging DURATION" in out
    dead = subprocess.run([sys.executable, "-m", "pgworker.cli", "dead", "--help"], capture_output=True,
                          text=True, check=True).stdout
    assert "    list " in dead  # the default subcommand has its line too


@pytest.mark.parametrize("argv", [
    ["enqueue", "send_email", '{"to": "a@example.com", "token": "S3cret"}'],
    ["enqueue", "send_email", "--queue", "emails", '{"to": "a@example.com", "token": "S3cret"}'],
])
def test_a_payload_given_as_an_argument_points_to_payload(argv, capsys):
    """It said only "unrecognized arguments: {...}" (echoing the payload)."""
    from pgworker import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.endswith("pgworker enqueue: error: unexpected argument after the task's name (a payload?): give the "
                        "payload with --payload, e.g. `pgworker enqueue send_email --payload "
                        "'{\"to\": \"a@example.com\"}'`\n"), err
    assert "S3cret" not in err


def test_other_unrecognized_arguments_name_the_command_and_the_closest_option(capsys):
    """It said "pgworker: error: unrecognized arguments: --concurency 2" under the top
    level's usage: neither the command's options nor the one meant."""
    from pgworker import cli

    for argv, said in (
            (["status", "extra"], "pgworker status: error: unrecognized arguments: extra "
                                  "(`pgworker status --help` lists its options)\n"),
            (["enqueue", "t", "--bogus"], "pgworker enqueue: error: unrecognized arguments: --bogus "
                                          "(`pgworker enqueue --help` lists its options)\n"),
            (["enqueue", "t", "--prio", "5"], "pgworker enqueue: error: unrecognized arguments: --prio 5; "
                                              "did you mean --priority? (`pgworker enqueue --help` lists its options)\n"),
            (["run", "--concurency", "2"], "pgworker run: error: unrecognized arguments: --concurency 2; "
                                           "did you mean --concurrency? (`pgworker run --help` lists its options)\n"),
            (["jobs", "list", "--stat=dead"], "pgworker jobs list: error: unrecognized arguments: --stat=dead; "
                                              "did you mean --state? (`pgworker jobs list --help` lists its options)\n"),
            # a misspelt option meant as a required one: argparse reports the required one
            # first, which said nothing of the typo (a trial)
            (["effects", "resolve", "7", "charge", "--retyr"],
             "pgworker effects resolve: error: one of the arguments --result --retry is required; "
             "unrecognized '--retyr': did you mean --retry?\n"),
            # the option is echoed on one line, its bidi controls replaced (a break-it trial)
            (["effects", "resolve", "7", "charge", "--res\u202eult\nx"],
             "pgworker effects resolve: error: one of the arguments --result --retry is required; "
             "unrecognized '--res\ufffdult x': did you mean --result?\n"),
            # the app given as the worker's argument (a new user's trial)
            (["run", "myapp.tasks:app"], "pgworker run: error: unrecognized arguments: myapp.tasks:app; the app goes "
                                         "in --app: --app myapp.tasks:app (`pgworker run --help` lists its options)\n")):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.endswith(said), err
        assert err.startswith(f"usage: pgworker {argv[0]}"), err  # the command's usage, not the top level's


@pytest.mark.parametrize("shown", ["due", "scheduled", "blocked"])
def test_a_state_of_pgworker_status_given_to_jobs_list_says_it_is_pending(shown, capsys):
    """`pgworker status` shows 'blocked 2'; `pgworker jobs list --state blocked` said only
    "invalid choice: 'blocked'"."""
    from pgworker import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["jobs", "list", "--state", shown])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert f"'{shown}' is how `pgworker status` counts pending jobs" in err and "use --state pending" in err, err


@pytest.mark.parametrize("argv, said", [
    (["job", "list"], "argument COMMAND: invalid choice: 'job'; did you mean 'jobs'? (choose from 'migrate', "),
    (["jobs", "lst"], "invalid choice: 'lst'; did you mean 'list'? (choose from 'list', 'show', 'retry')"),
    (["graphs", "cancle", "1"], "did you mean 'cancel'?"),
    (["jobs", "list", "--state", "ded"], "argument --state: invalid choice: 'ded'; did you mean 'dead'?"),
    (["zzzz"], "invalid choice: 'zzzz' (choose from "),  # nothing close: no guess
    # a DSN typed where the command goes: its password is not echoed
    (["postgresql://u:s3cret@h/db"], "invalid choice: 'postgresql://u:********@h/db' (choose from "),
])
def test_a_mistyped_subcommand_or_choice_names_the_closest(argv, said, capsys):
    """argparse said only "invalid choice: 'job' (choose from ...)" (3.11 has no suggest_on_error)."""
    from pgworker import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and said in err and "s3cret" not in err, err


@pytest.mark.parametrize("argv, said", [
    (["enqueue", "t", "--delay", "-5s"], "argument --delay: '-5s' is negative: a duration is 0 or more"),
    (["prune", "--older-than", "-1d"], "argument --older-than: '-1d' is negative: a duration is 0 or more"),
    (["run", "--lease", "-5"], "argument --lease: '-5' is negative: a duration is 0 or more"),
])
def test_a_negative_duration_is_named_as_negative(argv, said, capsys):
    """argparse read '-5s' as an option and said only "argument --delay: expected one argument"."""
    from pgworker import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and said in err, err


def test_negative_numbers_and_payloads_still_parse():
    from pgworker.cli.parser import attach_negative_values, build_parser

    parser = build_parser()
    argv = attach_negative_values(parser, ["enqueue", "t", "--priority", "-5", "--payload", "-1", "--json"])
    args = parser.parse_args(argv)
    assert args.priority == -5 and args.payload == "-1" and args.json


ID_COMMANDS = [["jobs", "show"], ["jobs", "retry"], ["cancel"], ["dead", "replay"], ["graphs", "cancel"],
               ["graphs", "replay"], ["effects", "resolve", "--retry"], ["jobs", "list", "--graph"]]


@pytest.mark.parametrize("text, said", [
    ("1_3", "is not valid: write ids as plain digits 0-9"),  # int() read 13
    ("\u0661\u0663", "is not valid"),  # Arabic-Indic 13
    ("\uff10\uff15", "is not valid"),  # fullwidth 05
    (" 5", "is not valid"), ("+5", "is not valid"), ("5.0", "is not valid"),
    ("0", "id 0 is out of range: ids are 1 to 2**63-1"), ("-0", "id '-0' is not valid"),
    ("000", "out of range"), (str(2**63), "out of range"),
])
@pytest.mark.parametrize("command", ID_COMMANDS, ids=" ".join)
def test_an_id_is_plain_ascii_digits_from_1(command, text, said, capsys):
    """int() accepts underscores, spaces, signs and any script's digits: `jobs show 1_3`
    showed job 13, `graphs cancel 1_0` cancelled graph 10, `jobs show -- -0` said "no job 0"."""
    from pgworker import cli

    argv = [*command, "--", text] if command[-1] != "--graph" else [*command, text]
    if command[0] == "effects":
        argv = ["effects", "resolve", "--retry", "--", text, "name"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and said in err, err


def test_a_plain_id_parses():
    args = build_parser().parse_args(["jobs", "show", "0042"])
    assert args.id == 42
    assert build_parser().parse_args(["graphs", "cancel", str(2**63 - 1)]).graph_id == 2**63 - 1


@pytest.mark.parametrize("argv", [
    ["prune", "--older-than", "\u0661\u0660d"],        # Arabic-Indic 10: read as 10 days
    ["enqueue", "t", "--delay", "\u0661\u0660s"],       # read as 10 s
    ["enqueue", "t", "--delay", "\uff15m"],             # fullwidth 5: read as 5 minutes
    ["run", "--lease", "\u0966\u0969\u0966"],           # Devanagari 030
    ["jobs", "list", "--limit", "\u0665"],              # int() read 5
])
def test_a_duration_or_a_count_is_plain_ascii_digits(argv, capsys):
    """The duration parser's \\d matched any script's digits, as int() does: '١٠s' was 10
    seconds. Refused as ids are (names.parse_id), with the form wanted."""
    from pgworker import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "write its digits as plain 0-9" in err, err


def test_ascii_durations_still_parse():
    from pgworker.cli.values import parse_duration, retention_duration

    assert [parse_duration(t) for t in ("90", "90s", " 15m ", "1.5h", "250ms", "2w")] == \
        [90, 90, 900, 5400, 0.25, 1209600]
    assert retention_duration("7d") == 604800


def test_a_table_names_the_zone_of_its_times(monkeypatch):
    """A table's times are local: a schedule's next run read as UTC or as local time alike
    before the zone was printed (new-user trial)."""
    import time
    from datetime import datetime, timezone

    from pgworker.cli.output import _fmt

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        assert _fmt(datetime(2026, 12, 3, 19, 5, tzinfo=timezone.utc)) == "2026-12-03 19:05:00 UTC"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_web_offers_no_json_it_would_ignore(capsys):
    """`pgworker web --help` listed --json (the shared connection flags'), which the
    console never read; the commands that print a result keep it."""
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert not any("--json" in a.option_strings for a in commands["web"]._actions)
    for name in ("status", "enqueue", "cancel", "migrate"):
        assert any("--json" in a.option_strings for a in commands[name]._actions), name
    with pytest.raises(SystemExit):
        commands["web"].parse_args(["--help"])
    assert "--json" not in capsys.readouterr().out


def test_replay_takes_as_many_jobs_of_a_queue_by_default_from_the_api_and_the_command_line():
    """A new user's trial: `App.replay(queue=...)` took 1,000 dead jobs unless told, `pgworker
    dead replay --queue Q --all` 10,000. One constant now, pgworker.jobs.REPLAY_LIMIT."""
    import inspect

    from pgworker import App
    from pgworker.jobs import REPLAY_LIMIT
    from pgworker.store.operations import OperationStatements

    replay = _subparsers(build_parser())["dead replay"]
    [limit] = [a for a in replay._actions if a.dest == "limit"]
    defaults = {name: inspect.signature(f).parameters["limit"].default for name, f in (
        ("App.replay", App.replay), ("App.areplay", App.areplay),
        ("store.replay", OperationStatements.replay), ("store.replay_plan", OperationStatements.replay_plan))}
    assert defaults == dict.fromkeys(defaults, REPLAY_LIMIT) and limit.default == REPLAY_LIMIT == 10_000, defaults
    assert "10,000" in (App.replay.__doc__ or "")


def test_web_json_names_the_api_not_a_near_spelling(capsys):
    """A new user's trial: `pgworker web --json` said "did you mean --dsn?". The console has
    no --json on purpose; the fix is its JSON API (or a command that prints JSON)."""
    from pgworker import cli

    for argv in (["web", "--json"], ["web", "--json=1", "--port", "0"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "did you mean" not in err, err
        assert "`pgworker web` serves pages and prints no result, so it has no --json: the console's data as JSON " \
               "is its API, `GET /api/overview`" in err and "docs/web.md" in err, err
    with pytest.raises(SystemExit):  # a typo of another option keeps its closest spelling
        cli.main(["web", "--prot", "8080"])
    assert "did you mean --port?" in capsys.readouterr().err


def test_the_demo_takes_only_flags_it_uses_and_its_help_names_its_schema():
    """A new user's trial: `pgworker demo --help` said --schema defaults to pgworker (with a
    DSN the demo fills pgworker_demo) and listed --app and --json, which it ignored."""
    from pgworker.demo import DEMO_SCHEMA

    demo = _subparsers(build_parser())["demo"]
    flags = {f for a in demo._actions for f in a.option_strings}
    assert "--app" not in flags and "--json" not in flags
    schema_help = next(a.help for a in demo._actions if "--schema" in a.option_strings)
    assert f"default {DEMO_SCHEMA} " in schema_help
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--app", "x:app"])
