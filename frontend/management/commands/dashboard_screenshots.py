"""`python manage.py dashboard_screenshots`: regenerate docs/screenshots/*.png.

Creates a throw-away test database (never touches the configured one's data), seeds it with the
synthetic demo history, serves it on a live server thread on 127.0.0.1, logs in with headless
Chromium and captures every page."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, connections
from django.test.testcases import LiveServerThread
from django.utils import timezone

from controlplane.accounts.models import Membership, Role, Team
from controlplane.accounts.services import api_token_create
from controlplane.webhooks.alerts import alert_endpoint_create
from frontend import browser
from spotpipe.demo import history as demo_history

USERNAME, PASSWORD = "demo", "spotpipe-demo"


def seed() -> dict[str, Any]:
    """The demo team's history and a month of prices for a few pools."""
    now = timezone.now()
    pools = demo_history.ensure_market(pools=8)
    demo_history.load_prices(demo_history.price_rows(pools=pools, start=now - timedelta(days=30), end=now,
                                               changes_per_pool=1500))
    team = Team.objects.create(name="Demo team", slug="demo")
    user = get_user_model().objects.create_user(username=USERNAME, password=PASSWORD)
    Membership.objects.create(team=team, user=user, role=Role.ADMIN)
    colleague = get_user_model().objects.create_user(username="lee", password=PASSWORD)
    Membership.objects.create(team=team, user=colleague, role=Role.MEMBER)
    api_token_create(team=team, user=user, name="ci-pipeline")
    alert_endpoint_create(team=team, url="https://hooks.slack.example/services/T000/B000", format="slack")
    return demo_history.seed_team_activity(team=team, user=user, pools=pools, now=now, metric_steps=3000)


class Command(BaseCommand):
    help = "Regenerate the dashboard screenshots in docs/screenshots/ (headless Chromium, demo data)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--out", type=Path, default=Path(settings.BASE_DIR) / "docs" / "screenshots")
        parser.add_argument("--width", type=int, default=1280)
        parser.add_argument("--height", type=int, default=900)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError as error:
            raise CommandError("needs Playwright's Python package: pip install playwright") from error
        out: Path = options["out"]
        out.mkdir(parents=True, exist_ok=True)
        old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
        server = None
        try:
            jobs = seed()
            # An in-memory SQLite test database is shared with the server thread's requests.
            overrides = {"default": connections["default"]} if connection.vendor == "sqlite" else None
            if overrides:
                connection.inc_thread_sharing()
            server = LiveServerThread("127.0.0.1", StaticFilesHandler, connections_override=overrides, port=0)
            server.daemon = True
            server.start()
            server.is_ready.wait()
            if server.error:
                raise CommandError(f"live server failed: {server.error}")
            base = f"http://127.0.0.1:{server.port}"
            shots = [
                ("overview", "/"), ("prices", "/prices/"), ("fleet", "/fleet/"), ("jobs", "/jobs/"),
                ("job-detail", f"/jobs/{jobs['running'].pk}/"), ("cost-report", f"/jobs/{jobs['running'].pk}/cost/"),
                ("job-empty", f"/jobs/{jobs['pending'].pk}/"), ("notices", "/notices/"), ("job-submit", "/jobs/new/"),
                ("team", "/team/demo/"),
            ]
            with sync_playwright() as pw:
                chromium = browser.launch(pw)
                try:
                    page = chromium.new_page(viewport={"width": options["width"], "height": options["height"]})
                    page.set_default_timeout(browser.DEFAULT_TIMEOUT_MS)
                    page.goto(f"{base}/accounts/login/")
                    page.screenshot(path=str(out / "login.png"))
                    browser.login(page, base, USERNAME, PASSWORD)
                    for name, path in shots:
                        page.goto(base + path)
                        if name not in ("job-submit", "team"):
                            browser.wait_loaded(page)
                        time.sleep(0.3)  # let plotly finish its transitions before capturing
                        page.screenshot(path=str(out / f"{name}.png"), full_page=True)
                        self.stdout.write(f"wrote {out / name}.png")
                    phone = chromium.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=1)
                    browser.login(phone, base, USERNAME, PASSWORD)
                    browser.wait_loaded(phone)
                    time.sleep(0.3)
                    phone.screenshot(path=str(out / "overview-phone.png"), full_page=True)
                    self.stdout.write(f"wrote {out / 'overview-phone.png'}")
                finally:
                    chromium.close()
        finally:
            if server is not None:
                server.terminate()
            if connection.vendor == "sqlite":
                connection.dec_thread_sharing()
            connection.creation.destroy_test_db(old_name, verbosity=0)
