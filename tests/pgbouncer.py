"""PgBouncer in transaction pooling, in front of the suite's PostgreSQL server.

:func:`running_pgbouncer` starts Debian's ``pgbouncer`` on a free port with a generated
configuration (``pool_mode = transaction``, at most ``pool_size`` server connections)
and stops it when the block ends, or with the pytest process should that die first. It
never touches a system pgbouncer service. :func:`through` sends the test process's
database connections through it; :func:`worker_env` does the same for a worker.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.db import connection, connections

from .worker import WAIT, _die_with_parent

CONFIG = """\
[databases]
* = host={host} port={port} user={user}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = {pool_size}
max_db_connections = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
log_connections = 0
log_disconnections = 0
"""


def find_pgbouncer() -> str | None:
    """The ``pgbouncer`` program, if installed (Debian puts it in /usr/sbin)."""
    found = shutil.which("pgbouncer")
    if found is None and os.access("/usr/sbin/pgbouncer", os.X_OK):
        found = "/usr/sbin/pgbouncer"
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def accepts_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


class PgBouncer:
    """A ``pgbouncer`` process in transaction pooling, forwarding every database name to
    the PostgreSQL server of the default database's settings."""

    def __init__(self, program: str, *, pool_size: int) -> None:
        self.program = program
        self.pool_size = pool_size
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.folder = Path(tempfile.mkdtemp(prefix="durable-pgbouncer-"))
        self.folder.chmod(0o755)  # readable by the user pgbouncer runs as
        self.log_path = self.folder / "pgbouncer.log"

    def __repr__(self) -> str:
        return f"<PgBouncer 127.0.0.1:{self.port} pool_size={self.pool_size}>"

    def start(self) -> None:
        """Start on a free port; another one if that port was taken meanwhile."""
        for _ in range(3):
            self.port = free_port()
            if self._start_on_port():
                return
        raise RuntimeError(f"{self!r} did not start:\n{self.log()}")

    def _start_on_port(self) -> bool:
        server = connection.settings_dict
        config = self.folder / "pgbouncer.ini"
        config.write_text(
            CONFIG.format(
                host=server["HOST"] or "127.0.0.1",
                port=server["PORT"] or 5432,
                user=server["USER"],
                listen_port=self.port,
                pool_size=self.pool_size,
            )
        )
        config.chmod(0o644)
        # pgbouncer refuses to run as root: as root, run it as nobody.
        user = pwd.getpwnam("nobody") if os.geteuid() == 0 else None
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [self.program, str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # runs after the change of user
                user=user.pw_uid if user else None,
                group=user.pw_gid if user else None,
                extra_groups=[] if user else None,
            )
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if accepts_connections(self.port):
                return True
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self!r} did not listen within {WAIT}s:\n{self.log()}")

    def stop(self) -> None:
        """Stop at once (SIGTERM), closing its server connections."""
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def show(self, what: str, database: str) -> list[dict[str, Any]]:
        """The rows of the admin console's ``SHOW <what>`` (``STATS``, ``CLIENTS``,
        ``SERVERS``...) about ``database``."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, dbname="pgbouncer", user="pgbouncer", autocommit=True
        ) as admin:
            cursor = admin.execute(f"SHOW {what}")
            names = [column.name for column in cursor.description or ()]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        return [row for row in rows if row["database"] == database]

    def transactions(self, database: str) -> int:
        """How many transactions of ``database``'s clients it has passed on so far."""
        return sum(row["total_xact_count"] for row in self.show("STATS", database))

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


@contextlib.contextmanager
def running_pgbouncer(program: str, *, pool_size: int) -> Iterator[PgBouncer]:
    """A listening pgbouncer for the block; stopped, and its files removed, after it."""
    bouncer = PgBouncer(program, pool_size=pool_size)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(bouncer.folder, ignore_errors=True)


#: What a database's settings need behind transaction pooling: a server-side cursor stays
#: on the server connection it was opened on, which the next transaction may not get.
#: (Django leaves psycopg's prepared statements off: ``OPTIONS["prepare_threshold"]``.)
POOLED_SETTINGS = {"DISABLE_SERVER_SIDE_CURSORS": True}


@contextlib.contextmanager
def through(bouncer: PgBouncer) -> Iterator[None]:
    """Send the default database's new connections, in every thread of this process,
    through ``bouncer`` for the block."""
    settings_dict = connections.settings["default"]
    keys = ("HOST", "PORT", *POOLED_SETTINGS)
    saved = {key: settings_dict.get(key) for key in keys}
    connection.close()
    settings_dict.update(HOST="127.0.0.1", PORT=str(bouncer.port), **POOLED_SETTINGS)
    try:
        connection.ensure_connection()
        assert connection.connection.info.port == bouncer.port
        yield
    finally:
        connection.close()
        settings_dict.update(saved)


def worker_env(bouncer: PgBouncer) -> dict[str, str]:
    """Environment for a worker (``tests.settings``) whose database goes through
    ``bouncer``."""
    return {
        "DURABLE_PG_HOST": "127.0.0.1",
        "DURABLE_PG_PORT": str(bouncer.port),
        "DURABLE_PG_TRANSACTION_POOLING": "1",
    }
