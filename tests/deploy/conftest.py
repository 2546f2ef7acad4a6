"""The deployment tier: every test here carries the `deploy` marker."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

_HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(item.fspath).startswith(_HERE + os.sep):
            item.add_marker(pytest.mark.deploy)


def pytest_terminal_summary(terminalreporter):
    imagetools = sys.modules.get("imagetools")
    for line in getattr(imagetools, "REPORT", []):
        terminalreporter.write_line(line)
