"""The admin in a real browser: the example project served by ``runserver``, one tenant
at its quota, the quota page in headless Chromium, a screenshot, and that tenant's bar full.

Chromium comes from the system (Debian's ``chromium`` package) and Playwright drives it.
Without Chromium the test is skipped, except under CI (``CI`` set), where it fails.
The project's database and broker folder are temporary; no worker runs, so the started
chat turns stay pending and hold their slots.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

EXAMPLE_PROJECT = Path(__file__).resolve().parent.parent / "example_project"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
USERNAME, PASSWORD = "admin", "browser-test-password"

pytestmark = pytest.mark.skipif(
    os.environ.get("DURABLE_TEST_DB", "sqlite") != "sqlite",
    reason="the example project runs on its own SQLite file; once is enough",
)

# Plans and tenants as in the demo; acme's 8 slots all taken, globex 1 of 2, and a ninth
# acme turn refused.
SETUP = f"""
from django.contrib.auth import get_user_model
from durable_django import ConcurrencyLimitError
from tenants.models import Plan, Tenant
from tenants.workflows import ChatTurnWorkflow

pro = Plan.objects.create(name="pro", max_active_turns=8)
starter = Plan.objects.create(name="starter", max_active_turns=2)
Tenant.objects.create(slug="acme", name="Acme Corporation", plan=pro)
Tenant.objects.create(slug="globex", name="Globex Inc.", plan=starter)
get_user_model().objects.create_superuser({USERNAME!r}, "admin@example.com", {PASSWORD!r})
for n in range(8):
    ChatTurnWorkflow.dispatch({{"tenant": "acme", "message": f"turn {{n}}"}})
ChatTurnWorkflow.dispatch({{"tenant": "globex", "message": "hello"}})
try:
    ChatTurnWorkflow.dispatch({{"tenant": "acme", "message": "one more"}})
except ConcurrencyLimitError as error:
    print("refused:", error)
"""


@pytest.fixture
def chromium() -> str:
    """The Chromium executable; skipped without it, except under CI, where it fails."""
    if Path(CHROMIUM).exists():
        return CHROMIUM
    message = f"Chromium not found at {CHROMIUM} (Debian: apt-get install -y chromium)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def project_env(tmp_path: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "CELERY_BROKER_URL")
    }
    env.update(
        DATABASE_URL=f"sqlite:///{tmp_path / 'chatsite.sqlite3'}",
        CELERY_BROKER_URL="filesystem://localhost/",
        BROKER_FOLDER=str(tmp_path / "broker"),
        DEBUG="true",  # runserver serves the admin's static files
        PYTHONUNBUFFERED="1",
    )
    return env


def manage(env: dict[str, str], *args: str) -> str:
    completed = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=EXAMPLE_PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, f"{args}:\n{completed.stdout}\n{completed.stderr}"
    return completed.stdout


@pytest.fixture
def example_site(chromium: str, tmp_path: Path) -> Iterator[str]:
    """The example project with acme at its limit, served on a free port; its base URL."""
    env = project_env(tmp_path)
    manage(env, "migrate", "--verbosity", "0")
    output = manage(env, "shell", "--command", SETUP)
    assert "refused: workflow 'chat.turn' refused: concurrency key 'tenant:acme'" in output

    port = free_port()
    log = (tmp_path / "runserver.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=EXAMPLE_PROJECT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(server, f"{base}/admin/login/", tmp_path / "runserver.log")
        yield base
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        log.close()


def wait_until_serving(server: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"runserver exited with {server.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    pytest.fail(f"runserver did not answer {url} within 60 s:\n{log.read_text()}")


def test_the_quota_page_shows_a_tenant_at_its_limit(
    chromium: str, example_site: str, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    from playwright.sync_api import expect, sync_playwright

    screenshot = tmp_path / "quota-page.png"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.set_default_timeout(30_000)

            page.goto(f"{example_site}/admin/login/?next=/admin/")
            page.fill("#id_username", USERNAME)
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(f"{example_site}/admin/")
            # The example admin: tenants and plans, and the runs.
            for model in ("Tenants", "Plans", "Runs"):
                expect(page.get_by_role("link", name=model, exact=True)).to_be_visible()

            # From the run changelist, the quota page is one click away.
            page.get_by_role("link", name="Runs", exact=True).click()
            page.get_by_role("link", name="Quotas").click()
            page.wait_for_url(f"{example_site}/admin/durable_django/run/quotas/")
            expect(page.locator("h1")).to_have_text("Quotas")

            acme = page.locator('.durable-bar[data-key="tenant:acme"]')
            expect(acme).to_have_class("durable-bar full")
            expect(acme).to_have_attribute("data-percent", "100")
            expect(page.locator('tr[data-key="tenant:acme"] .durable-count')).to_have_text(
                "8 / 8 full"
            )
            globex = page.locator('.durable-bar[data-key="tenant:globex"]')
            expect(globex).to_have_class("durable-bar")
            expect(page.locator('tr[data-key="tenant:globex"] .durable-count')).to_have_text(
                "1 / 2"
            )

            # Drawn full: the fill spans the whole bar, and it is red; globex's is half.
            acme_fill = acme.locator(".durable-bar-fill")
            bar_width = acme.evaluate("bar => bar.clientWidth")
            assert bar_width > 50
            assert acme_fill.evaluate("fill => fill.offsetWidth") == bar_width
            assert acme_fill.evaluate("fill => getComputedStyle(fill).backgroundColor") == (
                "rgb(186, 33, 33)"
            )
            globex_fill = globex.locator(".durable-bar-fill").evaluate("f => f.offsetWidth")
            assert abs(globex_fill - globex.evaluate("b => b.clientWidth") / 2) <= 1

            page.screenshot(path=str(screenshot), full_page=True)

            # The bar's link lists the 8 runs holding acme's slots.
            page.locator('tr[data-key="tenant:acme"] a').click()
            expect(page.locator("#result_list tbody tr")).to_have_count(8)

            # The tenant list links each tenant to its quota.
            page.goto(f"{example_site}/admin/tenants/tenant/")
            page.get_by_role("link", name="tenant:acme").click()
            expect(page.locator("tr.durable-quota")).to_have_count(1)
            expect(page.locator('.durable-bar[data-key="tenant:acme"]')).to_have_class(
                "durable-bar full"
            )
        finally:
            browser.close()

    assert screenshot.stat().st_size > 10_000
    kept = Path(os.environ.get("DURABLE_SCREENSHOT_DIR", tmp_path))
    if kept != tmp_path:
        kept.mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, kept / screenshot.name)
    record_property("screenshot", str(kept / screenshot.name))
    print(f"screenshot of the quota page: {kept / screenshot.name}")
