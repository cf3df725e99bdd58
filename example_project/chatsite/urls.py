from django.contrib import admin
from django.urls import path
from tenants import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("tenants/<slug:slug>", views.tenant_detail, name="tenant-detail"),
    path("tenants/<slug:slug>/turns", views.start_turn, name="start-turn"),
    path("runs/<path:run_id>", views.run_detail, name="run-detail"),
]
