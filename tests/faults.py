"""Database faults for the tests, on servers and proxies of the tests' own.

- :class:`TcpProxy`: a TCP proxy in front of a database server; :meth:`TcpProxy.cut`
  drops every connection through it and refuses new ones until :meth:`TcpProxy.restore`,
  which is what a client sees while its database restarts or is out of reach. Put it in
  front of the suite's shared server and give its port to the processes under test.
- :class:`PostgresServer`: a PostgreSQL cluster in a temporary directory, on a free
  port, that a test stops, starts and restarts for real (``initdb`` and ``pg_ctl``
  from ``DURABLE_PG_BIN``, by default ``/usr/lib/postgresql/15/bin``).
  :func:`django_database` makes a database on it a Django database alias of the test
  process, migrated; :meth:`PostgresServer.environment` points a subprocess at it.
- :class:`MariaDbServer`: the same of MariaDB (``mariadbd`` from ``DURABLE_MARIADB_BIN``,
  by default ``/usr/sbin/mariadbd``), killed and started again.

Nothing here touches the shared servers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import pytest
from django.core.management import call_command
from django.db import DEFAULT_DB_ALIAS, connection, connections

ROOT = Path(__file__).resolve().parent.parent
PG_BIN = Path(os.environ.get("DURABLE_PG_BIN", "/usr/lib/postgresql/15/bin"))
#: How long a server may take to start or stop before the test fails.
SERVER_WAIT = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a reset, as a host refusing the connection would."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _close(sock: socket.socket) -> None:
    """Close ``sock`` now, waking a thread blocked reading it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


# a proxy --------------------------------------------------------------------------------


class TcpProxy:
    """A TCP proxy on 127.0.0.1 (a free port, :attr:`port`) in front of ``host:port``.

    Each connection is piped to a connection of its own to the target, by two threads.
    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        #: Connections accepted and piped so far.
        self.accepted = 0
        threading.Thread(target=self._accept, name="proxy accept", daemon=True).start()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def cut(self) -> None:
        """Drop every connection through the proxy and refuse new ones."""
        with self._lock:
            self._cut = True
        self.drop()

    def drop(self) -> None:
        """Drop every connection through the proxy and go on accepting new ones: a server
        that restarted at once, or a failover, as its clients see it."""
        with self._lock:
            sockets, self._open = self._open, set()
        for sock in sockets:
            _close(sock)

    def restore(self) -> None:
        """Accept and pipe connections again."""
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                if self._cut:
                    raise ConnectionRefusedError
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                if self._cut:
                    _reset(client)
                    upstream.close()
                    continue
                self._open |= {client, upstream}
                self.accepted += 1
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pipe, args=(source, sink), name="proxy pipe", daemon=True
                ).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        with self._lock:
            self._open -= {source, sink}
        _close(source)
        _close(sink)


# a PostgreSQL server of our own ---------------------------------------------------------


def _as_postgres_user() -> dict[str, object]:
    """``subprocess`` options running PostgreSQL's programs as ``postgres`` when the tests
    run as root (the server refuses to run as root)."""
    if os.geteuid() != 0:
        return {}
    return {"user": "postgres", "group": "postgres", "extra_groups": []}


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Have the kernel stop the server at once (SIGQUIT) when the pytest process dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGQUIT)


class _Server:
    """A database server of the test's own, in a temporary directory, on a free port, run
    as a child of the test process (it dies with it). A subclass gives its
    :meth:`command` and tells when it is :meth:`ready`."""

    #: The server's name, for errors.
    name = "the server"

    def __init__(self, prefix: str, program: Path, setting: str) -> None:
        if not program.exists():
            # Skipped where it is missing, except on CI (``CI`` set), where it fails.
            message = f"no {program} (set {setting})"
            if os.environ.get("CI"):
                raise RuntimeError(message)
            pytest.skip(message)
        self.directory = Path(tempfile.mkdtemp(prefix=prefix))
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        self.host = "127.0.0.1"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def command(self) -> list[str | Path]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Start the server, if it is not running, and return once it accepts connections."""
        if self.process is not None:
            return
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
                **self.options(),  # type: ignore[arg-type]
            )
        deadline = time.monotonic() + SERVER_WAIT
        while not self.ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start:\n{self.log.read_text()}")
            time.sleep(0.05)

    def options(self) -> dict[str, object]:
        """More ``subprocess`` options for the server's processes."""
        return {}


