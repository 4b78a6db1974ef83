"""Stations pinned on first use, as SSH's known_hosts: ``$MACULA_HOME/known_stations``.

One line per station, ``host:port node_id_hex`` (IPv6 as ``[addr]:port``); blank lines and
lines starting with ``#`` are ignored.

Invariants:
- an address that names its node id (``node_id@host:port``) is never looked up nor recorded:
  the pin it carries is the one checked;
- an address without one is dialled pinned to its recorded key when the file has a line for
  it (``pin``); otherwise it is dialled unpinned and, once the handshake succeeded, the key the
  station proved is appended (``record``) — the TLS certificate key and the signed HELLO's
  node id must agree, or nothing is recorded and the connection is refused;
- a station whose key differs from the recorded one is refused with a ``HandshakeError`` that
  is not retryable and says how to accept the new key (``refused``); a line is never
  rewritten or removed by this module;
- the file is created 0600 in a directory created 0700; a file writable by group or others,
  or a malformed line, is refused (``KnownStationsError``) naming the file, the line and the
  fix, never skipped; two lines giving one station different keys are malformed;
- the file is read on every connection, so an edit takes effect without a restart, and
  appended with ``O_APPEND``, so two processes recording at once write whole lines.

Also here: ``station_node_id``, the public key of a station's data directory (the 32 bytes
after the key file's magic), which a client on the same machine pins without reading the seed.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Final

from macula.errors import HandshakeError
from macula.stations import StationAddress, parse_station
from macula.wire.identity import KEY_FILE_MAGIC

log = logging.getLogger("macula.known_stations")

FILE_NAME: Final = "known_stations"
STATION_KEY_FILE: Final = "station.key"
MAX_FILE_BYTES: Final = 1 << 20


class KnownStationsError(HandshakeError):
    """The known-stations file cannot be used, or a station does not match it (not retryable)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


def station_name(address: StationAddress) -> str:
    """``host:port`` as the file spells it: lowercase host, no node id."""
    return str(StationAddress(address.host.lower(), address.port))


