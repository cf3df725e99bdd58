"""``manage.py demo``: the concurrency quota at work, end to end.

Migrates, sets up two tenants (acme on a plan allowing 8 active chat turns, globex on one
allowing 2), starts a real Celery worker, then sends bursts of chat turns through the real
view (``POST /tenants/<slug>/turns``) and prints what each request got back: 202 with a run
id, or 429 with the refusal. Then it waits for the accepted turns to finish, prints their
replies, and shows that acme can start a turn again once its slots are free.

Exits non-zero when anything differs from what the quota promises.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.test import Client
from django.urls import reverse

from durable_django import DEFAULT_CONCURRENCY_STATUSES, engine

from ... import views
from ...models import Plan, Tenant
from ...workflows import ChatTurnWorkflow

PLANS = {"starter": 2, "pro": 8}
TENANTS = {"acme": ("Acme Corporation", "pro"), "globex": ("Globex Inc.", "starter")}
ACME_BURST = 12
GLOBEX_BURST = 3
WAIT_SECONDS = 60.0
WORKER_NAME = "demo"


@dataclass
class Answer:
    """One request of the demo and what the view answered."""

    number: int
    tenant: str
    status: int
    millis: float
    body: dict[str, Any]
    retry_after: str | None

    @property
    def accepted(self) -> bool:
        return self.status == 202

    @property
    def detail(self) -> str:
        if self.accepted:
            return f"run {self.body['run_id']} ({self.body['status']})"
        if self.status == 429:
            body = self.body
            return (
                f"refused: {body['message']} [{body['key']} {body['active']}/{body['limit']}, "
                f"Retry-After: {self.retry_after}]"
            )
        return f"unexpected: {self.body}"


class Command(BaseCommand):
    help = (
        "Start a Celery worker, send bursts of chat turns through the API and show the "
        "per-tenant concurrency quota accepting and refusing them."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--worker-concurrency",
            type=int,
            default=4,
            help="threads of the demo's Celery worker (default 4)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.problems: list[str] = []
        self.client = Client(HTTP_HOST="localhost")
        started = time.monotonic()

        self.section("Setting up")
        call_command("migrate", interactive=False, verbosity=0)
        tenants = self.set_up_tenants()
        # The API's keys, issued afresh for the demo's tenants (`manage.py tenant_key`).
        self.api_keys = {slug: tenant.issue_api_key() for slug, tenant in tenants.items()}
        for tenant in tenants.values():
            self.say(
                f"tenant {tenant.slug:<7} plan {tenant.plan.name:<8} "
                f"at most {tenant.plan.max_active_turns} active chat turns"
            )
        database = settings.DATABASES["default"]
        self.say(f"database: {database['ENGINE'].rsplit('.', 1)[-1]} {database['NAME']}")
        self.say(f"broker:   {settings.CELERY_BROKER_URL}")

        with self.worker(options["worker_concurrency"]), quiet_429_warnings():
            self.settle_leftovers(tenants)
            self.usage(tenants)

            self.section(f"Burst: {ACME_BURST} chat turns for acme, then {GLOBEX_BURST} for globex")
            acme = [
                self.post_turn("acme", n, f"hello number {n} from acme")
                for n in range(1, ACME_BURST + 1)
            ]
            globex = [
                self.post_turn("globex", n, f"hi {n} from globex")
                for n in range(1, GLOBEX_BURST + 1)
            ]
            self.table(acme + globex)
            self.say("")
            self.tally("acme", acme, tenants["acme"])
            self.tally("globex", globex, tenants["globex"])
            self.say(
                "globex's turns were accepted while acme was full: "
                "each tenant has its own key (tenant:<slug>)."
                if sum(a.accepted for a in globex)
                else "globex got nothing in while acme was full."
            )
            self.usage(tenants)

            self.section("Waiting for the accepted turns to complete")
            accepted = [answer for answer in acme + globex if answer.accepted]
            for answer in accepted:
                self.show_outcome(answer)
            self.usage(tenants)

            self.section("acme again, now that its slots are free")
            again = self.post_turn("acme", len(acme) + 1, "anyone there?")
            self.table([again])
            if again.accepted:
                self.show_outcome(again)
            else:
                self.problem(f"acme's turn after the burst was not accepted: {again.detail}")

        self.section("Result")
        elapsed = time.monotonic() - started
        if self.problems:
            for problem in self.problems:
                self.stderr.write(f"PROBLEM: {problem}")
            raise CommandError(f"the demo found {len(self.problems)} problem(s)")
        self.say(self.style.SUCCESS(f"All as expected ({elapsed:.1f} s)."))
        self.what_you_saw()

    # setting up -----------------------------------------------------------------------

    def set_up_tenants(self) -> dict[str, Tenant]:
        plans = {
            name: Plan.objects.update_or_create(name=name, defaults={"max_active_turns": limit})[0]
            for name, limit in PLANS.items()
        }
        return {
            slug: Tenant.objects.update_or_create(
                slug=slug, defaults={"name": name, "plan": plans[plan]}
            )[0]
            for slug, (name, plan) in TENANTS.items()
        }

    def settle_leftovers(self, tenants: dict[str, Tenant]) -> None:
        """Let turns left active by an earlier session finish, so the counts start at 0."""
        if not any(self.active(tenant) for tenant in tenants.values()):
            return
        self.say("waiting for chat turns left from an earlier session to finish...")
        deadline = time.monotonic() + WAIT_SECONDS
        while any(self.active(tenant) for tenant in tenants.values()):
            if time.monotonic() > deadline:
                raise CommandError(
                    "chat turns from an earlier session are still active; if their worker "
                    "was killed, start over with a fresh database (remove example_project/var/)"
                )
            time.sleep(0.25)

    # the worker -----------------------------------------------------------------------

    @contextlib.contextmanager
    def worker(self, concurrency: int) -> Iterator[None]:
        """A real Celery worker, in a subprocess, for the duration of the block."""
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "chatsite",
            "--quiet",
            "worker",
            "--pool=threads",
            f"--concurrency={concurrency}",
            "--loglevel=warning",
            "--without-gossip",
            "--without-mingle",
            # A fixed name: the filesystem broker keeps a mailbox per worker name that ever
            # ran, so a new name per run would leave one behind each time.
            "--hostname",
            f"{WORKER_NAME}@%h",
        ]
        self.say(f"starting a Celery worker: celery -A chatsite worker {' '.join(command[7:])}")
        process = subprocess.Popen(command, cwd=settings.BASE_DIR, start_new_session=True)
        try:
            self.wait_for_worker(process)
            yield
        finally:
            self.stop_worker(process)

    def wait_for_worker(self, process: subprocess.Popen[bytes]) -> None:
        from chatsite.celery import app

        hostname = f"{WORKER_NAME}@"
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise CommandError(f"the Celery worker exited with code {process.returncode}")
            replies = app.control.ping(timeout=0.5)
            if any(name.startswith(hostname) for reply in replies for name in reply):
                self.say(f"worker ready (pid {process.pid})")
                return
        raise CommandError(f"the Celery worker did not answer a ping in {WAIT_SECONDS:.0f} s")

    def stop_worker(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # warm shutdown: finish the tasks in hand
            try:
                process.wait(timeout=WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                self.problem("the Celery worker did not stop on SIGTERM and was killed")
                return
        if process.returncode != 0:
            self.problem(f"the Celery worker exited with code {process.returncode}")
        else:
            self.say("worker stopped")

    # requests -------------------------------------------------------------------------

    def post_turn(self, slug: str, number: int, message: str) -> Answer:
        began = time.perf_counter()
        response = self.client.post(
            f"/tenants/{slug}/turns",
            {"message": message},
            content_type="application/json",
            headers=self.auth(slug),
        )
        millis = (time.perf_counter() - began) * 1000
        answer = Answer(
            number=number,
            tenant=slug,
            status=response.status_code,
            millis=millis,
            body=_json(response.content),
            retry_after=response.headers.get("Retry-After"),
        )
        if answer.status not in (202, 429):
            self.problem(f"POST /tenants/{slug}/turns answered {answer.status}: {answer.body}")
        return answer

    def show_outcome(self, answer: Answer) -> None:
        run_id = answer.body["run_id"]
        engine.wait_for_run(run_id, timeout=WAIT_SECONDS)
        response = self.client.get(f"/runs/{run_id}", headers=self.auth(answer.tenant))
        run = json.loads(response.content)
        if run["status"] == "completed":
            shown = run["output"]["reply"]
        else:
            shown = run["error"]
            self.problem(f"run {run_id} ended {run['status']}: {run['error']}")
        self.say(f"  {answer.tenant:<7} {run_id}  {run['status']:<9}  {shown}")

    def auth(self, slug: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_keys[slug]}"}

    # output ---------------------------------------------------------------------------

    def section(self, title: str) -> None:
        self.say("")
        self.say(self.style.MIGRATE_HEADING(f"== {title}"))

    def say(self, text: str) -> None:
        self.stdout.write(text)

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def table(self, answers: list[Answer]) -> None:
        self.say(f"  {'#':>2}  {'tenant':<7} {'HTTP':>4} {'ms':>6}  run id / refusal")
        for a in answers:
            status = self.style.SUCCESS("202") if a.accepted else self.style.WARNING(a.status)
            self.say(f"  {a.number:>2}  {a.tenant:<7}  {status} {a.millis:>6.1f}  {a.detail}")

    def tally(self, slug: str, answers: list[Answer], tenant: Tenant) -> None:
        accepted = sum(answer.accepted for answer in answers)
        refused = sum(answer.status == 429 for answer in answers)
        limit = tenant.plan.max_active_turns
        expected = (min(limit, len(answers)), max(len(answers) - limit, 0))
        line = f"{slug}: {accepted} accepted, {refused} refused (plan limit {limit})"
        if (accepted, refused) == expected:
            self.say(self.style.SUCCESS(line))
        else:
            self.say(self.style.ERROR(line))
            self.problem(
                f"{slug}: expected {expected[0]} accepted and {expected[1]} refused, got "
                f"{accepted} and {refused} (did a turn finish before the burst ended? "
                f"CHAT_REPLY_SECONDS={settings.CHAT_REPLY_SECONDS})"
            )

    def usage(self, tenants: dict[str, Tenant]) -> None:
        for tenant in tenants.values():
            response = self.client.get(f"/tenants/{tenant.slug}", headers=self.auth(tenant.slug))
            detail = json.loads(response.content)
            running = engine.count_runs(tag=f"concurrency:{tenant.quota_key}", statuses=["running"])
            self.say(
                f"GET /tenants/{tenant.slug}: {detail['active_turns']} of "
                f"{detail['max_active_turns']} active turns ({running} running on the worker)"
            )

    def what_you_saw(self) -> None:
        """Where to look next: the code behind what the demo showed, the admin, the docs."""
        self.section("What you just saw")
        self.say(f"  the quota:  {where(ChatTurnWorkflow)}  (@workflow(..., concurrency=...))")
        self.say(f"  the view:   {where(views.start_turn)}  (202, or 429 with Retry-After)")
        self.say(
            "  the admin:  python manage.py createsuperuser, DEBUG=1 python manage.py "
            f"runserver, then http://127.0.0.1:8000{reverse('admin:durable_django_run_quotas')}"
        )
        self.say(
            '  next:       example_project/README.md ("Running it by hand"), '
            "then docs/getting-started.md"
        )

    @staticmethod
    def active(tenant: Tenant) -> int:
        return engine.count_runs(
            tag=f"concurrency:{tenant.quota_key}", statuses=DEFAULT_CONCURRENCY_STATUSES
        )


@contextlib.contextmanager
def quiet_429_warnings() -> Iterator[None]:
    """The table shows every 429; spare Django's "Too Many Requests" log line for each."""
    logger = logging.getLogger("django.request")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def where(obj: Any) -> str:
    """``path:line`` of a function's or class's definition (its first decorator), with
    the path relative to example_project/."""
    obj = inspect.unwrap(obj)
    path = Path(inspect.getsourcefile(obj) or "?").resolve()
    with contextlib.suppress(ValueError):
        path = path.relative_to(Path(settings.BASE_DIR).resolve())
    return f"{path}:{inspect.getsourcelines(obj)[1]}"


def _json(content: bytes) -> dict[str, Any]:
    try:
        return json.loads(content)
    except ValueError:
        return {"body": content.decode(errors="replace")[:200]}