class PostgresServer(_Server):
    """A PostgreSQL cluster of the test's own, in a temporary directory, on a free port.

    :meth:`start` runs the server as a child of the test process (it dies with it),
    :meth:`stop` stops it (by default at once, as a crash or ``pg_ctl stop -m
    immediate`` would: the next start recovers from the WAL), :meth:`restart` does both.
    Durability is off (``fsync=off``): the tests need speed, not crash safety of the host.
    """

    name = "PostgreSQL"

    def __init__(self) -> None:
        super().__init__("durable-pg-", PG_BIN / "initdb", "DURABLE_PG_BIN")
        options = _as_postgres_user()
        if options:
            shutil.chown(self.directory, "postgres", "postgres")
        subprocess.run(
            [
                PG_BIN / "initdb",
                "-D",
                self.data,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-N",
                "-E",
                "UTF8",
                "--locale=C",
            ],
            check=True,
            capture_output=True,
            **options,  # type: ignore[arg-type]
        )

    def options(self) -> dict[str, object]:
        return _as_postgres_user()

    def command(self) -> list[str | Path]:
        return [
            PG_BIN / "postgres",
            "-D",
            self.data,
            "-p",
            str(self.port),
            "-k",
            self.directory,
            "-c",
            f"listen_addresses={self.host}",
            "-c",
            "fsync=off",
            "-c",
            "full_page_writes=off",
        ]

    def ready(self) -> bool:
        """Whether the server accepts connections."""
        result = subprocess.run(
            [PG_BIN / "pg_isready", "-h", self.host, "-p", str(self.port), "-t", "1"],
            capture_output=True,
        )
        return result.returncode == 0

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (``pg_ctl stop -m mode``) and return once it is gone."""
        process, self.process = self.process, None
        if process is None:
            return
        subprocess.run(
            [PG_BIN / "pg_ctl", "stop", "-D", self.data, "-m", mode, "-w", "-t", "60"],
            capture_output=True,
            **_as_postgres_user(),  # type: ignore[arg-type]
        )
        try:
            process.wait(timeout=SERVER_WAIT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self, mode: str = "immediate") -> None:
        """Stop the server and start it again."""
        self.stop(mode)
        self.start()

    def create_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(
            host=self.host, port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')

    def settings(self, name: str) -> dict[str, object]:
        """A Django ``DATABASES`` entry for the database ``name`` on this server."""
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": "postgres",
            "HOST": self.host,
            "PORT": str(self.port),
        }

    def environment(self, name: str) -> dict[str, str]:
        """What a subprocess started with the tests' settings needs to use the database
        ``name`` on this server (``tests/settings.py``)."""
        return {
            "DURABLE_TEST_DB": "postgres",
            "DURABLE_PG_HOST": self.host,
            "DURABLE_PG_PORT": str(self.port),
            "DURABLE_PG_NAME": name,
            "DURABLE_TEST_DB_NAME": name,
        }


# the test process and its subprocesses ----------------------------------------------------


def django_environment(**extra: str) -> dict[str, str]:
    """The environment of a subprocess with the tests' settings, on the test process's
    database (its test database), with ``extra`` on top."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DURABLE_TEST_DB=os.environ.get("DURABLE_TEST_DB", "sqlite"),
        DURABLE_TEST_DB_NAME=str(connection.settings_dict["NAME"]),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def proxied_environment(proxy: TcpProxy) -> dict[str, str]:
    """What a subprocess with the tests' settings needs to reach the test process's
    database through ``proxy`` (to put in its environment)."""
    prefix = "DURABLE_PG" if connection.vendor == "postgresql" else "DURABLE_MYSQL"
    return {f"{prefix}_HOST": "127.0.0.1", f"{prefix}_PORT": str(proxy.port)}


