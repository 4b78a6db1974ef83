"""systemd's notify protocol (sd_notify), done by hand: a datagram to ``$NOTIFY_SOCKET``.

``Notifier.from_environment()`` reads ``NOTIFY_SOCKET`` (a path, or ``@name`` for an abstract
socket) and ``WATCHDOG_USEC`` (with ``WATCHDOG_PID``, which must be this process when set).
Without ``NOTIFY_SOCKET`` every call does nothing, so the station runs the same outside
systemd. A send that fails is logged once and never raises: the service manager is told what
it can be told, the station keeps serving.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("macula.relay")


def socket_address(value: str) -> str | bytes:
    """``@name`` -> the abstract address (a leading NUL), else the path as given."""
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    return value


def watchdog_interval_s(environ: Mapping[str, str], pid: int) -> float | None:
    """Half ``WATCHDOG_USEC`` (what systemd advises) in seconds, or None when not asked."""
    usec = environ.get("WATCHDOG_USEC", "")
    owner = environ.get("WATCHDOG_PID", "")
    if not usec.isdecimal() or int(usec) == 0:
        return None
    if owner and (not owner.isdecimal() or int(owner) != pid):
        return None
    return int(usec) / 2_000_000


class Notifier:
    def __init__(self, address: str | bytes | None, watchdog_s: float | None = None) -> None:
        self.address = address
        self.watchdog_s = watchdog_s
        self._failed = False

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        env = os.environ if environ is None else environ
        value = env.get("NOTIFY_SOCKET", "")
        if not value:
            return cls(None)
        return cls(socket_address(value), watchdog_interval_s(env, os.getpid()))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, **fields: str | int) -> bool:
        """Send ``KEY=value`` lines (``READY=1``, ``STATUS=...``); whether it was sent."""
        if self.address is None:
            return False
        message = "\n".join(f"{key.upper()}={value}" for key, value in fields.items())
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message.encode(), self.address)
        except OSError as exc:
            if not self._failed:
                log.warning("cannot notify the service manager: %s", exc)
            self._failed = True
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify(ready=1, status=status, mainpid=os.getpid())

    def stopping(self) -> bool:
        return self.notify(stopping=1, status="stopping")

    def reloading(self, monotonic_usec: int) -> bool:
        return self.notify(reloading=1, monotonic_usec=monotonic_usec)

    def watchdog(self) -> bool:
        return self.notify(watchdog=1)
