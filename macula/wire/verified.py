"""Signatures this process already verified, so the same claim is not verified twice here.

One EVENT reaches every node of a process that follows its topic: a daemon's agents, a
benchmark's fifty subscribers. Each verified its ``publisher_sig`` end to end: the same key,
message and signature, the same Ed25519 check, once per node. ``VerifiedSignatures`` remembers
the claims that verified, so the others are a lookup. Invariants:
- only a claim that verified is remembered; a bad one is checked every time (it costs the
  sender nothing to resend one, so remembering it would save nothing);
- a claim is remembered by (public key, signature, BLAKE2b-256 of the message): a hit needs the
  same key and signature over a message with the same digest, i.e. a second preimage of
  BLAKE2b-256, to say yes where a verify would say no;
- bounded: at most ``capacity`` claims (a few more while threads race), the oldest forgotten
  first; safe to share between threads without a lock (sans-I/O: no ``threading`` here): each
  step is one dict operation, and an eviction that loses a race is left to the next insert;
- Ed25519 verification is deterministic, so a remembered verdict is the verdict a new verify
  would give (PROTOCOL.md §4.4 says what is verified; this only says how often).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import OrderedDict
from typing import Final

from macula.wire.identity import verify

__all__ = ["DEFAULT_CAPACITY", "VerifiedSignatures", "publications"]

DEFAULT_CAPACITY: Final = 4096  # ~1.2 MB at most: the recent fan-out of a busy process


class VerifiedSignatures:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if type(capacity) is not int or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, not {capacity!r}")
        self.capacity = capacity
        self.hits = 0
        self.verifies = 0
        self._seen: OrderedDict[tuple[bytes, bytes, bytes], None] = OrderedDict()

    def verify(self, public_key: bytes, message: bytes, signature: object) -> bool:
        """``macula.wire.identity.verify``, remembered when it says yes."""
        if type(signature) is not bytes or type(public_key) is not bytes:
            return verify(public_key, message, signature)
        key = (public_key, signature, hashlib.blake2b(message, digest_size=32).digest())
        if key in self._seen:
            self.hits += 1
            return True
        self.verifies += 1
        if not verify(public_key, message, signature):
            return False
        self._seen[key] = None
        while len(self._seen) > self.capacity:
            with contextlib.suppress(KeyError):  # another thread emptied it meanwhile
                self._seen.popitem(last=False)  # the oldest: O(1), unlike a dict's first key
                continue
            break
        return True

    def forget(self) -> None:
        """Remember nothing (tests start from here)."""
        self._seen.clear()
        self.hits = self.verifies = 0

    def __len__(self) -> int:
        return len(self._seen)


publications = VerifiedSignatures()  # every ``publisher_sig`` this process checks (§4.4)
