"""Django settings of ``benchmarks.portable_start``: one alias per database, each a
database of its own (PostgreSQL and MariaDB made anew, SQLite a new file)."""

import os
import tempfile

import pymysql

pymysql.install_as_MySQLdb()

SECRET_KEY = "benchmarks-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = ["durable_django"]

NAME = os.environ.get("DURABLE_BENCH_DB", "durable_portable_bench")

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": NAME,
        "USER": os.environ.get("DURABLE_BENCH_USER", "postgres"),
        "HOST": os.environ.get("DURABLE_BENCH_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DURABLE_BENCH_PORT", "5432"),
    },
    "mariadb": {
        "ENGINE": "django.db.backends.mysql",
        "NAME": NAME,
        "USER": os.environ.get("DURABLE_BENCH_MYSQL_USER", "root"),
        "HOST": os.environ.get("DURABLE_BENCH_MYSQL_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DURABLE_BENCH_MYSQL_PORT", "3306"),
        "OPTIONS": {"charset": "utf8mb4"},
    },
    "sqlite": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(tempfile.gettempdir(), f"{NAME}.sqlite3"),
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
    },
}

DURABLE = {"QUEUE": "durable_bench", "ENQUEUE": False}
