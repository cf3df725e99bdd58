"""``manage.py tenant_key SLUG``: issue a new API key for a tenant and print it once."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...models import Tenant


class Command(BaseCommand):
    help = "Issue a new API key for a tenant (its previous key stops working) and print it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug", help="The tenant's slug, e.g. acme.")

    def handle(self, *args: Any, slug: str, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is None:
            raise CommandError(f"no tenant {slug!r}")
        self.stdout.write(tenant.issue_api_key())
