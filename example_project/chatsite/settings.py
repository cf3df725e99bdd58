"""Settings for the example chat site, read from the environment (django-environ).

- ``DATABASE_URL``: defaults to a SQLite file in ``example_project/var/``; e.g.
  ``postgres://postgres@127.0.0.1:5432/chatsite`` or ``mysql://root@127.0.0.1:3306/chatsite``.
- ``CELERY_BROKER_URL``: defaults to kombu's filesystem transport, whose messages live
  in ``BROKER_FOLDER`` (default ``example_project/var/broker``); e.g.
  ``redis://127.0.0.1:6379/0``.
- ``CHAT_REPLY_SECONDS``: how long generating a reply takes (simulated model latency).
- ``DEBUG``: off unless set (``DEBUG=1`` on a development machine).
- ``SECRET_KEY``: required with ``DEBUG`` off; with ``DEBUG`` on and none set, a key is
  generated once into ``var/dev-secret-key`` (never used with ``DEBUG`` off).
- ``ALLOWED_HOSTS``, ``CONN_MAX_AGE`` (seconds a database connection is kept, default 60).

A ``.env`` file next to ``manage.py`` is read when present.
"""

import contextlib
import os
import secrets
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env")

DEBUG = env.bool("DEBUG", default=False)


def development_secret_key() -> str:
    """A key for DEBUG on a development machine: made once, kept in var/ (not in git)."""
    path = VAR_DIR / "dev-secret-key"
    if not path.exists():
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        draft = VAR_DIR / f"dev-secret-key.{os.getpid()}"
        draft.write_text(secrets.token_urlsafe(50))
        draft.chmod(0o600)
        with contextlib.suppress(FileExistsError):  # another process made it first
            os.link(draft, path)
        draft.unlink()
    return path.read_text().strip()


if env.str("SECRET_KEY", default=""):
    SECRET_KEY = env.str("SECRET_KEY")
elif DEBUG:
    SECRET_KEY = development_secret_key()
else:
    raise ImproperlyConfigured(
        "SECRET_KEY must be set when DEBUG is off (e.g. in the environment or in .env); "
        "set DEBUG=1 on a development machine instead"
    )
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "durable_django",
    "tenants",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "chatsite.urls"
WSGI_APPLICATION = "chatsite.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

# Database ------------------------------------------------------------------------------

DATABASES = {"default": env.db_url("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}")}

for _database in DATABASES.values():
    # Keep connections between requests (and Celery tasks): opening one per request costs
    # more than most requests, and a start on a fresh PostgreSQL connection is ten times
    # slower than on a warm one. The health check replaces a connection the server closed.
    _database["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=60)
    _database["CONN_HEALTH_CHECKS"] = True
    if _database["ENGINE"].endswith("sqlite3"):
        Path(_database["NAME"]).parent.mkdir(parents=True, exist_ok=True)
        # A write-locking transaction, so concurrent starts of one quota key wait for each
        # other (durable_django's system check asks for it); wait rather than fail when
        # the worker holds the lock.
        _database.setdefault("OPTIONS", {}).update(transaction_mode="IMMEDIATE", timeout=30)
    elif _database["ENGINE"].endswith("mysql"):
        try:
            import MySQLdb  # noqa: F401
        except ImportError:  # PyMySQL stands in for mysqlclient
            import pymysql

            pymysql.install_as_MySQLdb()
        _database.setdefault("OPTIONS", {}).setdefault("charset", "utf8mb4")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Celery --------------------------------------------------------------------------------

# The filesystem transport ignores the host; naming one spares kombu's "No hostname was
# supplied" warning in every process.
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://localhost/")
if CELERY_BROKER_URL.startswith("filesystem://"):
    BROKER_FOLDER = Path(env.str("BROKER_FOLDER", default=str(VAR_DIR / "broker")))
    _broker_folders = {
        # Producers write into data_folder_out, workers read data_folder_in: one folder.
        "data_folder_in": BROKER_FOLDER / "queue",
        "data_folder_out": BROKER_FOLDER / "queue",
        "processed_folder": BROKER_FOLDER / "processed",
        "control_folder": BROKER_FOLDER / "control",
    }
    for _folder in _broker_folders.values():
        _folder.mkdir(parents=True, exist_ok=True)
    # kombu's filesystem transport, each message file written whole before it is seen.
    CELERY_BROKER_TRANSPORT = "chatsite.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        **{name: str(folder) for name, folder in _broker_folders.items()},
        "store_processed": False,
        "polling_interval": 0.2,
    }

CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# durable_django ------------------------------------------------------------------------

DURABLE = {"NAMESPACE": "chatsite"}
DURABLE_HTTP_429 = {"MESSAGE": "Too many chat turns in progress, retry shortly", "RETRY_AFTER": 2}

# The example app -----------------------------------------------------------------------

CHAT_REPLY_SECONDS = env.float("CHAT_REPLY_SECONDS", default=1.0)

# Internationalisation, static files ----------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
