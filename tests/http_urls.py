from django.urls import path

from .test_http import async_refusing_view, refusing_view

urlpatterns = [path("sync", refusing_view), path("async", async_refusing_view)]
