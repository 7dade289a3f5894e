"""kombu's filesystem transport with atomic message files (the embedded default broker).

Upstream `_put` creates the message file and writes it afterwards, while a consumer moves and
reads any `*.msg` file without a lock: a consumer can read the empty file and die on a
JSONDecodeError (seen here with a worker and the API sending at once). Writing to a hidden
temporary name and renaming it into place makes a message appear whole or not at all.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.transport import filesystem
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        temporary = os.path.join(self.data_folder_out, f".{name}.tmp")
        with open(temporary, "wb") as handle:
            handle.write(dumps(payload).encode("utf-8"))  # type: ignore[no-untyped-call]
        os.replace(temporary, final)


class Transport(filesystem.Transport):
    Channel = Channel
