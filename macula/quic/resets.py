"""QUIC stateless resets (RFC 9000 §10.3), sans-I/O: the tokens, the packet, the rate limit.

A station that lost a connection's state (it crashed and was restarted) answers that
connection's next packet with a stateless reset, so the client learns at once that the
connection is gone instead of after its unanswered pings. Invariants:
- a token is ``HMAC-SHA256(secret, cid)[:16]``, where ``secret = HMAC-SHA256(seed, LABEL)`` and
  ``seed`` is the station's Ed25519 private seed: deterministic per (key, connection id), so
  the station's next process makes the same token; nobody without the key can make one;
- a reset is ``RESET_MIN_SIZE`` bytes or more, always smaller than the packet it answers (no
  amplification; two endpoints answering each other's resets run out of bytes: §10.3.3), its
  first byte ``0b01xxxxxx`` (a short header), then unpredictable bytes, then the token; a
  packet of ``RESET_MIN_SIZE`` bytes or fewer is never answered;
- at most ``rate`` resets a second (a burst of ``burst``) leave a station: ``ResetLimiter``;
- a datagram is a reset for a token when it is ``RESET_MIN_SIZE`` bytes or more and ends with
  that token, compared in constant time. The caller checks only the token of a connection id
  it uses, and only a datagram none of whose packets it could process (§10.3.1).
Randomness and time are parameters.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import Final

LABEL: Final = b"macula-v1 quic stateless reset key"
TOKEN_SIZE: Final = 16
RESET_MIN_SIZE: Final = 21  # 5 unpredictable bytes (first byte included) + the token
# a reset answering a packet of up to this size is one byte shorter than it (§10.3 SHOULD)
SHORT_TRIGGER: Final = 43
RESET_SIZE_SPREAD: Final = 22  # larger triggers: 43..64 bytes, never the trigger's size or more
SHORT_HEADER_FORM: Final = 0x80  # the header-form bit: 0 in a short header
FIXED_BIT: Final = 0x40
DEFAULT_RATE: Final = 100.0  # resets a second, sustained
DEFAULT_BURST: Final = 100


def reset_secret(seed: bytes) -> bytes:
    """The key of every reset token, from the station's Ed25519 seed (32 bytes)."""
    if len(seed) != 32:
        raise ValueError(f"an Ed25519 seed is 32 bytes, not {len(seed)}")
    return hmac.digest(seed, LABEL, hashlib.sha256)


def reset_token(secret: bytes, cid: bytes) -> bytes:
    """The stateless reset token of connection id ``cid``."""
    return hmac.digest(secret, cid, hashlib.sha256)[:TOKEN_SIZE]


def reset_packet(
    token: bytes, trigger_size: int, random_bytes: Callable[[int], bytes]
) -> bytes | None:
    """The stateless reset answering a ``trigger_size``-byte packet; None when that packet is
    too small to be answered by a smaller reset."""
    if len(token) != TOKEN_SIZE:
        raise ValueError(f"a reset token is {TOKEN_SIZE} bytes, not {len(token)}")
    if trigger_size <= RESET_MIN_SIZE:
        return None
    if trigger_size <= SHORT_TRIGGER + 1:
        size = trigger_size - 1
    else:
        size = min(trigger_size - 1, SHORT_TRIGGER + random_bytes(1)[0] % RESET_SIZE_SPREAD)
    unpredictable = random_bytes(size - TOKEN_SIZE)
    first = (unpredictable[0] & 0x3F) | FIXED_BIT
    return bytes([first]) + unpredictable[1:] + token


def is_reset(datagram: bytes, token: bytes | None) -> bool:
    """Whether ``datagram`` is a stateless reset carrying ``token`` (constant-time)."""
    if not token or len(datagram) < RESET_MIN_SIZE:
        return False
    return hmac.compare_digest(datagram[-TOKEN_SIZE:], token)


def unknown_cid(datagram: bytes, cid_length: int) -> bytes | None:
    """The destination connection id of ``datagram`` when it is a short-header packet (fixed
    bit set) long enough to hold one; None for anything else (long headers: a new connection,
    a version negotiation, ...), which a reset never answers."""
    if len(datagram) <= cid_length or datagram[0] & SHORT_HEADER_FORM:
        return None
    if not datagram[0] & FIXED_BIT:
        return None
    return datagram[1 : 1 + cid_length]


class ResetLimiter:
    """A token bucket: at most ``rate`` resets a second after a burst of ``burst``."""

    __slots__ = ("_allowance", "_at", "burst", "rate")

    def __init__(self, rate: float = DEFAULT_RATE, burst: int = DEFAULT_BURST) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a reset rate is > 0 and a burst >= 1, not {rate}, {burst}")
        self.rate = rate
        self.burst = burst
        self._allowance = float(burst)
        self._at: float | None = None

    def allow(self, now: float) -> bool:
        """Whether one more reset may leave at ``now`` (monotonic seconds); counts it if so."""
        if self._at is not None:
            self._allowance = min(self.burst, self._allowance + (now - self._at) * self.rate)
        self._at = now
        if self._allowance < 1:
            return False
        self._allowance -= 1
        return True


class StatelessResets:
    """A station's side: the token of each connection id it hands out, and the reset answering
    a short-header packet for a connection id it does not know (rate-limited)."""

    def __init__(
        self,
        seed: bytes,
        random_bytes: Callable[[int], bytes],
        limiter: ResetLimiter | None = None,
    ) -> None:
        self._secret = reset_secret(seed)
        self._random_bytes = random_bytes
        self.limiter = limiter or ResetLimiter()
        self.sent = 0
        self.limited = 0  # resets not sent: over the rate
        self.too_small = 0  # packets not answered: no smaller reset could be made

    def token(self, cid: bytes) -> bytes:
        return reset_token(self._secret, cid)

    def answer(self, datagram: bytes, cid: bytes, now: float) -> bytes | None:
        """The reset for ``datagram`` (whose connection id ``cid`` is unknown here), or None:
        too small to answer, or over the rate."""
        if len(datagram) <= RESET_MIN_SIZE:
            self.too_small += 1
            return None
        if not self.limiter.allow(now):
            self.limited += 1
            return None
        packet = reset_packet(self.token(cid), len(datagram), self._random_bytes)
        if packet is not None:
            self.sent += 1
        return packet
