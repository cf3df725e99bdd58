"""docs/testing.md as a program: its examples with a file name, added to the project of
docs/getting-started.md, pass when that project's tests run, as the page says.

The project is built from the guide's own text (``django-admin startproject``,
``startapp``, the files and settings lines it marks, read by
``scripts/getting_started.py``), then the blocks of the testing page marked
``<!-- testing: write PATH -->`` (or ``append PATH``) are written into it, and pytest runs
in it, with the page's configuration. On SQLite (the guide's PostgreSQL settings are
replaced in the test settings), so that every run of the suite checks the page.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "testing.md"
#: Generous: the guide's model call takes 2 s a turn, and the page's tests run 7 turns.
TIMEOUT = 300


def getting_started() -> ModuleType:
    """``scripts/getting_started.py``, which reads the guide's marked blocks."""
    spec = importlib.util.spec_from_file_location(
        "getting_started", ROOT / "scripts" / "getting_started.py"
    )
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return module


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


def test_the_testing_page_runs_in_the_guides_project(tmp_path: Path) -> None:
    guide = getting_started()
    site = tmp_path / "site"
    site.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CELERY_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for command in (["startproject", "proj", "."], ["startapp", "chat"]):
        made = run([sys.executable, "-m", "django", *command], site, env)
        assert made.returncode == 0, made.stderr
    page = PAGE.read_text()
    snippets = guide.marked_snippets(guide.GUIDE.read_text())
    snippets += guide.marked_snippets(page, guide.marker("testing"))
    for action, path, text in snippets:
        target = site / path
        if action == "append":
            with target.open("a") as file:
                file.write("\n" + text)
        else:
            target.write_text(text)
    with (site / "proj" / "settings_test.py").open("a") as file:
        file.write(
            '\nDATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", '
            f'"NAME": {str(tmp_path / "db.sqlite3")!r}}}}}\n'
        )
    tests = len(re.findall(r"^def test_", "".join(text for _, _, text in snippets), re.M))
    assert tests >= 5

    result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], site, env)

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{tests} passed" in result.stdout, result.stdout
