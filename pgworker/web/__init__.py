"""pgworker's web console: find any job, see why it failed, replay, cancel, pause.

Server-rendered pages (Starlette and Jinja2, no front-end build; a small static script
adds live updates, and every page works without it) and a JSON API beside them, over the
same App methods and store statements as the CLI. Run it with ``pgworker web`` or mount
:func:`create_app` in your own ASGI application (docs/web.md). Needs the ``web`` extra:
``pip install 'pgworker[web]'``.
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    from ..errors import ConfigError

    raise ConfigError(f"the web console needs the 'web' extra ({exc.name} is not installed): "
                      "pip install 'pgworker[web]'") from None

from .app import create_app  # noqa: E402
from .auth import ACTIONS, ADMIN, OPERATOR, ROLES, VIEWER, Credentials, Principal, anonymous, role_permits  # noqa: E402
from .config import WebConfig  # noqa: E402

__all__ = ["create_app", "Principal", "anonymous", "role_permits", "Credentials", "WebConfig", "ACTIONS", "ROLES",
           "VIEWER", "OPERATOR", "ADMIN"]
