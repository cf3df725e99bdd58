from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from .models import Message, Plan, Tenant


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = ["name", "max_active_turns"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "plan", "quota"]
    list_filter = ["plan"]
    list_select_related = ["plan"]
    search_fields = ["slug", "name"]

    @admin.display(description="quota")
    def quota(self, tenant: Tenant) -> str:
        """Links to the tenant's quota on durable_django's quota page and to its runs."""
        quotas = reverse("admin:durable_django_run_quotas")
        runs = reverse("admin:durable_django_run_changelist")
        return format_html(
            '<a href="{}?key={}">{}</a> · <a href="{}?tag=concurrency:{}">runs</a>',
            quotas,
            tenant.quota_key,
            tenant.quota_key,
            runs,
            tenant.quota_key,
        )


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ["created_at", "tenant", "prompt", "reply", "run_id"]
    list_filter = ["tenant"]
    list_select_related = ["tenant"]
    search_fields = ["prompt", "reply", "run_id"]
    readonly_fields = ["created_at"]
