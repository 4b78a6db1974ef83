"""``AuditTrail``: what an agent did and what was done to it, append-only and hash-chained.

One trail per identity, under ``<MACULA_HOME>/audit/<node_id hex>/`` (``audit_dir``); the files
and the chain are ``macula.store.audit_log``'s. Every process of the agent (the daemon, a stdio
server, the CLI recording an owner's act) appends to the same chain under one file lock.

``record(kind, outcome, **facts) -> seq`` is the whole API. Kinds are past-tense facts
(``KINDS``); facts are short strings or ints. Nothing secret and no content goes in: content
is recorded as ``digest(value)``, HMAC-SHA256 keyed with a key derived from the agent's seed
(``digest_key``). Keyed, because an unkeyed hash of a short text ("yes", a path) is confirmed
by anyone who guesses it: whoever reads an exported trail, or the model through
``mesh_audit``, learns nothing about content; the owner, who holds the key file, can still
check a suspected content against a digest.

Checkpoints: every ``CHECKPOINT_EVERY`` entries (by seq, whichever process writes it), at each
segment's end and on ``close``, a ``head_signed`` entry carries an Ed25519 signature of the
chain head (``checkpoint_message``). 64: a signature costs about 50 µs, about one entry's
own cost, so signing adds under 2 % per entry amortised, and at most 63 entries of a running
agent are unsigned at any time. The files are fsynced at a segment's end and on ``close``
only: an fsync costs 1-10 ms on a busy disk, more than a whole say→wait, and it guards
against power loss, not tampering (a lost tail shows as ``truncated`` in ``verify``).

Invariants:
- no text chosen outside the agent is recorded: a tool name, a ring, task or approval id goes
  in only when it is a registered tool or has its id format, else as ``"?"`` and a digest
  (``outside_fact``);
- a fact value is an int (a bool becomes 0/1) or a string of at most ``MAX_FACT_CHARS``
  characters; a longer string or another type is a ``ValueError`` (a caller's bug: content
  must be digested, never recorded);
- ``record`` and ``checkpoint`` never raise to the caller once the facts are checked: a trail
  that cannot be written (a full disk, a damaged file) is counted (``failures``) and logged,
  and the call or the shutdown goes on (the owner's ``verify`` then says so);
- time comes from the injected clock (ms).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from macula.clock import MsClock, now_ms
from macula.config import (
    AUDIT_SEGMENT_KB_ENV,
    AUDIT_SEGMENTS_ENV,
    NO_AUDIT_ENV,
    flag_setting,
    macula_home,
    positive_int_setting,
)
from macula.store.audit_log import (
    DEFAULT_SEGMENT_BYTES,
    DEFAULT_SEGMENTS,
    GENESIS,
    AuditLog,
    Entry,
    Head,
    entry_hash,
)
from macula.wire.identity import Identity

log = logging.getLogger("macula.audit")

CHECKPOINT_EVERY: Final = 64
MAX_FACT_CHARS: Final = 256
SIGNATURE_DOMAIN: Final = b"macula-audit-head-v1\n"
ANCHOR_DOMAIN: Final = b"macula-audit-anchor-v1\n"
KINDS: Final = frozenset(
    {
        "tool_called",  # name, args_digest; outcome: ok or the error's code
        "task_received",  # sender, task_id, content_digest; accepted / refused / queued
        "call_received",  # procedure, caller, content_digest; accepted / refused / queued
        "ring_received",  # caller, ring_id, content_digest; accepted / refused / deferred / queued
        "owner_decided",  # approval_id, item_kind, sender, by; approved/denied/expired/withdrawn
        "policy_changed",  # switch, old, new (digests), by (cli / console), agent; applied
        "head_signed",  # a checkpoint: signed_seq, signed_hash, node_id, signature
    }
)


def audit_dir(home: Path, node_id: bytes) -> Path:
    """Where the trail of ``node_id`` lives under ``home`` (a ``MACULA_HOME``)."""
    return home / "audit" / node_id.hex()


def digest_key(identity: Identity) -> bytes:
    """The key of the trail's content digests, derived from the agent's seed (never stored)."""
    return hashlib.sha256(b"macula-audit-digest-key-v1\n" + identity.seed).digest()


def checkpoint_message(node_id: bytes, seq: int, head_hash: str) -> bytes:
    """What a checkpoint signs: the head entry's seq and hash, for this key."""
    return SIGNATURE_DOMAIN + node_id + seq.to_bytes(8, "big") + bytes.fromhex(head_hash)


