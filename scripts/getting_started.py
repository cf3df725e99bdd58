"""docs/getting-started.md as a program: what a new user does, from the guide's own text.

Builds the wheel (and checks it carries the type marker ``py.typed``), installs it into a
fresh virtualenv with the extras the guide names, runs ``django-admin startproject`` and
``startapp``, writes the files and settings lines the guide marks with
``<!-- getting-started: ... -->`` comments, migrates a PostgreSQL database of its own,
starts ``runserver``, a Celery worker on Redis and beat (the tick), and checks what the
guide promises: of 10 concurrent POSTs, exactly 3 are accepted and 7 answered 429 with
``Retry-After``; the accepted runs complete; a new burst is admitted again; the guide's
curl lines answer what it shows. Exits non-zero on any difference.

Run it with any Python 3.11+: ``python scripts/getting_started.py``. It creates (and
drops first) the database ``$DURABLE_GS_PG_NAME`` (default ``durable_getting_started``)
on 127.0.0.1:5432 as ``postgres``, and uses the Redis database ``$DURABLE_GS_REDIS_URL``
(default ``redis://127.0.0.1:6379/14``). Everything else lives in a temporary folder.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "getting-started.md"
PG_NAME = os.environ.get("DURABLE_GS_PG_NAME", "durable_getting_started")
REDIS_URL = os.environ.get("DURABLE_GS_REDIS_URL", "redis://127.0.0.1:6379/14")
#: What the guide's settings name, replaced by this run's own database and Redis.
GUIDE_PG_NAME = '"NAME": "proj"'
GUIDE_REDIS_URL = "redis://127.0.0.1:6379/0"
BURST = 10
LIMIT = 3
TIMEOUT = 180.0


def marker(page: str) -> re.Pattern[str]:
    """The comment that marks a code block of a page for a program: ``<!-- page: action
    [path] -->`` on the line above the block."""
    return re.compile(rf"<!-- {page}: (?P<action>\w+)(?: (?P<path>\S+))? -->\n```[^\n]*\n")


MARKER = marker("getting-started")


class Failed(Exception):
    """What the guide promised and the site did not do."""


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: dict


def main() -> int:
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="getting-started-") as folder:
        work = Path(folder)
        try:
            run_the_guide(work)
        except Failed as failure:
            print(f"getting started: FAILED: {failure}", file=sys.stderr)
            for log in sorted(work.glob("*.log")):
                print(f"--- {log.name} (last lines)", file=sys.stderr)
                print("\n".join(log.read_text().splitlines()[-40:]), file=sys.stderr)
            return 1
    print(f"getting started: all as the guide says ({time.monotonic() - began:.0f} s)")
    return 0


def run_the_guide(work: Path) -> None:
    guide = GUIDE.read_text()
    snippets = marked_snippets(guide)

    step("building the wheel")
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(work / "dist"), str(ROOT)])
    [wheel] = (work / "dist").glob("*.whl")
    if "durable_django/py.typed" not in zipfile.ZipFile(wheel).namelist():
        raise Failed(f"{wheel.name} has no durable_django/py.typed: checkers would skip its types")

    extras = re.search(r'pip install -e "/path/to/durable_django\[([a-z,]+)\]"', guide)
    if extras is None:
        raise Failed("the guide's install line (pip install -e ...[extras]) is gone")
    step(f"a fresh virtualenv with {wheel.name}[{extras[1]}]")
    venv = work / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    bin_ = venv / "bin"
    run([bin_ / "python", "-m", "pip", "install", "-q", f"{wheel}[{extras[1]}]"])

    step("startproject, startapp, the guide's files and settings")
    site = work / "site"
    site.mkdir()
    run([bin_ / "django-admin", "startproject", "proj", "."], cwd=site)
    run([bin_ / "python", "manage.py", "startapp", "chat"], cwd=site)
    for action, path, text in snippets:
        if action == "append":
            text = replace_once(text, GUIDE_PG_NAME, f'"NAME": "{PG_NAME}"')
            text = replace_once(text, GUIDE_REDIS_URL, REDIS_URL)
            with (site / path).open("a") as file:
                file.write("\n" + text)
        elif action == "write":
            (site / path).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CELERY_"))}
    env.update(PYTHONUNBUFFERED="1", PATH=f"{bin_}{os.pathsep}{env.get('PATH', '')}")

    step(f"database {PG_NAME}, migrate, check")
    run(["dropdb", "-h", "127.0.0.1", "-U", "postgres", "--if-exists", PG_NAME])
    run(["createdb", "-h", "127.0.0.1", "-U", "postgres", PG_NAME])
    clear_default_queue(bin_ / "python")
    manage = [str(bin_ / "python"), "manage.py"]
    run([*manage, "migrate", "-v", "0"], cwd=site, env=env)
    run([*manage, "check", "--fail-level", "WARNING"], cwd=site, env=env)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = [*manage, "runserver", "--noreload", f"127.0.0.1:{port}"]
    with process(server, site, env, work / "runserver.log"):
        wait_for_server(base)

        step(f"{BURST} concurrent POSTs, no worker yet")
        first = burst(base)
        accepted = [a for a in first if a.status == 202]
        refused = [a for a in first if a.status == 429]
        print(f"  {len(accepted)} x 202, {len(refused)} x 429")
        if (len(accepted), len(refused)) != (LIMIT, BURST - LIMIT):
            raise Failed(f"expected {LIMIT} x 202 and {BURST - LIMIT} x 429: {statuses(first)}")
        for answer in refused:
            if not answer.headers.get("Retry-After") or answer.body.get("key") != "company:42":
                raise Failed(f"a 429 without Retry-After or its key: {answer}")

        worker = ["celery", "-A", "proj", "worker", "-l", "info"]
        beat = ["celery", "-A", "proj", "beat", "-l", "info", "-s", str(work / "beat-schedule")]
        with (
            process(worker, site, env, work / "worker.log") as worker_process,
            process(beat, site, env, work / "beat.log") as beat_process,
        ):
            step("a worker and beat: the accepted runs complete")
            for answer in accepted:
                follow(base, answer)

            step(f"{BURST} concurrent POSTs again, with the worker running")
            second = burst(base)
            again = [a for a in second if a.status == 202]
            print(f"  {len(again)} x 202, {sum(a.status == 429 for a in second)} x 429")
            if len(again) < LIMIT or any(a.status not in (202, 429) for a in second):
                raise Failed(f"the second burst was not admitted: {statuses(second)}")
            for answer in again:
                follow(base, answer)

            step("the guide's curl lines")
            run_curl_lines(guide, base)

            wait_for_log(work / "beat.log", "durable_django.tick")
            for name, running in (("worker", worker_process), ("beat", beat_process)):
                if running.poll() is not None:
                    raise Failed(f"celery {name} exited with code {running.returncode}")


# the guide's text -------------------------------------------------------------------------


def marked_snippets(guide: str, pattern: re.Pattern[str] = MARKER) -> list[tuple[str, str, str]]:
    """The ``(action, path, code)`` of each block marked ``append PATH`` or ``write PATH``
    (by :data:`MARKER`, or ``pattern``) in the page ``guide``."""
    snippets = []
    for match in pattern.finditer(guide):
        if match["action"] in ("append", "write"):
            code = guide[match.end() : guide.index("\n```\n", match.end()) + 1]
            snippets.append((match["action"], match["path"], code))
    if not snippets:
        raise Failed(f"no code blocks marked {pattern.pattern!r}")
    return snippets


def replace_once(text: str, old: str, new: str) -> str:
    if old not in text:
        return text
    if text.count(old) != 1:
        raise Failed(f"the guide's settings name {old!r} more than once")
    return text.replace(old, new)


def run_curl_lines(guide: str, base: str) -> None:
    """Run the ``$ curl`` lines of the block marked ``curl``: each must answer the status
    the guide shows after it; the guide's run id stands for the one the POST started."""
    match = next((m for m in MARKER.finditer(guide) if m["action"] == "curl"), None)
    if match is None:
        raise Failed("the guide's curl block is gone")
    block = guide[match.end() : guide.index("\n```\n", match.end())]
    lines = block.splitlines()
    guide_run_id = run_id = None
    for number, line in enumerate(lines):
        if not line.startswith("$ curl "):
            continue
        expected = int(lines[number + 1].split()[1])  # "HTTP/1.1 202 Accepted"
        args = shlex.split(line[2:].replace("localhost:8000", base.removeprefix("http://")))
        if guide_run_id and run_id:
            args = [arg.replace(guide_run_id, run_id) for arg in args]
        completed = subprocess.run(
            [*args, "-s"], capture_output=True, text=True, timeout=60, check=False
        )
        head, _, body = completed.stdout.partition("\n\n")  # text mode: \r\n read as \n
        status = int(head.split()[1]) if head.startswith("HTTP/") else 0
        print(f"  {shlex.join(args)[:90]}... -> {status}")
        if status != expected:
            raise Failed(f"{line!r} answered {status}, the guide shows {expected}: {body}")
        if guide_run_id is None:
            shown = next(text for text in lines[number + 1 :] if text.startswith("{"))
            guide_run_id = json.loads(shown)["run_id"]
            run_id = json.loads(body)["run_id"]
    if run_id is None:
        raise Failed("the guide's curl block has no POST")
    follow(base, Answer(202, {"Location": f"/runs/{run_id}"}, {"run_id": run_id}))


