"""pgworker's web console: find any job, see why it failed, replay, cancel, pause.

Server-rendered pages (Starlette and Jinja2, no front-end build; a small static script
adds live updates, and every page works without it) and a JSON API beside them, over the
same App methods and store statements as the CLI. Run it with ``pgworker web`` or mount
:func:`create_app` in your own ASGI application (docs/web.md). Needs the ``web`` extra:
``pip install 'pgworker[web]'``; the names below are imported on first use, so that
``pgworker.web.config`` (read by the configuration reference) needs nothing more.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"create_app": ".app", "Principal": ".auth", "anonymous": ".auth", "role_permits": ".auth",
            "Credentials": ".auth", "ACTIONS": ".auth", "ROLES": ".auth", "VIEWER": ".auth", "OPERATOR": ".auth",
            "ADMIN": ".auth", "WebConfig": ".config"}
__all__ = sorted(_EXPORTS)


def require_extra() -> None:
    """Raise :class:`pgworker.ConfigError` naming the fix when the 'web' extra is missing."""
    try:
        import jinja2  # noqa: F401
        import multipart  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        from ..errors import ConfigError

        raise ConfigError(f"the web console needs the 'web' extra ({exc.name} is not installed): "
                          "pip install 'pgworker[web]'") from None


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pgworker.web' has no attribute {name!r}")
    if _EXPORTS[name] != ".config":
        require_extra()
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