def anchor_message(node_id: bytes, seq: int, head_hash: str) -> bytes:
    """What an anchor signs: the last dropped entry's seq and hash, in a domain of its own, so
    no checkpoint's signature (which anyone reading the trail sees) serves as an anchor's."""
    return ANCHOR_DOMAIN + node_id + seq.to_bytes(8, "big") + bytes.fromhex(head_hash)


def _digestible(value: Any) -> bytes:
    def default(item: Any) -> Any:
        if isinstance(item, (bytes, bytearray, memoryview)):
            return {"bytes": bytes(item).hex()}
        return repr(item)

    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=default)
    return text.encode("utf-8", "surrogatepass")


@dataclass(frozen=True, slots=True)
class AuditSettings:
    """Whether the trail is written, where, and how much of it is kept."""

    home: Path | None  # None: no trail (MACULA_MCP_NO_AUDIT=1)
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    keep_segments: int = DEFAULT_SEGMENTS

    @classmethod
    def off(cls) -> AuditSettings:
        return cls(None)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AuditSettings:
        kb = positive_int_setting(env, AUDIT_SEGMENT_KB_ENV, DEFAULT_SEGMENT_BYTES // 1024)
        keep = positive_int_setting(env, AUDIT_SEGMENTS_ENV, DEFAULT_SEGMENTS)
        home = None if flag_setting(env, NO_AUDIT_ENV) else macula_home(env)
        return cls(home, max(kb, 1) * 1024, max(keep, 2))


class Recorder(Protocol):
    """What the agent's parts call: ``record`` and ``digest`` (a trail, or ``NoTrail``)."""

    def record(self, kind: str, outcome: str, **facts: str | int) -> int: ...

    def digest(self, value: Any) -> str: ...


class NoTrail:
    """The trail turned off: records nothing, returns seq 0."""

    enabled = 0

    def record(self, kind: str, outcome: str, **facts: str | int) -> int:
        return 0

    def digest(self, value: Any) -> str:
        return ""

    def close(self) -> None:
        return None


NO_TRAIL: Final = NoTrail()


class UnwritableTrail(NoTrail):
    """The trail asked for but its folder cannot be made or opened: records nothing, counts
    each entry lost in ``failures`` (the agent starts and runs; the warning says why)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.failures = 0

    def record(self, kind: str, outcome: str, **facts: str | int) -> int:
        self.failures += 1
        return 0


class AuditTrail:
    """The trail of one identity (see the module docstring)."""

    enabled = 1

    def __init__(
        self,
        directory: Path,
        identity: Identity,
        *,
        clock: MsClock = now_ms,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        keep_segments: int = DEFAULT_SEGMENTS,
        checkpoint_every: int = CHECKPOINT_EVERY,
    ) -> None:
        self.directory = directory
        self.identity = identity
        self.clock = clock
        self.checkpoint_every = checkpoint_every
        self.failures = 0
        self._key = digest_key(identity)
        self._log = AuditLog(directory, segment_bytes=segment_bytes, keep_segments=keep_segments)
        self._threads = threading.Lock()  # flock is per open file: threads queue here first
        self._unsigned = 0  # entries this process wrote since it last signed

    @classmethod
    def open(
        cls, settings: AuditSettings, identity: Identity, clock: MsClock = now_ms
    ) -> AuditTrail | NoTrail:
        """The trail these settings ask for: an ``AuditTrail``, ``NO_TRAIL`` when off, or an
        ``UnwritableTrail`` when its folder cannot be made or opened (logged)."""
        if settings.home is None:
            return NO_TRAIL
        directory = audit_dir(settings.home, identity.node_id)
        try:
            return cls(
                directory,
                identity,
                clock=clock,
                segment_bytes=settings.segment_bytes,
                keep_segments=settings.keep_segments,
            )
        except OSError as exc:
            log.warning("the audit trail in %s cannot be opened, nothing is recorded: %s",
                        directory, exc)  # fmt: skip
            return UnwritableTrail(directory)

    def digest(self, value: Any) -> str:
        """HMAC-SHA256 (hex) of ``value``'s canonical JSON, keyed per agent."""
        return hmac.new(self._key, _digestible(value), hashlib.sha256).hexdigest()

    def record(self, kind: str, outcome: str, **facts: str | int) -> int:
        """Append one entry; its seq (0 when the trail could not be written)."""
        if kind not in KINDS or kind == "head_signed":
            raise ValueError(f"{kind!r} is not an audit kind")
        checked = _checked_facts(outcome, facts)
        try:
            with self._threads, self._log.locked() as head:
                if not head.signed and self._due(head):  # a writer died before its checkpoint
                    head = self._sign(head, sync=False)
                head = self._log.rotate(head, self._anchor)
                head = self._append(head, kind, outcome, checked)
                seq = head.seq
                if self._due(head):
                    self._sign(head, sync=head.size >= self._log.segment_bytes)
                return seq
        except Exception as exc:  # a full disk or a damaged file: never the caller's failure
            self.failures += 1
            log.warning("the audit trail in %s could not be written: %r", self.directory, exc)
            return 0

    def checkpoint(self) -> int:
        """Sign the head now if this process wrote since its last signature; the seq signed."""
        if not self._unsigned:
            return 0
        try:
            with self._threads, self._log.locked() as head:
                if head.seq == 0 or head.signed:  # nothing, or another process signed it
                    self._log.sync()
                    self._unsigned = 0
                    return 0
                self._sign(head, sync=True)
                return head.seq
        except Exception as exc:  # as in record: never fails the agent's shutdown
            self.failures += 1
            log.warning("the audit trail in %s could not be signed: %r", self.directory, exc)
            return 0

    def close(self) -> None:
        """Sign the head (a checkpoint at close) and let the files go."""
        self.checkpoint()
        self._log.close()

    def _append(self, head: Head, kind: str, outcome: str, facts: dict[str, str | int]) -> Head:
        entry: Entry = {"seq": head.seq + 1, "at_ms": int(self.clock()), "kind": kind,
                        "outcome": outcome, "facts": facts,
                        "prev": head.hash if head.seq else GENESIS}  # fmt: skip
        entry["hash"] = entry_hash(entry)
        self._unsigned += 1
        return self._log.append(head, entry)

    def _due(self, head: Head) -> bool:
        """Whether ``head`` must be signed now: every ``checkpoint_every`` seq, a full segment
        (``verify`` holds the trail to this cadence)."""
        return head.seq % self.checkpoint_every == 0 or head.size >= self._log.segment_bytes

    def _sign(self, head: Head, *, sync: bool) -> Head:
        node_id = self.identity.node_id
        signature = self.identity.sign(checkpoint_message(node_id, head.seq, head.hash))
        facts: dict[str, str | int] = {
            "signed_seq": head.seq,
            "signed_hash": head.hash,
            "node_id": node_id.hex(),
            "signature": signature.hex(),
        }
        signed = self._append(head, "head_signed", "signed", facts)
        if sync:
            self._log.sync()
        self._unsigned = 0
        return signed

    def _anchor(self, seq: int, head_hash: str) -> dict[str, Any]:
        node_id = self.identity.node_id
        signature = self.identity.sign(anchor_message(node_id, seq, head_hash))
        return {"seq": seq, "hash": head_hash, "node_id": node_id.hex(),
                "signature": signature.hex(), "at_ms": int(self.clock())}  # fmt: skip


def _checked_facts(outcome: str, facts: Mapping[str, object]) -> dict[str, str | int]:
    if not isinstance(outcome, str) or not 1 <= len(outcome) <= 64:
        raise ValueError("an outcome is a short word")
    checked: dict[str, str | int] = {}
    for name, value in facts.items():
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, int) or (isinstance(value, str) and len(value) <= MAX_FACT_CHARS):
            checked[name] = value
        else:
            raise ValueError(f"fact {name}: an int or a string of <= {MAX_FACT_CHARS} characters")
    return checked


def outside_fact(audit: Recorder, name: str, value: object, known: bool) -> dict[str, str]:
    """A fact that came from outside (a tool name, a ring or task id): ``{name: value}`` when
    ``known`` (a registered tool, an id of the format its check expects), else
    ``{name: "?", name_digest: digest}``. The trail never carries a text someone else chose:
    a model or a remote caller could otherwise write anything into it (a password, an
    instruction) and have it read back through ``mesh_audit``."""
    if known and isinstance(value, str) and 0 < len(value) <= 64:
        return {name: value}
    return {name: "?", f"{name}_digest": audit.digest(value)}


def record_once(
    settings: AuditSettings, identity: Identity, kind: str, outcome: str, **facts: str | int
) -> int:
    """One entry from a short-lived process (the CLI recording an owner's act): the trail is
    opened, written, signed (a checkpoint at close) and closed. Its seq (0 when off)."""
    trail = AuditTrail.open(settings, identity)
    try:
        return trail.record(kind, outcome, **facts)
    finally:
        trail.close()
