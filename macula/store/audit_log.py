"""The files of one agent's audit trail: hash-chained JSON lines in rotated segments.

Layout of ``<MACULA_HOME>/audit/<node_id hex>/`` (0700, every file 0600):
- ``seg-<first seq, 12 digits>.jsonl``: one entry a line, keys sorted, no spaces;
- ``head``: the chain's head (seq, hash, segment, size, signed), written when the trail is
  made and rewritten in place on every append; ``verify`` compares the end of the last segment
  with it, so a cut tail is seen, and a folder without it as a trail wiped;
- ``anchor.json``: written when the oldest segment is dropped: the seq and hash of the last
  entry dropped, signed by the agent's key, so the chain still verifies from there;
- ``lock``: ``fcntl.flock`` taken around every append by every process (daemon, stdio server,
  CLI), so two writers never fork the chain.

Invariants:
- an entry's ``hash`` is SHA-256 over ``DOMAIN`` and the canonical JSON of the entry without
  ``hash``; its ``prev`` is the previous entry's hash (``GENESIS`` for seq 1); seq counts up by
  one across segments: the first entry of a segment links to the last of the one before;
- an append is one ``write`` of a whole line to an ``O_APPEND`` descriptor under the lock, then
  the head; no fsync per entry (the trail's checkpoints fsync), so a power loss may cost the
  entries since the last checkpoint, and ``verify`` then says the end was cut;
- the log never rewrites or deletes an entry except by dropping a whole oldest segment after
  its anchor is on disk; the one thing it cuts is a partial last line that is no entry (a
  write cut short by a crash), under the lock, before the next append.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from macula.private_file import PRIVATE_FILE_MODE, private_dir, sync_directory, write_private

DOMAIN: Final = b"macula-audit-entry-v1\n"
GENESIS: Final = "0" * 64
HEAD_FILE: Final = "head"
ANCHOR_FILE: Final = "anchor.json"
LOCK_FILE: Final = "lock"
CHECKPOINT_KIND: Final = "head_signed"
HEAD_BYTES: Final = 512  # the head is padded to this, so rewriting it in place needs no truncate
DEFAULT_SEGMENT_BYTES: Final = 512 * 1024
DEFAULT_SEGMENTS: Final = 8  # kept: with 512 KiB segments at most 4 MiB (about 16,000 entries)
_SEGMENT = re.compile(r"seg-(\d{12})\.jsonl\Z")
_HASH = re.compile(r"[0-9a-f]{64}\Z")
TAIL_READ: Final = 64 * 1024

Entry = dict[str, Any]


def canonical(value: Any) -> bytes:
    """The one JSON encoding of the trail: keys sorted, no spaces, ASCII only."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def entry_hash(entry: Entry) -> str:
    """The hash an entry must carry (over every key but ``hash``)."""
    body = {key: value for key, value in entry.items() if key != "hash"}
    return hashlib.sha256(DOMAIN + canonical(body)).hexdigest()


def segment_name(first_seq: int) -> str:
    return f"seg-{first_seq:012d}.jsonl"


def segments(directory: Path) -> list[tuple[int, Path]]:
    """The segments of a trail, oldest first, as (first seq, path)."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for path in directory.iterdir():
            named = _SEGMENT.match(path.name)
            if named:
                found.append((int(named.group(1)), path))
    return sorted(found)


@dataclass(frozen=True, slots=True)
class Head:
    """The last entry of the chain and where it is."""

    seq: int
    hash: str
    segment: str
    size: int
    signed: int = 1  # 1: the entry at ``seq`` is a checkpoint (or there is none): nothing due

    def encoded(self) -> bytes:
        text = canonical({"seq": self.seq, "hash": self.hash, "segment": self.segment,
                          "size": self.size, "signed": self.signed})  # fmt: skip
        return text.ljust(HEAD_BYTES - 1) + b"\n"


def is_hash(value: object) -> bool:
    """Whether ``value`` is a hash as the trail writes it: 64 lowercase hex digits."""
    return isinstance(value, str) and _HASH.match(value) is not None


def is_seq(value: object) -> bool:
    """Whether ``value`` is a seq as the trail writes it: an int >= 0 (not a bool)."""
    return type(value) is int and value >= 0


def parse_head(data: bytes) -> Head | None:
    """The head in ``data``, or None when it is missing or not a head."""
    try:
        raw = json.loads(data.decode("ascii").strip() or "null")
        seq, digest, segment, size = raw["seq"], raw["hash"], raw["segment"], raw["size"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    if not (is_seq(seq) and is_hash(digest) and is_seq(size) and isinstance(segment, str)):
        return None
    if _SEGMENT.match(segment) is None:
        return None
    return Head(seq, digest, segment, size, 0 if raw.get("signed") == 0 else 1)


def read_head(directory: Path) -> Head | None:
    try:
        return parse_head((directory / HEAD_FILE).read_bytes())
    except FileNotFoundError:
        return None


def read_anchor(directory: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads((directory / ANCHOR_FILE).read_text("ascii"))
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError):
        return {}
    return raw if isinstance(raw, dict) else {}


def anchor_point(directory: Path) -> tuple[int, str] | None:
    """The anchor's (seq, hash) when ``anchor.json`` holds well-formed ones (not verified)."""
    anchor = read_anchor(directory) or {}
    seq, digest = anchor.get("seq"), anchor.get("hash")
    if is_seq(seq) and is_hash(digest):
        assert isinstance(seq, int) and isinstance(digest, str)
        return seq, digest
    return None


