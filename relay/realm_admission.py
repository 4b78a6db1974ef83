"""Who may connect at all (issue 13): ``--admission open|allowlist|members``.

``ConnectRule`` is pure: a verified CONNECT and the number of realms its ``endorsements``
made it a member of in, a refusal (a §9 code and a reason) or None out. ``Allowlist`` reads
the ``--allowlist`` file (node ids, 64 hex each, one a line; ``#`` comments and blank lines
ignored) and re-reads it when its mtime or size changes (``reload``, called on the tick).

Invariants: ``open`` admits everyone; ``allowlist`` admits the node ids in the file;
``members`` admits a client whose CONNECT carries at least one valid, unrevoked endorsement
of a realm this station protects (the CONNECT ``endorsements`` array, PROTOCOL.md §3.3).
A station peer (capability bit 0) is admitted by its own rule in every mode but ``open``: its
node id is a configured ``--peer`` or in the allowlist file. Refusals: 0x10 ``unauthorized``
(not on the allowlist, not a known station), 0x05 ``target_realm_refused`` (no membership).
A file that cannot be read or has a bad line keeps the list as it was (logged, counted);
at start it is an error (``AllowlistError``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from macula.wire.codes import ErrorCode
from macula.wire.frames import CAP_STATION, Connect

log = logging.getLogger("macula.relay")


class AdmissionMode(StrEnum):
    OPEN = "open"
    ALLOWLIST = "allowlist"
    MEMBERS = "members"


class AllowlistError(ValueError):
    pass


def parse_allowlist(text: str) -> frozenset[bytes]:
    """The node ids of an allowlist file's text; ``AllowlistError`` naming the bad line."""
    ids: set[bytes] = set()
    for number, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            node_id = bytes.fromhex(entry)
        except ValueError:
            node_id = b""
        if len(node_id) != 32:
            raise AllowlistError(f"line {number}: expected a node id (64 hex digits)")
        ids.add(node_id)
    return frozenset(ids)


@dataclass(slots=True)
class Allowlist:
    path: Path
    ids: frozenset[bytes] = frozenset()
    stamp: tuple[int, int] | None = None
    failed_reloads: int = 0

    @classmethod
    def load(cls, path: Path) -> Allowlist:
        allowlist = cls(path)
        try:
            allowlist.stamp, allowlist.ids = allowlist._read()
        except (OSError, UnicodeDecodeError) as exc:
            raise AllowlistError(f"{path}: cannot read: {exc}") from None
        except AllowlistError as exc:
            raise AllowlistError(f"{path}: {exc}") from None
        return allowlist

    def _read(self) -> tuple[tuple[int, int], frozenset[bytes]]:
        info = os.stat(self.path)
        return (info.st_mtime_ns, info.st_size), parse_allowlist(self.path.read_text("utf-8"))

    def reload(self) -> bool:
        """Re-read the file if it changed; True if the list was replaced."""
        try:
            info = os.stat(self.path)
            if (info.st_mtime_ns, info.st_size) == self.stamp:
                return False
            self.stamp, self.ids = self._read()
        except (OSError, UnicodeDecodeError, AllowlistError) as exc:
            self.failed_reloads += 1
            if self.failed_reloads == 1 or self.failed_reloads % 100 == 0:
                log.warning("allowlist %s not re-read, keeping the old list: %s", self.path, exc)
            try:
                info = os.stat(self.path)
                self.stamp = (info.st_mtime_ns, info.st_size)  # not again until it changes
            except OSError:
                pass
            return False
        log.info("allowlist %s re-read: %d node ids", self.path, len(self.ids))
        return True


@dataclass(slots=True)
class ConnectRule:
    mode: AdmissionMode = AdmissionMode.OPEN
    allowlist: Allowlist | None = None
    stations: frozenset[bytes] = field(default_factory=frozenset)  # configured --peer ids

    def refusal(self, connect: Connect, memberships: int) -> tuple[int, str] | None:
        """Why this CONNECT (already verified) is refused, or None."""
        if self.mode is AdmissionMode.OPEN:
            return None
        allowed = self.allowlist.ids if self.allowlist is not None else frozenset()
        node_id = connect.node_id
        if connect.capabilities & CAP_STATION:  # a station peer: its own rule
            if node_id in self.stations or node_id in allowed:
                return None
            return ErrorCode.UNAUTHORIZED, "station not among this station's peers"
        if self.mode is AdmissionMode.ALLOWLIST:
            if node_id in allowed:
                return None
            return ErrorCode.UNAUTHORIZED, "node id not on this station's allowlist"
        if memberships > 0:
            return None
        return ErrorCode.TARGET_REALM_REFUSED, "no valid endorsement of a realm protected here"
