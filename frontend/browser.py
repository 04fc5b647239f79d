"""Driving the system's headless Chromium (Debian's `chromium` package) with Playwright, for the
browser tests and the screenshot command. Playwright's own browser download is never used: the
machine has no internet, so we point it at the installed binary."""

from __future__ import annotations

import os
import shutil
from typing import Any

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]
DEFAULT_TIMEOUT_MS = 15000

# Plotly draws into `.main-svg`; a drawn trace leaves a line path or bar/point shapes behind.
DRAWN_POINTS_JS = """(id) => {
  const node = document.getElementById(id);
  if (!node || !node.data) return 0;
  const drawn = node.querySelectorAll(
    '.scatterlayer .trace path.js-line, .scatterlayer .trace .points path, .barlayer .point path');
  return drawn.length ? node.data.reduce((n, t) => n + (t.x || t.y || []).length, 0) : 0;
}"""


def chromium_path() -> str:
    """The Chromium binary: $SPOTPIPE_CHROMIUM, else `chromium` (or `chromium-browser`) on PATH."""
    path = os.environ.get("SPOTPIPE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        raise RuntimeError("Chromium not found: install Debian's package (apt-get install -y chromium) "
                           "or set SPOTPIPE_CHROMIUM to the browser binary")
    return path


def launch(playwright: Any) -> Any:
    """A headless Chromium browser from the system package."""
    return playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True,
                                      timeout=DEFAULT_TIMEOUT_MS * 2)


def login(page: Any, base_url: str, username: str, password: str) -> None:
    """Log in through the login form and wait for the overview."""
    page.goto(f"{base_url}/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base_url}/")


def wait_loaded(page: Any) -> None:
    """Wait until the page's data endpoint answered and was drawn (body[data-loaded])."""
    page.wait_for_selector("body[data-loaded]", state="attached", timeout=DEFAULT_TIMEOUT_MS)


def drawn_points(page: Any, chart_id: str) -> int:
    """How many data points the plot `chart_id` drew (0 when it shows an empty state)."""
    return int(page.evaluate(DRAWN_POINTS_JS, chart_id))