class KnownStations:
    """The known-stations file at ``path`` (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], *, pin_in: str = "the station list") -> None:
        self.path = Path(path)
        self.pin_in = pin_in  # where a changed key's message says to pin it (a variable)

    def load(self) -> dict[str, bytes]:
        """``host:port`` -> node id for every line; ``KnownStationsError`` on any problem."""
        try:
            info = self.path.stat()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise KnownStationsError(f"{self.path}: cannot read it: {exc}") from None
        if not stat.S_ISREG(info.st_mode):
            raise KnownStationsError(f"{self.path} is not a regular file")
        if info.st_mode & 0o022:
            raise KnownStationsError(
                f"{self.path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}), so "
                f"anyone could change which station keys are trusted; run: chmod 600 {self.path}"
            )
        if info.st_size > MAX_FILE_BYTES:
            raise KnownStationsError(f"{self.path} is larger than {MAX_FILE_BYTES} bytes")
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise KnownStationsError(f"{self.path}: cannot read it: {exc}") from None
        known: dict[str, bytes] = {}
        for number, line in enumerate(text.splitlines(), 1):
            entry = self._parse_line(line, number)
            if entry is None:
                continue
            name, node_id = entry
            if known.get(name, node_id) != node_id:
                raise KnownStationsError(
                    f"{self.path} line {number}: {name} is listed again with another key; "
                    "keep the line with the key you trust and delete the other"
                )
            known[name] = node_id
        return known

    def _parse_line(self, line: str, number: int) -> tuple[str, bytes] | None:
        text = line.strip()
        if not text or text.startswith("#"):
            return None
        where = f"{self.path} line {number}"
        fix = "expected 'host:port node_id_hex' (64 hex); fix or delete the line"
        parts = text.split()
        if len(parts) != 2:
            raise KnownStationsError(f"{where}: {text[:120]!r}: {fix}")
        address_text, key_text = parts
        if "@" in address_text:
            raise KnownStationsError(f"{where}: {address_text[:120]!r} has a node id: {fix}")
        try:
            address = parse_station(address_text, source=where)
            node_id = bytes.fromhex(key_text)
        except ValueError as exc:  # ConfigError is a ValueError
            raise KnownStationsError(f"{where}: {exc}: {fix}") from None
        if len(node_id) != 32:
            raise KnownStationsError(f"{where}: the node id is not 64 hex characters: {fix}")
        return station_name(address), node_id

    def pin(self, address: StationAddress) -> StationAddress:
        """``address`` pinned to its recorded key; unchanged when pinned already or unknown."""
        if address.node_id is not None:
            return address
        node_id = self.load().get(station_name(address))
        if node_id is None:
            return address
        return StationAddress(address.host, address.port, node_id)

    def record(self, address: StationAddress, hello_key: bytes, tls_key: bytes | None) -> None:
        """After a first handshake with unpinned ``address``: append the key it proved.

        The certificate key must equal the HELLO's node id (``KnownStationsError`` otherwise).
        A file that cannot be written is logged: the connection stands, the pin waits.
        """
        if address.node_id is not None:
            return
        name = station_name(address)
        if tls_key != hello_key:
            raise KnownStationsError(
                f"station {name} presented certificate key {tls_key.hex() if tls_key else 'none'} "
                f"but signed its HELLO as {hello_key.hex()}: not recorded in {self.path}"
            )
        recorded = self.load().get(name)
        if recorded == hello_key:
            return
        if recorded is not None:  # another process recorded another key meanwhile
            raise self._changed(name, recorded, hello_key)
        try:
            self._append(f"{name} {hello_key.hex()}\n")
        except OSError as exc:
            log.warning("could not record the key of %s in %s: %s", name, self.path, exc)
            return
        log.info("recorded station %s with key %s in %s", name, hello_key.hex(), self.path)

    def _append(self, line: str) -> None:
        parent = self.path.parent
        if not parent.exists():
            parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(parent, 0o700)  # mkdir's mode is filtered by the umask
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def refused(
        self, address: StationAddress, dialled: StationAddress, error: HandshakeError
    ) -> HandshakeError:
        """``error`` of a connection to ``dialled``; a key mismatch of a pin this file gave
        becomes a message saying how to accept the new key. Anything else is returned as is."""
        if (
            address.node_id is not None
            or dialled.node_id is None
            or error.retryable
            or error.refusal_code is not None
        ):
            return error
        return self._changed(station_name(address), dialled.node_id, None, detail=str(error))

    def _changed(
        self, name: str, recorded: bytes, presented: bytes | None, *, detail: str = ""
    ) -> KnownStationsError:
        seen = f" ({detail})" if detail else ""
        if presented is not None:
            seen = f"; it presented {presented.hex()}{seen}"
        return KnownStationsError(
            f"the key of station {name} is not the one recorded in {self.path} "
            f"({recorded.hex()}){seen}. Someone may be impersonating it, or its key was "
            f"replaced. To accept the new key, remove the line for {name} from {self.path}, "
            f"or pin node_id@{name} in {self.pin_in}"
        )


def station_node_id(data_dir: str | os.PathLike[str]) -> bytes | None:
    """The node id of the station whose data directory is ``data_dir`` (from its key file's
    public part), or None when it has no key file yet; ``KnownStationsError`` if malformed."""
    path = Path(data_dir) / STATION_KEY_FILE
    try:
        with path.open("rb") as handle:
            head = handle.read(len(KEY_FILE_MAGIC) + 32)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KnownStationsError(f"station key file {path}: cannot read it: {exc}") from None
    if len(head) != len(KEY_FILE_MAGIC) + 32 or not head.startswith(KEY_FILE_MAGIC):
        raise KnownStationsError(f"station key file {path} is not a Macula v2 key file")
    return head[len(KEY_FILE_MAGIC) :]
