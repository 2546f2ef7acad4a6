"""docs/configuration.md, rendered from the code that defines each setting.

``python -m pgworker.settings_docs > docs/configuration.md`` regenerates the file; a test
fails when the committed copy differs. The sources: :class:`pgworker.Settings` (each
field's environment variable, default and metadata ``help``/``unit``), the command
line's parser (``pgworker.cli.build_parser`` and its tables of flags that set a field),
the retry defaults (:class:`pgworker.RetryPolicy`, which the reaper applies too), and the
options of ``@app.task`` (``TASK_OPTIONS``, checked against ``App.task``'s
signature). Variables read outside ``Settings`` are listed in ``OTHER_VARIABLES``
and ``TEST_VARIABLES``; a test checks that every ``PGWORKER_*`` name the project
reads is in the rendered file. Those three tables are data, kept in
:mod:`pgworker.settings_catalog`; this module renders.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect

from . import cli
from .cli import values as cli_values
from .app import App
from .config import Settings
from .jobs import MAX_DELAY_SECONDS
from .retry import RetryPolicy
from .settings_catalog import OTHER_VARIABLES, TASK_OPTIONS, TEST_VARIABLES
from .tasks import DEFAULT_MAX_ATTEMPTS
from .web.config import WEB_VARIABLES

DURATION = "duration"
_DURATION_LEGEND = ("a **duration** is a number of seconds, or a number with a unit: `250ms`, `30s`, "
                    "`15m`, `12h`, `7d`, `2w`")


def _g(value: float) -> str:
    """A number as a reader types it: ``:g`` alone wrote 90 days as 7.776e+06."""
    if float(value).is_integer() and abs(value) >= 1e6:
        return f"{int(value):,}"
    return f"{value:g}"


def _code(text: str) -> str:
    return f"`{text}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# -- settings -----------------------------------------------------------------------------


def setting_unit(f: dataclasses.Field) -> str:
    """The unit of a setting: its metadata ``unit``, else from its name's suffix or type."""
    if f.metadata.get("unit"):
        return f.metadata["unit"]
    if f.name.endswith("_seconds"):
        return "seconds"
    if f.name.endswith("_bytes"):
        return "bytes"
    if f.type in (bool, "bool"):  # a string under `from __future__ import annotations`
        return "true or false"
    raise ValueError(f"Settings.{f.name}: give its unit in the field's metadata (_env(..., unit=...))")


def setting_default(f: dataclasses.Field) -> str:
    if f.metadata.get("default_text"):
        return f.metadata["default_text"]
    if f.default is dataclasses.MISSING:
        raise ValueError(f"Settings.{f.name}: a default_factory needs default_text in its metadata")
    if isinstance(f.default, bool):
        return "true" if f.default else "false"
    if isinstance(f.default, float):
        return _g(f.default)
    if isinstance(f.default, int) and f.default >= 10_000:
        return f"{f.default:,}"
    if f.default is None:
        return "none"
    return str(f.default)


def _run_flags() -> dict[str, list[str]]:
    """Settings field -> the flags of `pgworker run` that set it."""
    run = _commands(cli.build_parser())["run"]
    out: dict[str, list[str]] = {}
    for action in run._actions:
        if action.dest in cli.SETTING_FLAGS:
            out.setdefault(cli.SETTING_FLAGS[action.dest], []).extend(action.option_strings)
        elif action.dest in cli.SETTING_SWITCHES:
            out.setdefault(cli.SETTING_SWITCHES[action.dest][0], []).extend(action.option_strings)
    return out


def setting_row(f: dataclasses.Field, flags: dict[str, list[str]]) -> str:
    """One setting's row of the table; raises ValueError when its metadata lacks help."""
    if not f.metadata.get("help"):
        raise ValueError(f"Settings.{f.name}: give it help in the field's metadata (_env(..., help=...))")
    flag = ", ".join(_code(x) for x in flags.get(f.name, [])) or "-"
    return (f"| `{f.name}` | `{f.metadata['env']}` | {flag} | {_cell(setting_default(f))} | "
            f"{_cell(setting_unit(f))} | {_cell(f.metadata['help'])} |")


def _settings_table() -> list[str]:
    flags = _run_flags()
    lines = ["| setting | variable | flag | default | unit | meaning |", "|---|---|---|---|---|---|"]
    lines += [setting_row(f, flags) for f in dataclasses.fields(Settings)]
    return lines


