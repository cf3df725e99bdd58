"""Settings of ``benchmarks.soak`` and of the workers and tickers it starts.

``DURABLE_SOAK_DB`` picks the database: ``postgres`` (default), ``mariadb`` or ``sqlite``
(the file ``DURABLE_SOAK_SQLITE``). Leases, resends and blocked retries are short, so that
what a killed worker leaves is recovered within the soak.
"""

import os

SECRET_KEY = "soak-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = ["durable_django"]

DB = os.environ.get("DURABLE_SOAK_DB", "postgres")
NAME = os.environ.get("DURABLE_SOAK_NAME", "durable_soak")
if DB == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": NAME,
            "USER": os.environ.get("DURABLE_SOAK_PG_USER", "postgres"),
            "HOST": os.environ.get("DURABLE_SOAK_PG_HOST", "127.0.0.1"),
            "PORT": os.environ.get("DURABLE_SOAK_PG_PORT", "5432"),
            "CONN_MAX_AGE": None,
        }
    }
elif DB == "mariadb":
    import pymysql

    pymysql.install_as_MySQLdb()
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": NAME,
            "USER": os.environ.get("DURABLE_SOAK_MYSQL_USER", "root"),
            "HOST": os.environ.get("DURABLE_SOAK_MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("DURABLE_SOAK_MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4"},
            "CONN_MAX_AGE": None,
        }
    }
elif DB == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("DURABLE_SOAK_SQLITE", "/tmp/durable_soak.sqlite3"),
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 60},
        }
    }
else:
    raise RuntimeError(f"unknown DURABLE_SOAK_DB {DB!r}: use postgres, mariadb or sqlite")

CELERY_BROKER_URL = os.environ.get("DURABLE_SOAK_BROKER", "redis://127.0.0.1:6379/12")
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# Keep each worker's connection across tasks.
CELERY_DB_REUSE_MAX = 1_000_000

DURABLE = {
    "QUEUE": os.environ.get("DURABLE_SOAK_QUEUE", "durable_soak"),
    "ENQUEUE": True,
    "LEASE_SECONDS": 4,
    "PENDING_RESEND_SECONDS": 5,
    "BLOCKED_RETRY_SECONDS": 5,
}
