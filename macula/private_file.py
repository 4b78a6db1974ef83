"""Private files written whole: the one writer behind key files, tokens, memberships, policies
and the small state files of the daemon and the station.

Invariants:
- a reader sees the old file or the new one, never a part: the bytes go to a temporary file in
  the same directory, are fsynced, then renamed (or, with ``exclusive``, hard-linked) into place,
  and the directory is fsynced so the rename itself survives a power loss;
- the file is 0600 and a missing directory is made 0700 (mkdir's mode is filtered by the umask,
  so it is set again), unless ``parents=False``: then a missing directory is an error
  (``FileNotFoundError``), for files a person named (a station's ``--endpoint-file``);
- every call has a temporary file of its own (``mkstemp``): two threads of one process writing
  the same path at once never share one. Naming it by pid alone let a daemon's second thread
  fail on the first's temporary file and take that for "the file exists";
- with ``exclusive`` an existing file is never replaced: ``FileExistsError``, raised only when
  the target itself exists;
- nothing is left behind on failure.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


def private_dir(folder: Path) -> Path:
    """``folder``, made 0700 with its parents when missing."""
    if not folder.exists():
        folder.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        os.chmod(folder, PRIVATE_DIR_MODE)
    return folder


def write_private(
    path: str | os.PathLike[str], data: bytes, *, exclusive: bool = False, parents: bool = True
) -> Path:
    """Write ``data`` to ``path`` whole, 0600 (see the module docstring)."""
    target = Path(path)
    parent = private_dir(target.parent) if parents else target.parent
    fd, name = tempfile.mkstemp(dir=parent, prefix=f".{target.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, PRIVATE_FILE_MODE)
        if exclusive:
            os.link(tmp, target)  # atomic, and fails when another writer got there first
            tmp.unlink()
        else:
            os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    sync_directory(parent)
    return target


def sync_directory(directory: Path) -> None:
    """fsync ``directory``, making a rename or link in it durable (POSIX); a file system that
    cannot is let be."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
