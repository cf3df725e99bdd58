"""kombu's filesystem transport, each message file written whole before a worker can see it.

kombu's own channel creates a message's file in the queue folder, then writes it: a worker
polling the folder in between takes the empty file, fails to decode it and stops. This
channel writes the message under a name no queue reads (it starts with a dot), then
renames it into place, which the operating system does at once.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from kombu.transport import filesystem
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    """The filesystem channel, its messages put in place whole."""

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        folder = self.data_folder_out
        partial = os.path.join(folder, f".{uuid.uuid4().hex}.partial")
        with open(partial, "wb") as file:
            file.write(dumps(payload).encode())
        # Named as kombu names a message: its time first, so a queue is read in order.
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        os.replace(partial, os.path.join(folder, name))


class Transport(filesystem.Transport):
    """kombu's filesystem transport with :class:`Channel`."""

    Channel = Channel
