"""Settings for the test suite. ``DURABLE_TEST_DB`` picks the database:
``sqlite`` (default), ``postgres`` or ``mariadb``."""

import os
import tempfile

import django

DB = os.environ.get("DURABLE_TEST_DB", "sqlite")

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "durable_django",
    "tests.testapp",
]

# What the admin needs: sessions, authentication, messages, templates.
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Fast hashing for the users the admin tests log in with.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

if DB == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("DURABLE_PG_NAME", "durable"),
            "USER": os.environ.get("DURABLE_PG_USER", "postgres"),
            "HOST": os.environ.get("DURABLE_PG_HOST", "127.0.0.1"),
            "PORT": os.environ.get("DURABLE_PG_PORT", "5432"),
            # Behind PgBouncer in transaction pooling (tests/pgbouncer.py).
            "DISABLE_SERVER_SIDE_CURSORS": bool(os.environ.get("DURABLE_PG_TRANSACTION_POOLING")),
        }
    }
elif DB == "mariadb":
    import pymysql

    pymysql.install_as_MySQLdb()
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": os.environ.get("DURABLE_MYSQL_NAME", "durable"),
            "USER": os.environ.get("DURABLE_MYSQL_USER", "root"),
            "HOST": os.environ.get("DURABLE_MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("DURABLE_MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4"},
            # The server's default collation: migration 0001 makes the columns that hold
            # ids and keys compare byte for byte whatever it is.
            "TEST": {"CHARSET": "utf8mb4"},
        }
    }
elif DB == "sqlite":
    # A file, not memory: worker processes started by the tests must see the same database.
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.path.join(tempfile.gettempdir(), "durable_tests.sqlite3"),
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
            "TEST": {
                "NAME": os.path.join(tempfile.gettempdir(), f"durable_tests_{os.getpid()}.sqlite3")
            },
        }
    }
else:
    raise RuntimeError(f"unknown DURABLE_TEST_DB {DB!r}: use sqlite, postgres or mariadb")

# Worker processes started by the tests open the test database of the run that started them.
if os.environ.get("DURABLE_TEST_DB_NAME"):
    DATABASES["default"]["NAME"] = os.environ["DURABLE_TEST_DB_NAME"]

CELERY_BROKER_URL = os.environ.get("DURABLE_TEST_BROKER", "redis://127.0.0.1:6379/15")
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]

# Django's tasks framework (Django >= 6.0) on the durable backend:
# tests/surface/test_django_tasks.py.
# (Before 6.0 the setting would only earn the warning durable_django.W007.)
if django.VERSION[:2] >= (6, 0):
    TASKS = {
        "default": {
            "BACKEND": "durable_django.tasks_backend.DurableTaskBackend",
            "OPTIONS": {
                "concurrency": {
                    "tests.django_task_functions.gated": {
                        "key_function": "tests.django_task_functions.gate_key",
                        "limit": 2,
                    },
                    "tests.django_task_functions.keyed_badly": {
                        "key_function": "tests.django_task_functions.broken_key",
                        "limit": 2,
                    },
                }
            },
        }
    }
    # Worker processes started by the tests may take Django queues of their own, as JSON.
    if os.environ.get("DURABLE_TEST_TASK_QUEUES"):
        import json

        TASKS["default"]["QUEUES"] = json.loads(os.environ["DURABLE_TEST_TASK_QUEUES"])

# Most tests drive runs in-process; the worker tests turn sending on.
DURABLE = {"ENQUEUE": False}

# Worker processes started by the tests may take DURABLE options of their own, as JSON.
if os.environ.get("DURABLE_TEST_DURABLE"):
    import json

    DURABLE = {**DURABLE, **json.loads(os.environ["DURABLE_TEST_DURABLE"])}
