"""The site's Celery app: configured from the Django settings (``CELERY_*``).

Run a worker from ``example_project/``::

    celery -A chatsite worker --loglevel=info
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

app = Celery("chatsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