# -- the command line ---------------------------------------------------------------------


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """{'run': parser, 'queue set': parser, ...}: every command that takes options
    (a command with subcommands is listed, too, when it runs one by default)."""
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        if path:
            out[path] = p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}".strip())

    walk(parser, "")
    return out


def _command_help(parser: argparse.ArgumentParser) -> dict[str, str]:
    out: dict[str, str] = {}

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    out[f"{path} {choice.dest}".strip()] = choice.help or ""
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}".strip())

    walk(parser, "")
    return out


COMMON = ("dsn", "schema", "app", "json")


def _value(action: argparse.Action) -> str:
    """What a flag takes."""
    if action.nargs == 0:
        return "switch"
    if action.choices:
        return " or ".join(_code(str(c)) for c in action.choices)
    kind = {cli.parse_duration: DURATION, cli._duration_or_none: f"{DURATION} or `none`", int: "integer",
            float: "number", cli._int_or_none: "integer or `none`",
            cli._float_or_none: "number or `none`", cli_values._job_id: "id (digits, 1 to 2**63-1)",
            cli_values._positive_int: "integer, at least 1",
            cli_values._replay_limit: "integer, 1 to 1,000,000"}.get(action.type, "text")
    return kind + {"*": ", any number", "+": ", one or more"}.get(str(action.nargs), "")


def _flag_default(action: argparse.Action, command: str) -> str:
    if getattr(action, "doc_default", None):  # a default argparse cannot state (the demo's schema)
        return str(action.doc_default)  # type: ignore[attr-defined]
    settings = {f.name: f for f in dataclasses.fields(Settings)}
    setting_flag = action.dest in cli.SETTING_FLAGS and (command == "run" or action.dest in ("dsn", "schema"))
    if setting_flag:
        f = settings[cli.SETTING_FLAGS[action.dest]]
        return f"`{f.metadata['env']}`, else {setting_default(f)}"
    if action.dest in cli.ENV_FLAGS:
        variable, default = cli.ENV_FLAGS[action.dest]
        return f"`{variable}`" + (f", else {default}" if default else "")
    if action.dest in cli.SETTING_SWITCHES and command == "run":
        name, _ = cli.SETTING_SWITCHES[action.dest]
        return f"off (`{settings[name].metadata['env']}`)"
    if action.nargs in ("*", "?"):
        return "-"  # argparse marks a '*' positional required, yet none is needed
    if action.required:
        return "required"
    if action.nargs == 0:
        return "off"
    if action.default is None or action.default is cli._ABSENT:
        return "-"
    return f"{action.default:,}" if isinstance(action.default, int) else str(action.default)


def _flag_name(action: argparse.Action) -> str:
    """The flag as typed (what it takes is in the value column), or a positional's name."""
    if action.option_strings:
        return ", ".join(_code(o) for o in action.option_strings)
    name = action.metavar or action.dest.upper()
    return _code(f"{name} ..." if action.nargs in ("*", "+") else name)


def _options_table(actions: list[argparse.Action], command: str) -> list[str]:
    lines = ["| flag | value | default | meaning |", "|---|---|---|---|"]
    for action in actions:
        lines.append(f"| {_flag_name(action)} | {_value(action)} | {_cell(_flag_default(action, command))} | "
                     f"{_cell(action.help or '')} |")
    return lines


