"""The one wall clock of macula, and the shape of an injected one.

Sans-I/O code (``macula.client.core``, ``relay.core.router``) never reads the clock: it takes
``now_ms``
as an argument. The I/O shells read it here, so a test can replace an ``MsClock`` with a stepped
one. (``MsClock`` reads milliseconds of the wall clock; a ``clock`` in seconds, such as
``Node(clock=time.monotonic)``, is a ``Callable[[], float]``.)
"""

from __future__ import annotations

import time
from collections.abc import Callable

MsClock = Callable[[], int]  # milliseconds since the Unix epoch


def now_ms() -> int:
    """Milliseconds since the Unix epoch (the unit of every ``*_ms`` field of the wire)."""
    return time.time_ns() // 1_000_000


def now_us() -> int:
    """Microseconds since the Unix epoch."""
    return time.time_ns() // 1_000
