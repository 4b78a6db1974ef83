"""The files of realm admission (issue 13, issue 26), read here so the rules stay pure.

``Allowlist`` reads the ``--allowlist`` file (node ids, 64 hex each, one a line; ``#`` comments
and blank lines ignored; parsed by ``relay.realms.admission.parse_allowlist``) and re-reads it
when its mtime or size changes (``reload``, called on the tick); ``ConnectRule`` only reads its
``ids``. A file that cannot be read or has a bad line keeps the list as it was (logged,
counted); at start it is an error (``AllowlistError``). ``load_station_endorsement`` reads one
``--realm-endorsement`` file (the record's RPC form in CBOR; checked by
``relay.realms.links.own_station_endorsements``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from macula.wire import cbor
from macula.wire.errors import ProtocolError
from macula.wire.records import Record
from relay.realms.admission import AllowlistError, parse_allowlist

log = logging.getLogger("macula.relay")

MAX_ENDORSEMENT_FILE_BYTES = 64 * 1024


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


def load_station_endorsement(path: Path) -> Record:
    """The record in ``path`` (CBOR of its RPC form); ``ValueError`` saying what is wrong."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from None
    if len(data) > MAX_ENDORSEMENT_FILE_BYTES:
        raise ValueError(f"{path}: larger than {MAX_ENDORSEMENT_FILE_BYTES} bytes")
    try:
        return Record.from_rpc(cbor.decode(data))
    except (ProtocolError, ValueError) as exc:
        raise ValueError(f"{path}: not a record (CBOR of its RPC form): {exc}") from None