def _commands_section() -> list[str]:
    parser = cli.build_parser()
    helps = _command_help(parser)
    commands = _commands(parser)
    run = commands["run"]
    common = [a for a in run._actions if a.dest in COMMON]
    lines = ["## Commands and their flags", "",
             f"Every flag is spelled out in full (no abbreviations); {_DURATION_LEGEND}. "
             "Exit codes: 0 success (an always-on worker stopped gracefully by a first SIGTERM or Ctrl-C "
             "included), 1 error, 2 bad usage, 75 a drain run hit its deadline with due work left, 130 "
             "Ctrl-C, 143 SIGTERM and 129 SIGHUP (128 + the signal's number): a drain run's first (a graceful stop; its "
             "summary says `interrupted`), any run's second (at once, running jobs not released), Ctrl-C of "
             "any other command; 141 output cut short by its reader (`| head`). docs/deploy.md has the "
             "table.", "",
             "### Options of every command", ""]
    lines += _options_table(common, "")
    # a command that prints no result has no --json (`web` serves pages), one that loads no
    # app of yours no --app (`demo`): named, so that "every command" stays true; a group of
    # subcommands (`sql`) takes none of them itself, so only a command with the others is named
    dests = {path: {a.dest for a in p._actions} for path, p in commands.items()}
    for dest, why in (("app", "load{s} no app of yours"), ("json", "print{s} no result")):
        lacking = [f"`pgworker {path}`" for path, d in dests.items() if d & set(COMMON) and dest not in d]
        if lacking:
            listed = lacking[0] if len(lacking) == 1 else ", ".join(lacking[:-1]) + " or " + lacking[-1]
            lines += ["", f"`--{dest}` is not on {listed}, which {why.format(s='s' if len(lacking) == 1 else '')}."]
    common_help = {a.dest: a.help for a in common}
    for path, p in commands.items():
        own = [a for a in p._actions if common_help.get(a.dest, a) != a.help and not isinstance(
            a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction))]
        text = helps.get(path, "").rstrip(".")
        lines += ["", f"### `pgworker {path}`", "", text[:1].upper() + text[1:] + "."]
        if own:
            lines += [""] + _options_table(own, path)
    return lines


# -- retries and tasks ----------------------------------------------------------------------


def _retry_section() -> list[str]:
    policy = RetryPolicy()
    rows = [("base_seconds", "seconds", "the wait after the first failed attempt, before jitter"),
            ("factor", "multiplier", "each further retry waits this many times longer"),
            ("max_seconds", "seconds", "the cap of the wait, before jitter"),
            ("jitter", "fraction, 0-1", "up to this fraction of the wait is taken off at random, so that "
                                        "jobs failing together do not retry together")]
    lines = ["## Retries", "",
             "A failed attempt (an exception other than `pgworker.Permanent`) is retried after",
             "`min(max_seconds, base_seconds * factor ** (n - 1)) * (1 - jitter * random())` seconds, n being",
             "the attempt that failed, until the job's attempts (`max_attempts`, default "
             f"{DEFAULT_MAX_ATTEMPTS}) are spent; it is then",
             "dead. `pgworker.RetryPolicy` (pgworker/retry.py), given per task as `@app.task(retry=...)`:", "",
             "| field | default | unit | meaning |", "|---|---|---|---|"]
    for name, unit, meaning in rows:
        lines.append(f"| `{name}` | {_g(getattr(policy, name))} | {unit} | {meaning} |")
    lines += ["", "Each is a finite number; `max_seconds` is at most "
              f"{MAX_DELAY_SECONDS:,.0f} s (100 years, the longest delay a job can be given), `base_seconds` "
              "at most `max_seconds`, `factor` at least 1, `jitter` from 0 to 1: anything else is refused "
              "with a `ConfigError` when the policy is made."]
    waits = []
    for n in range(1, DEFAULT_MAX_ATTEMPTS):
        longest = policy.delay(n, rng=lambda: 0.0)
        waits.append(f"{_g(longest * (1 - policy.jitter))}-{_g(longest)} s")
    capped = next(n for n in range(1, 64) if policy.delay(n, rng=lambda: 0.0) >= policy.max_seconds)
    lines += [
        "",
        f"With the defaults, the retries of a job with {DEFAULT_MAX_ATTEMPTS} attempts wait "
        f"{', '.join(waits)}; from the retry after attempt {capped} on, every wait is "
        f"{_g(policy.max_seconds * (1 - policy.jitter))}-{_g(policy.max_seconds)} s.",
        "",
        "```python",
        "@app.task(name=\"sync_crm\", max_attempts=10,",
        "          retry=pgworker.RetryPolicy(base_seconds=5, factor=3, max_seconds=600, jitter=1.0))",
        "def sync_crm(payload): ...",
        "```",
        "",
        "A handler can also decide: `raise pgworker.Retry(after=seconds)` waits that long instead (the "
        "attempt counts), `raise pgworker.Snooze(seconds)` runs the job again later without spending an "
        "attempt, `raise pgworker.Permanent(reason)` makes it dead at once; `permanent_errors=` and "
        "`App(classify_error=...)` classify exceptions.",
        "",
        "A dead job replayed (`pgworker dead replay`, `App.replay`, the console's replay) is pending "
        "again with a full retry budget: its next run is attempt 1 (`ctx.attempt`) of the `max_attempts` "
        "it was enqueued with (`ctx.is_last_attempt` only at the last of them again), its retries wait "
        "from `base_seconds` again, and its earlier attempts stay in its error history.",
        "",
        "A job whose lease expired (its claimer died or stalled; the attempt counts) is put back by the "
        "reaper after the same policy, its task's (the default policy for a task the worker does not know): "
        "one policy per task, however the attempt ended; dead with `LEASE_EXPIRED` once its attempts are spent.",
    ]
    return lines


