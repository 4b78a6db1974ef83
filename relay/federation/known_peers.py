"""The peer stations a station has linked with or discovered, kept on disk for a restart.

A station rejoins the mesh from its ``--peer`` list *and* these (issue 12): ``known_peers.json``
in its data dir, ``{"version": 1, "stations": [{"node_id": hex, "host", "quic_port",
"seen_ms"}]}``. Invariants: the file is private (0600, in the 0700 data dir) and replaced
atomically (a temporary file renamed over it), so a crash leaves the old or the new one;
it holds at most ``max_count`` stations, the most recently seen, never this station itself;
what is read is validated entry by entry: a file that is not such JSON (or is larger than
``MAX_FILE_BYTES``) is logged and ignored, a bad entry is skipped and counted in the log line,
and neither is ever fatal. Nothing is written when nothing changed.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from relay.federation.links import LinkTarget, StationLike

log = logging.getLogger("macula.relay")

FILE_NAME = "known_peers.json"
VERSION = 1
MAX_FILE_BYTES = 1 << 20
MAX_HOST_CHARS = 253


class KnownPeers:
    def __init__(
        self, path: Path, own_id: bytes, *, max_count: int, clock: Callable[[], int]
    ) -> None:
        if max_count < 0:
            raise ValueError("max_count must be >= 0")
        self.path = path
        self.own_id = own_id
        self.max_count = max_count
        self._clock = clock
        self._seen: dict[bytes, tuple[LinkTarget, int]] = {}  # oldest seen first

    def targets(self) -> list[LinkTarget]:
        """The stations to dial after a restart, most recently seen first."""
        return [target for target, _ in reversed(self._seen.values())]

    def load(self) -> list[LinkTarget]:
        """Read the file (a missing one is an empty list); see the invariants for bad ones."""
        self._seen.clear()
        try:
            if self.path.stat().st_size > MAX_FILE_BYTES:
                log.warning("%s is larger than %d bytes: ignored", self.path, MAX_FILE_BYTES)
                return []
            document = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            log.warning("%s cannot be read (%s): ignored", self.path, type(exc).__name__)
            return []
        entries = document.get("stations") if isinstance(document, dict) else None
        if not isinstance(document, dict) or document.get("version") != VERSION:
            log.warning("%s is not a version %d known-peers file: ignored", self.path, VERSION)
            return []
        if not isinstance(entries, list):
            log.warning("%s has no list of stations: ignored", self.path)
            return []
        bad = 0
        for entry in entries:
            parsed = _entry(entry)
            if parsed is None or parsed[0].node_id == self.own_id:
                bad += 1
                continue
            target, seen_ms = parsed
            self._seen.pop(target.node_id, None)
            self._seen[target.node_id] = (target, seen_ms)
        self._seen = dict(sorted(self._seen.items(), key=lambda item: item[1][1]))
        self._trim()
        if bad:
            log.warning("%s: %d invalid entries skipped", self.path, bad)
        return self.targets()

    def saw(self, stations: Iterable[StationLike]) -> bool:
        """Note ``stations`` as seen now (linked, or listed live by the DHT), then save;
        whether the file was written."""
        if self.max_count == 0:
            return False
        now, changed = self._clock(), False
        for station in stations:
            target = LinkTarget(station.node_id, station.host, station.quic_port)
            if target.node_id == self.own_id or _valid_target(target) is None:
                continue
            old = self._seen.pop(target.node_id, None)
            self._seen[target.node_id] = (target, now)
            changed = changed or old is None or old[0] != target
        if not changed:
            return False
        self._trim()
        return self.save()

    def _trim(self) -> None:
        while len(self._seen) > self.max_count:
            del self._seen[next(iter(self._seen))]

    def save(self) -> bool:
        """Write the file atomically, 0600; a failure is logged, never raised."""
        document = {
            "version": VERSION,
            "stations": [
                {
                    "node_id": target.node_id.hex(),
                    "host": target.host,
                    "quic_port": target.quic_port,
                    "seen_ms": seen_ms,
                }
                for target, seen_ms in self._seen.values()
            ],
        }
        temporary = self.path.with_name(self.path.name + ".tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                json.dump(document, file)
            os.chmod(temporary, 0o600)
            os.replace(temporary, self.path)
        except OSError as exc:
            log.warning("could not save %s: %s", self.path, exc.strerror or exc)
            return False
        return True


def _entry(entry: Any) -> tuple[LinkTarget, int] | None:
    if not isinstance(entry, dict):
        return None
    node_hex, host, port, seen_ms = (
        entry.get("node_id"),
        entry.get("host"),
        entry.get("quic_port"),
        entry.get("seen_ms"),
    )
    if not isinstance(node_hex, str) or len(node_hex) != 64 or type(seen_ms) is not int:
        return None
    try:
        node_id = bytes.fromhex(node_hex)
    except ValueError:
        return None
    if not isinstance(host, str) or type(port) is not int:
        return None
    target = _valid_target(LinkTarget(node_id, host, port))
    return None if target is None else (target, seen_ms)


def _valid_target(target: LinkTarget) -> LinkTarget | None:
    host = target.host
    if len(target.node_id) != 32 or not 0 < target.quic_port <= 0xFFFF:
        return None
    if not host or len(host) > MAX_HOST_CHARS or not host.isprintable() or " " in host:
        return None
    return target
