"""Exceptions of the wire core.

Rules (h11 style):
- ``ProtocolError``: the *peer* sent something this wire does not allow (malformed CBOR, an
  oversize frame, a field of the wrong type, a bad signature or record). Anything decoded from
  outside raises only this (or a subclass), never ``KeyError``/``IndexError``/``UnicodeError``.
- ``LocalProtocolError``: *we* were asked to build something the wire cannot carry (a NaN, a
  ``set``, a 40-byte node id). It is a programming or argument error on our side.
Both carry a short machine ``reason`` (snake_case) and a human ``detail``.
"""

from __future__ import annotations

from typing import Any


class WireError(Exception):
    """Base of every error raised by ``macula.wire``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail or reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


class ProtocolError(WireError):
    """Input from a peer (bytes, frames, records) violates Macula wire v2."""


class FramingError(ProtocolError):
    """The byte stream itself is broken (bad length, undecodable CBOR): the stream is lost.

    ``frames_before`` holds frames decoded from the same read before the broken one.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason, detail)
        self.frames_before: list[dict[str, Any]] = []


class SignatureInvalid(ProtocolError):
    """A signature is missing, malformed or does not verify against the expected key."""


class RecordInvalid(ProtocolError):
    """A DHT record is malformed, badly signed or expired."""


class ContentInvalid(ProtocolError):
    """Content (block, manifest) does not match its content id."""


class LocalProtocolError(WireError, ValueError):
    """We were asked to build something Macula wire v2 cannot carry."""