def proxied_settings(proxy: TcpProxy) -> dict[str, object]:
    """The test process's database (its test database), reached through ``proxy``."""
    return {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": str(proxy.port)}


@contextlib.contextmanager
def proxied_test_database(alias: str) -> Iterator[TcpProxy]:
    """A :class:`TcpProxy` of the test's own in front of the test database's server, and
    the test database through it as the Django database ``alias``, for the block."""
    from django.db import connection

    host, port = connection.settings_dict["HOST"], int(connection.settings_dict["PORT"])
    with TcpProxy(host, port) as running, database_alias(alias, proxied_settings(running)):
        yield running


@contextlib.contextmanager
def database_alias(alias: str, settings: dict[str, object]) -> Iterator[str]:
    """``settings`` as the Django database ``alias`` of the test process for the block.

    A test that uses it declares it: ``django_db(databases=["default", alias])``.
    """
    configured = connections.configure_settings(
        {DEFAULT_DB_ALIAS: connections.settings[DEFAULT_DB_ALIAS], alias: settings}
    )
    connections.settings[alias] = configured[alias]
    try:
        yield alias
    finally:
        with contextlib.suppress(Exception):
            connections[alias].close()
        with contextlib.suppress(AttributeError):
            del connections[alias]
        del connections.settings[alias]


@contextlib.contextmanager
def django_database(alias: str, server: PostgresServer | MariaDbServer, name: str) -> Iterator[str]:
    """The database ``name`` on ``server``, created and migrated, as the Django database
    ``alias`` of the test process for the block (see :func:`database_alias`).

    Call it where database access is allowed (``django_db_blocker.unblock()``).
    """
    server.create_database(name)
    with database_alias(alias, server.settings(name)):
        call_command("migrate", database=alias, verbosity=0)
        yield alias


# a MariaDB server of our own ------------------------------------------------------------

MARIADB_BIN = Path(os.environ.get("DURABLE_MARIADB_BIN", "/usr/sbin/mariadbd"))
MARIADB_INSTALL = Path(os.environ.get("DURABLE_MARIADB_INSTALL", "/usr/bin/mariadb-install-db"))


class MariaDbServer(_Server):
    """A MariaDB server of the test's own, in a temporary directory, on a free port, as
    :class:`PostgresServer` is one of PostgreSQL (the same methods): ``root`` without a
    password (``--skip-grant-tables``), its commits kept through a kill of the server
    (not of the host), and :meth:`stop` a ``SIGKILL``, as a crash (the next start
    recovers from InnoDB's log)."""

    name = "MariaDB"

    def __init__(self) -> None:
        super().__init__("durable-mariadb-", MARIADB_BIN, "DURABLE_MARIADB_BIN")
        subprocess.run(
            [
                MARIADB_INSTALL,
                "--no-defaults",
                f"--datadir={self.data}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            capture_output=True,
        )

    def command(self) -> list[str | Path]:
        return [
            MARIADB_BIN,
            "--no-defaults",
            f"--datadir={self.data}",
            f"--socket={self.directory / 'server.sock'}",
            f"--pid-file={self.directory / 'server.pid'}",
            f"--port={self.port}",
            f"--bind-address={self.host}",
            "--user=root",
            "--skip-grant-tables",
            "--skip-name-resolve",
            "--innodb-flush-log-at-trx-commit=2",  # a commit survives a kill
            "--innodb-buffer-pool-size=32M",
            "--character-set-server=utf8mb4",
        ]

    def _connect(self, **options: object) -> object:
        import pymysql

        return pymysql.connect(host=self.host, port=self.port, user="root", **options)

    def ready(self) -> bool:
        """Whether the server accepts connections."""
        try:
            self._connect(connect_timeout=1).close()  # type: ignore[attr-defined]
        except Exception:
            return False
        return True

    def stop(self) -> None:
        """Kill the server and return once it is gone."""
        process, self.process = self.process, None
        if process is None:
            return
        process.kill()
        process.wait(timeout=SERVER_WAIT)

    def restart(self) -> None:
        """Kill the server and start it again."""
        self.stop()
        self.start()

    def create_database(self, name: str) -> None:
        connection = self._connect(autocommit=True)
        try:
            with connection.cursor() as cursor:  # type: ignore[attr-defined]
                cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        finally:
            connection.close()  # type: ignore[attr-defined]

    def settings(self, name: str) -> dict[str, object]:
        """A Django ``DATABASES`` entry for the database ``name`` on this server."""
        return {
            "ENGINE": "django.db.backends.mysql",
            "NAME": name,
            "USER": "root",
            "HOST": self.host,
            "PORT": str(self.port),
            "OPTIONS": {"charset": "utf8mb4"},
        }
