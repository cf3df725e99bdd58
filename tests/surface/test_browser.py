"""The admin in a real browser: the example project served by ``runserver``, one tenant
at its quota, a completed and a failed chat turn; the run list, both runs' pages and the
quota page in headless Chromium at 1,280 x 800, none wider than the window.

Chromium comes from the system (Debian's ``chromium`` package) and Playwright drives it.
Without Chromium the tests are skipped, except under CI (``CI`` set), where they fail.
The project's database and broker folder are temporary; no worker runs, so the started
chat turns stay pending and hold their slots (the completed and failed turns were
executed in-process, by ``run_until_idle``).

``DURABLE_SCREENSHOT_DIR=docs/img`` keeps the screenshots, as the docs show them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

EXAMPLE_PROJECT = Path(__file__).resolve().parents[2] / "example_project"
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
WINDOW = {"width": 1280, "height": 800}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("DURABLE_TEST_DB", "sqlite") != "sqlite",
        reason="the example project runs on its own SQLite file; once is enough",
    ),
]

# Plans and tenants as in the demo: acme's 8 slots all taken, globex 1 of 2, and a ninth
# acme turn refused. Then two turns executed in this process: one of globex's completed,
# and one of initech's failed in its "store" step (the tenant was deleted meanwhile).
SETUP = f"""
from django.contrib.auth import get_user_model
from durable_django import ConcurrencyLimitError, engine
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

completed = ChatTurnWorkflow.dispatch({{"tenant": "globex", "message": "what is the weather"}})
engine.execute(completed.run_id)
initech = Tenant.objects.create(slug="initech", name="Initech", plan=starter)
failed = ChatTurnWorkflow.dispatch({{"tenant": "initech", "message": "hello"}})
initech.delete()
engine.execute(failed.run_id)

# Two schedules: acme's weekly digest, its last window skipped over its quota.
from durable_django.models import Schedule
digest = Schedule.objects.put(
    "acme-weekly-digest", workflow="chat.turn", cron="0 9 * * 1", timezone="Europe/Paris",
    input={{"tenant": "acme", "message": "digest"}}, concurrency_key="digest:acme",
    concurrency_limit=1,
)
Schedule.objects.put("globex-ping", workflow="chat.turn", interval_seconds=60,
                     input={{"tenant": "globex", "message": "ping"}})
