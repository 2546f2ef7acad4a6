"""From parsed arguments to the App: the Settings the flags override, and the App they
configure (the --app's, or one from the environment)."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import ConfigError
from .parser import SETTING_FLAGS, SETTING_SWITCHES


def _settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    from ..config import _queue_counts, _queues

    o: dict[str, Any] = {}
    for dest, name in SETTING_FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            o[name] = value
    for dest, (name, value) in SETTING_SWITCHES.items():
        if getattr(args, dest, False):
            o[name] = value
    if o.get("queues") is not None:
        try:
            o["queues"] = _queues(o["queues"])
        except ValueError as exc:
            raise ConfigError(f"--queues {exc}") from None
    if o.get("queue_concurrency"):
        try:
            o["queue_concurrency"] = _queue_counts(o["queue_concurrency"])
        except ValueError as exc:
            raise ConfigError(f"--queue-concurrency: {exc}; example: --queue-concurrency emails=2,reports=1") from None
    else:
        o.pop("queue_concurrency", None)
    if o.get("queues") == ():
        del o["queues"]  # `--queues ''`: as if not given
    return o


def _make_app(args: argparse.Namespace, *, need_app: bool = False) -> Any:
    """The App the command works with: the --app's with the flags applied, or one from
    the environment. Raises :class:`ConfigError`; one refusing a setting that has a
    flag names the flag beside its variable (the value may have come from either)."""
    try:
        return _app_of(args, need_app=need_app)
    except ConfigError as exc:
        raise ConfigError(_name_the_flags(str(exc))) from None


def _name_the_flags(message: str) -> str:
    """'set PGWORKER_LEASE_SECONDS' -> 'set --lease or PGWORKER_LEASE_SECONDS'."""
    from ..config import env_var_names

    variables = env_var_names()
    for dest, name in SETTING_FLAGS.items():
        variable = variables.get(name)
        flag = "--" + dest.replace("_", "-")
        if variable and f"set {variable}" in message and flag not in message:
            message = message.replace(f"set {variable}", f"set {flag} or {variable}")
    return message


def _app_of(args: argparse.Namespace, *, need_app: bool) -> Any:
    from ..app import App
    from ..config import Settings
    from ..loader import load_app

    if args.app:
        app = load_app(args.app)
        overrides = _settings_overrides(args)
        if overrides:  # no flag: the settings the App built are the ones (not built, checked, and its pool dropped again)
            app.configure(app.settings.replace(**overrides))
        return app
    if need_app:
        raise ConfigError("pgworker run needs your App: --app package.module:app (or PGWORKER_APP); "
                          "try `pgworker demo` for a self-contained example")
    return App(settings=Settings.from_env(**_settings_overrides(args)))