def _last_entry(path: Path) -> tuple[Entry | None, int, bool]:
    """The last whole entry of a segment, its size, and whether it ends with a newline."""
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        start = max(0, size - TAIL_READ)
        handle.seek(start)
        tail = handle.read()
    for line in reversed(tail.split(b"\n")):
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            entry = json.loads(line)
            if isinstance(entry, dict) and is_seq(entry.get("seq")) and is_hash(entry.get("hash")):
                return entry, size, tail.endswith(b"\n") or not tail
    return None, size, tail.endswith(b"\n") or not tail


def _open_private(path: Path, flags: int) -> int:
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    os.fchmod(fd, PRIVATE_FILE_MODE)
    return fd


class AuditLog:
    """Appends to one trail's files; safe across threads of a process and across processes."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        keep_segments: int = DEFAULT_SEGMENTS,
    ) -> None:
        if segment_bytes < 1024 or keep_segments < 2:
            raise ValueError("segment_bytes >= 1024 and keep_segments >= 2")
        private_dir(directory.parent)  # <home>/audit: 0700 too (mkdir's parents are not)
        self.directory = private_dir(directory)
        self.segment_bytes = segment_bytes
        self.keep_segments = keep_segments
        self._lock_fd = _open_private(directory / LOCK_FILE, os.O_RDWR)
        self._head_fd = _open_private(directory / HEAD_FILE, os.O_RDWR)
        self._segment_fd: int | None = None
        self._segment_name = ""
        self._written: tuple[bytes, Head | None] = (b"", None)  # the head as this process wrote it
        if os.fstat(self._head_fd).st_size == 0:  # a new trail: a head from the start, so
            with self.locked() as head:  # verify can tell a trail wiped from one never written
                if not segments(directory):
                    self._write_head(head)

    def close(self) -> None:
        for fd in (self._segment_fd, self._head_fd, self._lock_fd):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._segment_fd, self._head_fd, self._lock_fd = None, -1, -1

    @contextlib.contextmanager
    def locked(self) -> Iterator[Head]:
        """The lock held, and the head as it is now (recovered from the files if needed)."""
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield self._current_head()
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def append(self, head: Head, entry: Entry) -> Head:
        """Write ``entry`` (already chained to ``head``) after it; the lock must be held."""
        line = canonical(entry) + b"\n"
        fd = self._segment(head.segment)
        os.write(fd, line)
        signed = int(entry.get("kind") == CHECKPOINT_KIND)
        new = Head(entry["seq"], entry["hash"], head.segment, head.size + len(line), signed)
        self._write_head(new)
        return new

    def sync(self) -> None:
        """Make what was appended durable (called at checkpoints and on close)."""
        for fd in (self._segment_fd, self._head_fd):
            if fd is not None and fd >= 0:
                os.fsync(fd)

    def rotate(self, head: Head, anchor: Callable[[int, str], dict[str, Any]]) -> Head:
        """Start a new segment after ``head`` when the current one is full, dropping the oldest
        beyond ``keep_segments`` once ``anchor(seq, hash)`` of its last entry is written."""
        if head.size < self.segment_bytes:
            return head
        self.sync()
        name = segment_name(head.seq + 1)
        fd = self._segment(name)
        rotated = Head(head.seq, head.hash, name, os.fstat(fd).st_size, head.signed)
        self._write_head(rotated)
        held = segments(self.directory)
        for index in range(len(held) - self.keep_segments):
            oldest_next_first = held[index + 1][0]
            last = oldest_next_first - 1
            dropped = held[index][1]
            entry, _, _ = _last_entry(dropped)
            if entry is None or int(entry["seq"]) != last:
                break  # not what a chain would hold: keep it for verify to name
            write_private(self.directory / ANCHOR_FILE, canonical(anchor(last, entry["hash"])))
            dropped.unlink()
        sync_directory(self.directory)
        return rotated

    def _segment(self, name: str) -> int:
        if self._segment_fd is None or name != self._segment_name:
            if self._segment_fd is not None:
                os.close(self._segment_fd)
            self._segment_fd = _open_private(self.directory / name, os.O_WRONLY | os.O_APPEND)
            self._segment_name = name
        return self._segment_fd

    def _write_head(self, head: Head) -> None:
        encoded = head.encoded()
        os.pwrite(self._head_fd, encoded, 0)
        self._written = (encoded, head)

    def _current_head(self) -> Head:
        data = os.pread(self._head_fd, HEAD_BYTES, 0)
        written, known = self._written
        head = known if data == written else parse_head(data)  # mostly what this process wrote
        if head is not None:
            try:
                size = os.stat(self.directory / head.segment).st_size
            except FileNotFoundError:
                size = -1
            if size == head.size:
                return head
        return self._recovered()

    def _recovered(self) -> Head:
        """The head rebuilt from the newest segment (a crash between an entry and the head,
        or a head file lost): the chain goes on from its last whole entry."""
        held = segments(self.directory)
        if not held:
            seq, digest = anchor_point(self.directory) or (0, GENESIS)
            return Head(seq, digest, segment_name(seq + 1), 0)
        first, path = held[-1]
        entry, size, whole = _last_entry(path)
        if not whole:
            size = self._mended(path, size)
        if entry is None:  # a segment just begun: the chain goes on from the one before
            return Head(first - 1, self._before(held[:-1], first), path.name, size)
        signed = int(entry.get("kind") == CHECKPOINT_KIND)
        return Head(entry["seq"], entry["hash"], path.name, size, signed)

    def _mended(self, path: Path, size: int) -> int:
        """A segment whose last line is cut (a crash or a full disk mid-write) made whole; its
        new size. A cut line that is not an entry is cut off, back to the end of the last whole
        line (the entry being written is lost; ``verify`` then sees a clean chain); an entry
        that lacks only its newline gets one."""
        with open(path, "rb") as handle:
            start = max(0, size - TAIL_READ)
            handle.seek(start)
            tail = handle.read()
        newline = tail.rfind(b"\n")
        if parse_entry(tail[newline + 1 :]) is None and (newline >= 0 or start == 0):
            end = start + newline + 1
            os.truncate(path, end)
            return end
        os.write(self._segment(path.name), b"\n")
        return size + 1

    def _before(self, older: list[tuple[int, Path]], first: int) -> str:
        """The hash of entry ``first - 1``: the last of the segment before, or the anchor
        (``GENESIS`` when neither holds it: ``verify`` then names the break)."""
        if older:
            entry, _, _ = _last_entry(older[-1][1])
            if entry is not None and entry["seq"] == first - 1:
                return str(entry["hash"])
        anchored = anchor_point(self.directory)
        if anchored is not None and anchored[0] == first - 1:
            return anchored[1]
        return GENESIS


def read_lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """Each line of a segment: (line number from 1, bytes, ended by a newline)."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        last = number == len(lines)
        if last and not line:
            return
        yield number, line, not last


def parse_entry(line: bytes) -> Entry | None:
    """An entry as written, or None for a line that is not one."""
    try:
        entry = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(entry, dict) or not is_seq(entry.get("seq")):
        return None
    return entry


def entries(directory: Path, after_seq: int = 0) -> Iterator[Entry]:
    """Every readable entry with seq > ``after_seq`` and after the anchor, oldest first
    (unreadable lines skipped, and what lies at or below the anchor: a segment a rotation
    dropped, or one put there by hand; ``verify`` is what names them)."""
    anchored = anchor_point(directory)
    after_seq = max(after_seq, anchored[0] if anchored else 0)
    held = segments(directory)
    for index, (_, path) in enumerate(held):
        following = held[index + 1][0] if index + 1 < len(held) else None
        if following is not None and following - 1 <= after_seq:
            continue
        with contextlib.suppress(FileNotFoundError):  # dropped by a rotation meanwhile
            for _, line, _ in read_lines(path):
                entry = parse_entry(line)
                if entry is not None and entry["seq"] > after_seq:
                    yield entry
