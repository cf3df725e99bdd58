"""Recorded tracebacks for people: whole, in a scrollable block, with durable_django's own
frames folded so the frames of the user's code stand out."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import ngettext

#: The directory of the durable_django package.
PACKAGE_DIR = Path(__file__).resolve().parent.parent

#: ``  File "<path>", line N, in name``: the first line of a frame.
FRAME_LINE = re.compile(r'^  File "(?P<path>[^"]+)", line \d+')


@cache
def is_library_file(path: str) -> bool:
    """Whether ``path`` is a module of durable_django, wherever it was installed when the
    traceback was recorded (a worker's path may differ from this process's).

    The part after the last ``durable_django/`` directory must name a file of this package:
    ``…/site-packages/durable_django/_runtime/execution/turn.py`` does, a project checked out in a
    ``durable_django`` directory (``…/durable_django/tests/test_x.py``) does not.
    """
    parts = path.replace("\\", "/").split("/")
    if "durable_django" not in parts[:-1]:
        return False
    last = len(parts) - 1 - parts[::-1].index("durable_django")
    return PACKAGE_DIR.joinpath(*parts[last + 1 :]).is_file()


@dataclass
class Section:
    """Consecutive lines of a traceback: durable_django's frames, or anything else."""

    library: bool
    lines: list[str] = field(default_factory=list)
    frames: int = 0


def sections(traceback: str) -> list[Section]:
    """The traceback's lines in sections; a frame's source and caret lines stay with it."""
    found: list[Section] = []
    in_library_frame = False
    for line in traceback.rstrip("\n").split("\n"):
        frame = FRAME_LINE.match(line)
        if frame:
            in_library_frame = is_library_file(frame["path"])
        elif not line.startswith("    "):
            in_library_frame = False  # the end of a frame: a message, a chained header
        if not found or found[-1].library != in_library_frame:
            found.append(Section(in_library_frame))
        found[-1].lines.append(line)
        found[-1].frames += bool(frame)
    return found


def traceback_block(traceback: str) -> SafeString:
    """The whole traceback in a block that scrolls (both ways) past its maximum height,
    each run of durable_django's frames folded into a closed ``<details>``."""
    parts = []
    for section in sections(traceback):
        text = "\n".join(section.lines)
        if not section.library:
            parts.append(format_html("<pre>{}</pre>", text))
            continue
        summary = ngettext(
            "%(count)d frame of durable_django hidden",
            "%(count)d frames of durable_django hidden",
            section.frames,
        ) % {"count": section.frames}
        parts.append(
            format_html(
                '<details class="durable-library-frames"><summary>{}</summary><pre>{}</pre>'
                "</details>",
                summary,
                text,
            )
        )
    return format_html(
        '<div class="durable-traceback">{}</div>',
        format_html_join("", "{}", ((part,) for part in parts)),
    )
