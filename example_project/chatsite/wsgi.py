"""WSGI entry point for the example chat site."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

application = get_wsgi_application()
