"""The site's settings for its test suite (``manage.py test --settings
chatsite.test_settings``): the same site, with runs executed in the test process.

``ENQUEUE`` off: starts create runs through the real quota path but send nothing to
Celery; the tests execute them with ``durable_django.testing.run_until_idle``.
"""

import os

# A fixed key for tests only: this settings module never serves requests.
os.environ.setdefault("SECRET_KEY", "chatsite-tests-only")

from .settings import *  # noqa: F403
from .settings import DURABLE

DURABLE = {**DURABLE, "ENQUEUE": False}
CHAT_REPLY_SECONDS = 0.0
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
