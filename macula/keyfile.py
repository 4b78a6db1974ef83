"""Key files on disk (PROTOCOL.md §12.1): the I/O around ``Identity.to_key_file``.

Invariants:
- the file is written atomically (temporary file in the same directory, fsync, rename, then
  fsync of the directory so the rename itself survives a power loss) with mode 0600, inside a
  directory that is created 0700 when missing;
- a key file readable or writable by group/others is refused on load (like ssh), naming the
  fix, and a malformed one is refused naming the problem: a broken key is never replaced
  silently by a fresh one;
- the seed never appears in an exception message or a log line.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from macula.errors import MaculaError
from macula.private_file import write_private
from macula.wire.errors import ProtocolError
from macula.wire.identity import DEFAULT_PUZZLE_DIFFICULTY, Identity


class KeyFileError(MaculaError):
    """A key file cannot be used; the message says which file and why."""


def save_identity(
    path: str | os.PathLike[str], identity: Identity, *, exclusive: bool = False
) -> Path:
    """Write ``identity`` to ``path`` atomically, 0600, creating a 0700 parent if needed.

    With ``exclusive`` an existing file is never replaced: ``FileExistsError`` instead.
    """
    return write_private(path, identity.to_key_file(), exclusive=exclusive)


def load_identity(path: str | os.PathLike[str]) -> Identity:
    """Read a key file; refuse one with loose permissions or a malformed body."""
    target = Path(path)
    try:
        info = target.stat()
    except FileNotFoundError:
        raise KeyFileError(f"key file {target} does not exist") from None
    if not stat.S_ISREG(info.st_mode):
        raise KeyFileError(f"key file {target} is not a regular file")
    if info.st_mode & 0o077:
        raise KeyFileError(
            f"key file {target} is accessible by others (mode {stat.S_IMODE(info.st_mode):o}); "
            f"run: chmod 600 {target}"
        )
    data = target.read_bytes()
    try:
        return Identity.from_key_file(data)
    except ProtocolError as exc:
        raise KeyFileError(f"key file {target} is not a Macula v2 key file: {exc.detail}") from None


def load_or_create_identity(
    path: str | os.PathLike[str],
    random_bytes: Callable[[int], bytes] = os.urandom,
    *,
    difficulty: int = DEFAULT_PUZZLE_DIFFICULTY,
) -> Identity:
    """Load the identity at ``path``, or grind a puzzle-hardened one and save it there."""
    target = Path(path)
    if target.exists():
        return load_identity(target)
    identity = Identity.generate(random_bytes, difficulty=difficulty)
    try:
        save_identity(target, identity, exclusive=True)
    except FileExistsError:  # another process created it meanwhile: theirs is the identity
        return load_identity(target)
    return identity
