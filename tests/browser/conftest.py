"""Shared browser fixtures: one headless Chromium per module, a fresh tab per test."""

from __future__ import annotations

import pytest

from frontend import browser


@pytest.fixture(scope="module")
def chromium(django_db_setup):
    """One browser for the module. Playwright's sync API keeps an event loop in this thread while
    it lives; the ORM calls that tests and fixtures make between browser steps (seeding, the flush
    after each transactional test) are plain synchronous code, so Django's async guard stands aside
    for exactly that long."""
    import os

    from playwright.sync_api import sync_playwright

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as pw:
            instance = browser.launch(pw)
            yield instance
            instance.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(chromium):
    context = chromium.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.set_default_timeout(browser.DEFAULT_TIMEOUT_MS)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.js_errors = errors
    yield tab
    context.close()
    assert not errors, f"JavaScript errors: {errors}"
