"""A module that starts a thread when imported: forking after it is unsafe."""

from __future__ import annotations

import threading

stop = threading.Event()
worker = threading.Thread(target=stop.wait, name="started-at-import", daemon=True)
worker.start()
