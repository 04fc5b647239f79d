"""The embedded broker: kombu's filesystem transport, with atomic message files.

kombu's own transport creates a message file and then writes into it, so a worker polling often can
read an empty file and die with a JSONDecodeError. Here a message is written under a temporary
name (which the reader ignores: it only takes `*.<queue>.msg`) and renamed into place, so a reader
sees whole messages or none. That makes a short polling interval safe, which keeps the embedded
default's notice -> reaction path well under a second per broker hop.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

SCHEME = "spotfs"


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".part"
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
    driver_type = "filesystem"
    driver_name = "spotfs"


def register() -> None:
    """Make `spotfs://` a broker URL kombu understands (idempotent)."""
    TRANSPORT_ALIASES.setdefault(SCHEME, "controlplane.broker:Transport")
