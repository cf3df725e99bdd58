from django.contrib import admin

from .models import Message, Plan, Tenant


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = ["name", "max_active_turns"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "plan"]
    list_filter = ["plan"]
    search_fields = ["slug", "name"]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ["created_at", "tenant", "prompt", "reply", "run_id"]
    list_filter = ["tenant"]
    search_fields = ["prompt", "reply", "run_id"]
    readonly_fields = ["created_at"]