Schedule.objects.filter(pk=digest.pk).update(
    last_fired_at=engine.get_run(completed.run_id).created_at, last_run_id=completed.run_id,
    last_error="window 2026-11-30T02:49:00+00:00 skipped: concurrency key 'tenant:acme' has "
    "8 active run(s), limit is 8",
)
print("completed:", completed.run_id, engine.get_run(completed.run_id).status)
print("failed:", failed.run_id, engine.get_run(failed.run_id).status)
"""

# Whether the page, its content area, or any box inside it is wider than it shows; the
# blocks that scroll by design (JSON, tracebacks) and the headings only screen readers
# read (Django 6's visually-hidden ones) are left out.
OVERFLOW = """() => {
  const wide = (el) => el.scrollWidth > el.clientWidth + 1;
  const content = document.querySelector("#content");
  const inner = [...content.querySelectorAll("*")].filter(
    (el) =>
      el.clientWidth > 0 && !el.closest("pre, .durable-traceback, .visually-hidden") && wide(el)
  );
  return {
    page: wide(document.documentElement),
    body: wide(document.body),
    content: wide(content),
    inner: inner.map((el) => `${el.tagName}.${el.className} ${el.scrollWidth}/${el.clientWidth}`),
  };
}"""


@dataclass(frozen=True)
class Site:
    """The served example project: its base URL and the runs the setup left."""

    base: str
    completed: str
    failed: str

    def run_url(self, run_id: str) -> str:
        return f"{self.base}/admin/durable_django/run/{run_id}/change/"


@pytest.fixture(scope="module")
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
        CHAT_REPLY_SECONDS="0",
        DEBUG="true",  # runserver serves the admin's static files
        PYTHONUNBUFFERED="1",
        # The package of this checkout, not whichever one the virtualenv installed.
        PYTHONPATH=str(EXAMPLE_PROJECT.parent),
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


@pytest.fixture(scope="module")
def example_site(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """The example project after :data:`SETUP`, served on a free port."""
    tmp_path = tmp_path_factory.mktemp("example_site")
    env = project_env(tmp_path)
    manage(env, "migrate", "--verbosity", "0")
    output = manage(env, "shell", "--command", SETUP)
    assert "refused: workflow 'chat.turn' refused: concurrency key 'tenant:acme'" in output
    runs = dict(re.findall(r"^(completed|failed): (\w+) \1$", output, re.M))

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
        yield Site(base, runs["completed"], runs["failed"])
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


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Any, example_site: Site) -> Iterator[Any]:
    """A new 1,280 x 800 window, logged in to the admin."""
    context = browser.new_context(viewport=WINDOW)
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{example_site.base}/admin/login/?next=/admin/")
    page.fill("#id_username", USERNAME)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{example_site.base}/admin/")
    try:
        yield page
    finally:
        context.close()


def assert_fits_the_window(page: Any) -> None:
    assert page.evaluate("() => [window.innerWidth, window.innerHeight]") == [1280, 800]
    overflow = page.evaluate(OVERFLOW)
    assert overflow == {"page": False, "body": False, "content": False, "inner": []}


def assert_on_one_line(locator: Any) -> None:
    """Every element found is laid out on a single line."""
    assert locator.count() > 0
    lines = locator.evaluate_all(
        "els => els.map(el => new Set([...el.getClientRects()].map(r => Math.round(r.top))).size)"
    )
    assert set(lines) == {1}


def scroll_to_top(page: Any, selector: str) -> None:
    """Scroll the window so the element found is near its top."""
    page.locator(selector).evaluate("el => el.scrollIntoView({block: 'start'})")
    page.evaluate("window.scrollBy(0, -16)")


def keep_screenshot(page: Any, name: str, tmp_path: Path, **options: Any) -> Path:
    """A screenshot of the window, kept in ``DURABLE_SCREENSHOT_DIR`` when set."""
    screenshot = tmp_path / name
    page.screenshot(path=str(screenshot), **options)
    assert screenshot.stat().st_size > 10_000
    kept = Path(os.environ.get("DURABLE_SCREENSHOT_DIR", tmp_path))
    if kept != tmp_path:
        kept.mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, kept / name)
    print(f"screenshot: {kept / name}")
    return kept / name


def test_the_run_list_fits_the_window(page: Any, example_site: Site, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    page.goto(f"{example_site.base}/admin/")
    page.get_by_role("link", name="Runs", exact=True).click()
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(11)
    assert_fits_the_window(page)

    # A short id, whole on hover, linking to the run's page.
    failed = page.locator(f'.durable-run-id[title="{example_site.failed}"]')
    expect(failed).to_have_text(example_site.failed[:8] + "…")
    # Times to the second, the date and the time each whole (on one line, or two in a
    # narrow column); a duration for each run.
    assert_on_one_line(page.locator("td.field-created_display time span"))
    created = page.locator("td.field-created_display time").first.inner_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d\s\d\d:\d\d:\d\d", created)
    completed_row = rows.filter(has=page.locator(f'[title="{example_site.completed}"]'))
    expect(completed_row.locator("td.field-duration_display")).to_have_text(
        re.compile(r"^(\d+ ms|\d\.\d s)$")
    )
    expect(rows.last.locator("td.field-duration_display")).to_have_text(
        re.compile(r"waiting for \d")
    )
    keep_screenshot(page, "run-list.png", tmp_path)

    failed.click()
    page.wait_for_url(example_site.run_url(example_site.failed))


def test_a_failed_runs_page_fits_with_its_traceback_folded(
    page: Any, example_site: Site, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    page.goto(example_site.run_url(example_site.failed))
    assert_fits_the_window(page)
    # Retry, not Cancel: the run failed.
    expect(page.locator(".object-tools button")).to_have_text(["Retry run"])

    error = page.locator(".field-error_display")
    expect(error.locator("strong")).to_have_text("tenants.models.Tenant.DoesNotExist")
    traceback = error.locator(".durable-traceback")
    style = traceback.evaluate(
        "el => [getComputedStyle(el).overflow, getComputedStyle(el).maxHeight]"
    )
    assert style[0] == "auto" and style[1] != "none"
    # durable_django's own frames folded; the first frame shown is the project's own.
    folded = traceback.locator("details.durable-library-frames")
    expect(folded).to_have_count(1)
    expect(folded.locator("summary")).to_have_text("2 frames of durable_django hidden")
    expect(folded.locator("pre")).to_be_hidden()
    first_shown = traceback.locator(":scope > pre").nth(1).inner_text()
    assert (
        first_shown.startswith('  File "') and "tenants/workflows.py" in first_shown.split("\n")[0]
    )
    scroll_to_top(page, ".field-error_display")
    keep_screenshot(page, "failed-run.png", tmp_path)

    folded.locator("summary").click()
    expect(folded.locator("pre")).to_be_visible()
    expect(folded.locator("pre")).to_contain_text("durable_django/_runtime/execution/")
    assert_fits_the_window(page)

    # The failed step: its error, its traceback folded; times on one line.
    store = page.locator(".durable-steps tr.has_original").nth(1)
    expect(store.locator("td.field-name_display")).to_have_text("store")
    expect(store.locator("details.durable-error-details > summary")).to_have_text("traceback")
    assert_on_one_line(page.locator(".durable-steps td.field-recorded_display time"))

    # Retry goes through the quota: initech's limit function (its plan) now fails, so the
    # retry is refused, and the page says why.
    page.get_by_role("button", name="Retry run").click()
    page.wait_for_url(example_site.run_url(example_site.failed))
    expect(page.locator(".messagelist .warning")).to_contain_text(
        "the concurrency limit function raised DoesNotExist for key 'tenant:initech'"
    )
    expect(page.locator(".field-status_display")).to_contain_text("Failed")


def test_a_completed_runs_page_fits_the_window(
    page: Any, example_site: Site, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    page.goto(example_site.run_url(example_site.completed))
    assert_fits_the_window(page)
    expect(page.locator(".object-tools button")).to_have_count(0)
    expect(page.locator(".field-output_display pre")).to_contain_text('"reply": "You said')
    expect(page.locator(".durable-steps tr.has_original")).to_have_count(2)
    assert_on_one_line(page.locator(".field-finished_display time"))
    expect(page.locator(".field-duration_display .readonly")).to_have_text(
        re.compile(r"^(\d+ ms|\d\.\d s)$")
    )
    scroll_to_top(page, ".field-created_display")
    keep_screenshot(page, "completed-run.png", tmp_path)


def test_cancelling_a_run_from_its_page_asks_to_confirm(
    page: Any, example_site: Site, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    page.goto(f"{example_site.base}/admin/durable_django/run/?status__exact=pending")
    page.locator("#result_list tbody tr a").first.click()
    cancel = page.locator(".object-tools a.durable-cancel")
    expect(cancel).to_have_text(re.compile("cancel run", re.I))
    colour = cancel.evaluate("el => getComputedStyle(el).backgroundColor")
    assert colour == "rgb(186, 33, 33)"  # red, as Delete
    run_page = page.url
    cancel.click()
    expect(page.locator("#content p").first).to_have_text(
        re.compile(r"^Are you sure you want to cancel 1 active run\?")
    )
    assert_fits_the_window(page)
    keep_screenshot(page, "cancel-confirmation.png", tmp_path)
    # Taken back: nothing cancelled (the quota page's test counts these runs).
    page.get_by_role("link", name="No, take me back").click()
    page.wait_for_url(run_page)
    expect(page.locator(".field-status_display")).to_contain_text("Pending")


def test_the_schedule_list_fits_the_window(page: Any, example_site: Site, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    page.goto(f"{example_site.base}/admin/durable_django/schedule/")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(2)
    assert_fits_the_window(page)
    # Times to the second, each date and time whole; the last firing links to its run.
    assert_on_one_line(page.locator("td.field-next_due_display time span"))
    due = page.locator("td.field-next_due_display time").first.inner_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d\s\d\d:\d\d:\d\d", due)
    fired = page.locator(f'td.field-last_fired_link a[title="{example_site.completed}"]')
    expect(fired).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d\s\d\d:\d\d:\d\d$"))
    expect(page.locator(".durable-schedule-error")).to_have_text(
        re.compile(r"skipped: concurrency key 'tenant:acme' has 8 active run\(s\), limit is 8$")
    )
    keep_screenshot(page, "schedule-list.png", tmp_path)
    fired.click()
    page.wait_for_url(example_site.run_url(example_site.completed))


def test_the_quota_page_shows_a_tenant_at_its_limit(
    page: Any, example_site: Site, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    base = example_site.base
    page.goto(f"{base}/admin/")
    # The example admin: tenants and plans, and the runs.
    for model in ("Tenants", "Plans", "Runs"):
        expect(page.get_by_role("link", name=model, exact=True)).to_be_visible()

    # From the run changelist, the quota page is one click away.
    page.get_by_role("link", name="Runs", exact=True).click()
    page.get_by_role("link", name="Quotas").click()
    page.wait_for_url(f"{base}/admin/durable_django/run/quotas/")
    expect(page.locator("h1")).to_have_text("Quotas")
    assert_fits_the_window(page)

    acme = page.locator('.durable-bar[data-key="tenant:acme"]')
    expect(acme).to_have_class("durable-bar full")
    expect(acme).to_have_attribute("data-percent", "100")
    expect(page.locator('tr[data-key="tenant:acme"] .durable-count')).to_have_text("8 / 8 full")
    # The limit is the tenant's plan's, from the workflow's limit function.
    expect(page.locator('tr[data-key="tenant:acme"] .durable-limit-note')).to_have_text(
        "computed per key"
    )
    globex = page.locator('.durable-bar[data-key="tenant:globex"]')
    expect(globex).to_have_class("durable-bar")
    expect(page.locator('tr[data-key="tenant:globex"] .durable-count')).to_have_text("1 / 2")

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

    keep_screenshot(page, "quota-page.png", tmp_path, full_page=True)

    # The bar's link lists the 8 runs holding acme's slots.
    page.locator('tr[data-key="tenant:acme"] a').click()
    expect(page.locator("#result_list tbody tr")).to_have_count(8)

    # An idle key, asked for by name: its limit, from the workflow of its latest run; for
    # initech, whose plan is gone, the limit function's failure.
    page.goto(f"{base}/admin/durable_django/run/quotas/?key=tenant:initech")
    expect(page.locator("tr.durable-quota")).to_have_count(1)
    expect(page.locator(".durable-limit-error")).to_contain_text(
        "limit function failed: Plan.DoesNotExist"
    )

    # The tenant list links each tenant to its quota.
    page.goto(f"{base}/admin/tenants/tenant/")
    page.get_by_role("link", name="tenant:acme").click()
    expect(page.locator("tr.durable-quota")).to_have_count(1)
    expect(page.locator('.durable-bar[data-key="tenant:acme"]')).to_have_class("durable-bar full")
