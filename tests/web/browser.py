"""Headless Chromium from Debian's packages (chromium, chromium-driver) driven by Selenium.

The machine's network is closed: the browser is started without its background
services (component updates, sync, safe browsing pings), with a fresh profile, so it
only ever talks to the console under test on 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

CHROMIUM = os.environ.get("PGWORKER_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PGWORKER_CHROMEDRIVER", "/usr/bin/chromedriver")


def missing() -> str | None:
    """Why no browser can run here (None: it can)."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.path.exists(path):
            return f"{path} is missing: apt-get install chromium chromium-driver (.ci/run does)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[test]'"
    return None


def start(width: int = 1400, height: int = 900) -> Any:
    """A headless Chromium session; the caller quits it (its profile goes with it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="pgworker-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--disable-default-apps", "--disable-extensions", "--metrics-recording-only",
                 "--safebrowsing-disable-auto-update", "--password-store=basic", f"--user-data-dir={profile}",
                 f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    original_quit = driver.quit

    def quit_and_clean() -> None:
        try:
            original_quit()
        finally:
            shutil.rmtree(profile, ignore_errors=True)

    driver.quit = quit_and_clean  # type: ignore[method-assign]
    driver.set_page_load_timeout(30)
    return driver


def full_screenshot(driver: Any, path: str, max_height: int = 2400) -> None:
    """A PNG of the whole page (up to ``max_height`` pixels tall)."""
    height = min(max_height, driver.execute_script("return document.documentElement.scrollHeight"))
    width = driver.get_window_size()["width"]
    driver.set_window_size(width, max(400, height + 120))
    driver.save_screenshot(path)