def _task_section() -> list[str]:
    params = [p for p in inspect.signature(App.task).parameters.values() if p.name not in ("self", "func")]
    missing = [p.name for p in params if p.name not in TASK_OPTIONS]
    if missing:
        raise ValueError(f"@app.task options without an entry in settings_catalog.TASK_OPTIONS: {missing}")
    task_fields = {f.name: f for f in dataclasses.fields(__import__("pgworker").Task)}
    lines = ["## Task options", "",
             "`@app.task(...)` (see `App.task`); `enqueue(...)` takes `queue`, `priority`, `max_attempts`, "
             "`ordering_on_dead` and `dedupe_window` per job too.", "",
             "| option | default | unit | meaning |", "|---|---|---|---|"]
    for p in params:
        default = p.default
        if default is None and p.name in task_fields:
            f = task_fields[p.name]
            default = f.default if f.default is not dataclasses.MISSING else None
        if p.name == "retry":
            text = "`RetryPolicy()`"
        elif p.name == "queue":
            text = "`default`"
        elif default is None or default == ():
            text = "none"
        else:
            text = f"`{default}`" if isinstance(default, str) else _g(default) if isinstance(default, float) \
                else str(default)
        unit, meaning = TASK_OPTIONS[p.name]
        lines.append(f"| `{p.name}` | {text} | {unit} | {_cell(meaning)} |")
    return lines


def render() -> str:
    """docs/configuration.md. Raises ValueError when a setting lacks its help or unit, or
    an ``@app.task`` option has no entry in :data:`TASK_OPTIONS`."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m pgworker.settings_docs > docs/configuration.md` from",
        "     pgworker/config.py, pgworker/cli/parser.py and pgworker/retry.py; a test fails when it is stale. -->",
        "",
        "Every setting, environment variable and command-line flag, with its default and unit.",
        "",
        "Where a value comes from: a command-line flag wins; otherwise the App's settings apply.",
        "`App()` (and every command run without `--app`) reads the `PGWORKER_*` variables,",
        "`App(settings=Settings(...))` takes yours, and `Settings.from_env(**overrides)` reads the",
        "variables with your keyword overrides winning. An empty variable counts as unset. Booleans",
        "read `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off`. A bad value stops the process at",
        "start-up with the name of the setting to fix.",
        "",
        "## Settings (`pgworker.Settings`)",
        "",
    ]
    lines += _settings_table()
    lines += ["", "## Other variables", "",
              "| variable | flag | default | meaning |", "|---|---|---|---|"]
    for variable, flag, default, meaning in OTHER_VARIABLES:
        lines.append(f"| `{variable}` | {_code(flag) if flag else '-'} | {_cell(default)} | {_cell(meaning)} |")
    lines += ["", "## Variables of the web console (`pgworker web`, docs/web.md)", "",
              "| variable | flag | default | meaning |", "|---|---|---|---|"]
    for variable, flag, default, meaning in WEB_VARIABLES:
        lines.append(f"| `{variable}` | {_code(flag) if flag else '-'} | {_cell(default)} | {_cell(meaning)} |")
    lines += ["", "The OpenTelemetry SDK reads the standard `OTEL_*` variables (`OTEL_TRACES_EXPORTER`,",
              "`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, ...): see",
              "docs/observability.md.", ""]
    lines += _retry_section()
    lines += [""] + _task_section()
    lines += [""] + _commands_section()
    lines += ["", "## Variables of the tests and benchmarks", "",
              "| variable | default | meaning |", "|---|---|---|"]
    for variable, default, meaning in TEST_VARIABLES:
        lines.append(f"| `{variable}` | {_cell(default)} | {_cell(meaning)} |")
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":  # python -m pgworker.settings_docs > docs/configuration.md
    print(render(), end="")
