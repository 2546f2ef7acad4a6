"""Finding the user's App from a reference such as ``myproject.tasks:app``."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import shlex
import sys
import traceback
from types import ModuleType
from typing import Any

from .errors import ConfigError

FORMS = "'package.module:app' or 'path/to/file.py:app' (or ':create_app()' for a factory)"


def load_app(ref: str) -> Any:
    """Import ``module:attribute`` or ``path/to/file.py:attribute`` and return the App.

    The attribute must be a :class:`pgworker.App`. A factory is called only when the
    reference says so, ``module:create_app()``: it is called with no arguments and must
    return an App. Nothing else is ever called, so naming a task or another function by
    mistake runs no user code. Claimer processes start with ``spawn`` and load the app
    again from this reference (a factory is called in each of them), so it must be
    importable (on ``sys.path``, or a file path).

    Raises :class:`ConfigError` naming what is missing, or what was found instead of an
    App and what to pass.
    """
    from .app import App

    if ":" not in ref:
        raise ConfigError(f"--app {ref!r} must look like {FORMS}{_colon_hint(ref)}")
    module_ref, _, attr = ref.rpartition(":")
    call = attr.endswith("()")
    attr = attr.removesuffix("()")
    if module_ref.endswith(".py") or os.sep in module_ref:
        module = _load_file(ref, module_ref)
    else:
        module = _import(ref, module_ref)
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"--app {ref!r}: module {module_ref!r} has no attribute {attr!r}"
                          f"{_apps_hint(module_ref, module)}") from None
    if call:
        obj = _call_factory(ref, obj)
    if not isinstance(obj, App):
        raise ConfigError(_not_an_app(ref, module_ref, module, attr, obj))
    return obj


def _colon_hint(ref: str) -> str:
    """The reference the user probably meant: the App's name goes after a colon.

    When ``ref`` imports as a module it is the module the App lives in: the hint names its
    App(s), ``module:NAME``. Only when it does not, but its prefix does, is its last dotted
    part taken for the App's name (``pkg.tasks.app`` -> ``pkg.tasks:app``). Importing runs
    the module's code, as loading the corrected reference would.
    """
    if ref.endswith(".py") or os.sep in ref:
        return f": did you mean --app {_arg(ref + ':app')} (the name of the App in that file after the colon)?"
    if not ref:
        return ""
    if _is_module(ref):
        return _module_apps_hint(ref, _import(ref, ref))
    module, dot, attr = ref.rpartition(".")
    if dot and module and attr and _is_module(module):
        return f": did you mean --app {_arg(f'{module}:{attr}')}?"
    return (f"; {ref!r} is not an importable module here either (run from the project directory "
            "or set PYTHONPATH)")


def _arg(ref: str) -> str:
    """An --app value as a hint prints it: shell-quoted, since the hint is pasted into a
    shell (a factory's ``()`` is a shell syntax error unquoted; a path may hold spaces)."""
    return shlex.quote(ref)


def _is_module(name: str) -> bool:
    """Whether ``name`` is an importable module (its parent packages are imported to tell)."""
    _cwd_on_path()
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent is missing, or is not a package
        return False


def _module_apps_hint(module_ref: str, module: ModuleType) -> str:
    """': did you mean --app m:app?' for the App(s) a module given without ':NAME' holds."""
    from .app import App

    apps = sorted(name for name, value in vars(module).items() if isinstance(value, App))
    if apps:
        meant = [f"--app {_arg(module_ref + ':' + name)}" for name in apps]
        return f": did you mean {' or '.join(meant)}?"
    return (f": module {module_ref!r} defines no pgworker.App (app = pgworker.App(), with its "
            "@app.task functions); name the module that does, as module:NAME")


def _apps_hint(module_ref: str, module: ModuleType) -> str:
    """'; this module's App: --app m:app', or its Apps, or nothing when it holds none."""
    from .app import App

    apps = sorted(name for name, value in vars(module).items() if isinstance(value, App))
    if len(apps) == 1:
        return f"; this module's App: --app {_arg(f'{module_ref}:{apps[0]}')}"
    if apps:
        return f"; this module's Apps: {', '.join(apps)}"
    return "; it defines no pgworker.App (app = pgworker.App(), with its @app.task functions)"


def _load_file(ref: str, module_ref: str) -> ModuleType:
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
        try:
            spec.loader.exec_module(module)
        except ImportError as exc:
            del sys.modules[name]  # half-initialised: a later load must not find it
            # the file itself exists: whatever is missing is something it imports
            raise ConfigError(_import_failed(ref, module_ref, exc, own=())) from None
        except BaseException:
            del sys.modules[name]
            raise
    return module


def _cwd_on_path() -> None:
    # `pgworker run` is a console script: its sys.path lacks the directory it runs from
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def _import(ref: str, module_ref: str) -> ModuleType:
    _cwd_on_path()
    try:
        return importlib.import_module(module_ref)
    except ImportError as exc:
        parts = module_ref.split(".")
        own = tuple(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        raise ConfigError(_import_failed(ref, module_ref, exc, own=own)) from None


def _import_failed(ref: str, module_ref: str, exc: ImportError, *, own: tuple[str, ...]) -> str:
    """The message for an import of the app module that failed. ``own``: the app module
    and its parent packages: when one of those is what is missing, the reference (or
    sys.path) is wrong; when it is anything else, the user's module imports something
    this Python cannot find, and the path hint would send them the wrong way."""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing is not None and missing in own:
        return (f"--app {ref!r}: cannot import {module_ref!r}: {exc}; run from the project "
                "directory or set PYTHONPATH")
    site = _import_site(exc)
    where = f" ({site})" if site else ""
    if missing is not None:
        return (f"--app {ref!r}: {module_ref!r} imports {missing!r}{where}, which this Python "
                f"({sys.executable}) cannot find: install the package that provides it into this "
                "environment")
    return f"--app {ref!r}: importing {module_ref!r} failed{where}: {type(exc).__name__}: {exc}"


def _import_site(exc: BaseException) -> str | None:
    """'file:line' of the import statement that failed, in the user's code (the last
    frame of the traceback that is not importlib's own)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<frozen") and "importlib" not in f.filename]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None


def _call_factory(ref: str, factory: Any) -> Any:
    from .tasks import Task

    if isinstance(factory, Task) or inspect.isclass(factory) or not callable(factory):
        kind = "a pgworker Task" if isinstance(factory, Task) else (
            "a class" if inspect.isclass(factory) else f"a {type(factory).__name__}")
        raise ConfigError(f"--app {ref!r}: '()' calls an App factory, but this is {kind}; "
                          "name a function that takes no arguments and returns the App")
    try:
        inspect.signature(factory).bind()
    except TypeError:
        raise ConfigError(f"--app {ref!r}: the factory must take no arguments (its signature is "
                          f"{factory.__name__}{inspect.signature(factory)})") from None
    except ValueError:  # no signature to inspect (a builtin): let the call decide
        pass
    return factory()


def _not_an_app(ref: str, module_ref: str, module: ModuleType, attr: str, obj: Any) -> str:
    from .app import App
    from .tasks import Task

    apps = sorted(name for name, value in vars(module).items() if isinstance(value, App))
    if isinstance(obj, Task):
        holder = next((name for name in apps if getattr(module, name) is obj.app), None)
        fix = (f"pass the App it is registered on: --app {_arg(f'{module_ref}:{holder}')}" if holder
               else "pass the App it is registered on (the `app` of its @app.task)")
        return f"--app {ref!r} is the pgworker Task {obj.name!r}, not an App: {fix}"
    found = ("a class" if inspect.isclass(obj) else "a function" if callable(obj)
             else f"a {type(obj).__name__}")
    hint = _apps_hint(module_ref, module) if apps else ""
    if callable(obj) and not inspect.isclass(obj):
        hint += f"; if {attr!r} is a factory that returns the App, call it: --app {_arg(f'{module_ref}:{attr}()')}"
    return f"--app {ref!r} is {found}, not a pgworker.App{hint}"
