"""Finding the user's App from a reference such as ``myproject.tasks:app``."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

from .errors import ConfigError


def load_app(ref: str) -> Any:
    """Import ``module:attribute`` or ``path/to/file.py:attribute`` and return the App.

    Claimer processes start with ``spawn`` and import the app again from this reference,
    so it must be importable (on ``sys.path``, or a file path). Raises
    :class:`ConfigError` naming what is missing.
    """
    from .app import App

    if ":" not in ref:
        raise ConfigError(f"--app {ref!r} must look like 'package.module:app' or 'path/to/file.py:app'")
    module_ref, _, attr = ref.rpartition(":")
    if module_ref.endswith(".py") or os.sep in module_ref:
        path = os.path.abspath(module_ref)
        if not os.path.exists(path):
            raise ConfigError(f"--app {ref!r}: file {path} does not exist")
        name = "pgworker_app_" + os.path.splitext(os.path.basename(path))[0]
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ConfigError(f"--app {ref!r}: cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            sys.path.insert(0, os.path.dirname(path))
            spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_ref)
        except ImportError as exc:
            raise ConfigError(f"--app {ref!r}: cannot import {module_ref!r}: {exc}; run from the project "
                              "directory or set PYTHONPATH") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"--app {ref!r}: module {module_ref!r} has no attribute {attr!r}") from None
    if callable(obj) and not isinstance(obj, App):
        obj = obj()
    if not isinstance(obj, App):
        raise ConfigError(f"--app {ref!r} is a {type(obj).__name__}, not a pgworker.App")
    return obj
