"""How large a QUIC datagram may be on a path: 16,000 bytes to a loopback peer, 1,200 elsewhere.

Invariants: a loopback address (or ``localhost``) gets ``loopback_size`` (1,200 to 16,000); any
other host, or a name that is not an address, gets ``DATAGRAM_SIZE``; ``with_datagram_size``
never changes the caller's configuration (a copy when the size differs).
"""

from __future__ import annotations

import dataclasses
import ipaddress

from macula.quic.backend import QuicConfiguration

# UDP payload per datagram when the peer is on loopback (MTU 64 KiB): one datagram carries
# what takes thirteen of 1,200 bytes, so far fewer packet builds, AEAD calls and syscalls.
# aioquic writes a frame's length in two bytes (under 16,384), which bounds it; any other path
# keeps aioquic's 1,200 (it has no path-MTU discovery)
LOOPBACK_DATAGRAM_SIZE = 16_000
DATAGRAM_SIZE = 1200  # aioquic's default: RFC 9000's smallest maximum datagram size


def datagram_size(host: str, loopback_size: int = LOOPBACK_DATAGRAM_SIZE) -> int:
    """The QUIC datagram size for a path to (or a socket bound on) ``host``."""
    if not DATAGRAM_SIZE <= loopback_size <= LOOPBACK_DATAGRAM_SIZE:
        raise ValueError(
            f"loopback datagram size must be {DATAGRAM_SIZE} to "
            f"{LOOPBACK_DATAGRAM_SIZE} bytes, not {loopback_size}"
        )
    if host == "localhost":
        return loopback_size
    try:
        loopback = ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        loopback = False
    return loopback_size if loopback else DATAGRAM_SIZE


def with_datagram_size(
    configuration: QuicConfiguration, host: str, loopback_size: int = LOOPBACK_DATAGRAM_SIZE
) -> QuicConfiguration:
    """``configuration`` (a copy when changed) sized for a path to ``host``."""
    size = datagram_size(host, loopback_size)
    if configuration.max_datagram_size == size:
        return configuration
    return dataclasses.replace(configuration, max_datagram_size=size)