# HTTP ---------------------------------------------------------------------------------------


def request(url: str, data: dict | None = None) -> Answer:
    body = None if data is None else json.dumps(data).encode()
    http = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(http, timeout=60) as response:
            return Answer(response.status, dict(response.headers), json.loads(response.read()))
    except urllib.error.HTTPError as error:
        return Answer(error.code, dict(error.headers), json.loads(error.read() or b"{}"))


def burst(base: str) -> list[Answer]:
    """``BURST`` POSTs for company 42, released at once."""
    barrier = threading.Barrier(BURST)

    def post(n: int) -> Answer:
        barrier.wait()
        return request(f"{base}/chat/42/messages", {"message": f"hello number {n}"})

    with concurrent.futures.ThreadPoolExecutor(BURST) as pool:
        return list(pool.map(post, range(BURST)))


def follow(base: str, answer: Answer) -> None:
    """Poll the run at ``Location`` as a client would, until it has completed."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        run = request(base + answer.headers["Location"])
        if run.status != 200:
            raise Failed(f"GET {answer.headers['Location']} answered {run.status}: {run.body}")
        if run.body["status"] == "completed":
            return
        if run.body["status"] in ("failed", "cancelled"):
            raise Failed(f"run {answer.body['run_id']} ended {run.body}")
        time.sleep(float(run.headers.get("Retry-After", "1")))
    raise Failed(f"run {answer.body['run_id']} did not complete in {TIMEOUT:.0f} s")


def statuses(answers: list[Answer]) -> list[int]:
    return [answer.status for answer in answers]


# processes ----------------------------------------------------------------------------------


def step(title: str) -> None:
    print(f"== {title}", flush=True)


def run(command: list, cwd: Path | None = None, env: dict | None = None) -> None:
    completed = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if completed.returncode != 0:
        raise Failed(
            f"{shlex.join(map(str, command))} exited {completed.returncode}:\n"
            f"{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
        )


@contextlib.contextmanager
def process(command: list[str], cwd: Path, env: dict, log: Path) -> Iterator[subprocess.Popen]:
    """A long-running process for the block, its output in ``log``; stopped with SIGTERM."""
    with log.open("w") as output:
        child = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield child
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(child.pid, signal.SIGKILL)
                    child.wait()


def clear_default_queue(python: Path) -> None:
    """Drop messages an earlier, interrupted run left in this Redis database's queue."""
    code = "import redis, sys; redis.Redis.from_url(sys.argv[1]).delete('celery')"
    run([python, "-c", code, REDIS_URL])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_server(base: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"{base}/admin/login/", timeout=5).close()
            return
        time.sleep(0.5)
    raise Failed(f"runserver did not answer at {base} in {TIMEOUT:.0f} s")


def wait_for_log(log: Path, text: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while text not in log.read_text():
        if time.monotonic() > deadline:
            raise Failed(f"{log.name} never mentioned {text!r}")
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
