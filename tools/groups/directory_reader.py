"""The local tree ``mesh_remember_directory`` reads: regular text files inside one directory,
nothing a link, a FIFO, a device or a secret-looking name could smuggle out of it.

What a file must be to be read (everything else is skipped, counted by reason, and a few of
its paths kept as a sample):
- inside the root: every directory and file is opened relative to its parent's descriptor with
  ``O_NOFOLLOW``, one name at a time, so a symbolic link (to a file or a directory) is never
  followed, and nothing swapped in after the listing (a link, a FIFO) is either;
- a regular file: opened ``O_NONBLOCK`` (a FIFO cannot block the open) and checked with
  ``fstat`` on the open descriptor, so devices, FIFOs and sockets are refused without a race;
- not secret-looking: names like ``.env*``, ``id_rsa``, ``*.pem``, ``*.key``, credentials
  files, and folders like ``.ssh``, ``.git``, ``.aws``, ``.gnupg`` are skipped, whatever
  ``exclude_dirs`` says, as is text holding a private-key block;
- bounded: bytes per file, files, total bytes and entries examined are capped, and the walk
  stops at a deadline; the result says which cap stopped it.
The root itself is named by the caller: ``~`` forms and ``..`` components are refused (and the
refusal says so), as are the kernel's pseudo-filesystems (``/proc``, ``/sys``, ``/dev``).
Synchronous on purpose: the tool runs it in a worker thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import itertools
import os
import stat
import time
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tools.server.results import InvalidArgument

SECRET_DIRS = frozenset(
    {".git", ".ssh", ".aws", ".gnupg", ".azure", ".kube", ".docker", ".password-store", ".gcloud"}
)
SECRET_NAMES = (
    ".env", ".env.*", "*.env", ".envrc", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
    "*.pem", "*.pem.*", "*.key", "*.key.*", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.kdbx",
    "*.gpg", "*.asc", ".netrc", ".pgpass", ".npmrc", ".pypirc", ".htpasswd", "credentials",
    "credentials.*", "*credentials*.json", "secrets.*", "*.secret", "*.secrets", "known_hosts",
    "authorized_keys",
)  # fmt: skip
SECRET_MARKERS = (b"PRIVATE KEY-----", b"-----BEGIN PGP PRIVATE")
PSEUDO_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))
SAMPLE_PER_REASON = 5
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
_NAME_ERRORS = {errno.ENAMETOOLONG: "name too long", errno.ELOOP: "too many symbolic links"}


@dataclass(frozen=True, slots=True)
class ReadLimits:
    max_file_bytes: int = 256 * 1024
    max_files: int = 2000
    max_total_bytes: int = 8 * 1024 * 1024
    max_entries: int = 100_000
    deadline_s: float = 30.0


@dataclass(frozen=True, slots=True)
class TextFile:
    relative: str
    text: str


@dataclass(slots=True)
class DirectoryRead:
    root: Path
    files: list[TextFile] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    samples: dict[str, list[str]] = field(default_factory=dict)
    stopped: str | None = None  # the cap that ended the walk early, if one did
    total_bytes: int = 0
    entries: int = 0
    full: bool = False  # a file did not fit in what max_total_bytes left

    def skip(self, reason: str, relative: str) -> None:
        self.skipped[reason] += 1
        sample = self.samples.setdefault(reason, [])
        if len(sample) < SAMPLE_PER_REASON:
            sample.append(relative)


def resolve_root(directory: str) -> Path:
    """The real directory ``directory`` names, or ``InvalidArgument`` saying why not."""
    if not directory or "\x00" in directory:
        raise InvalidArgument("directory: must be a non-empty path without NUL characters")
    if directory.startswith("~"):
        raise InvalidArgument(
            "directory: '~' is not expanded here; give the absolute path of the directory"
        )
    if ".." in PurePosixPath(directory).parts:
        raise InvalidArgument("directory: '..' is refused; give the directory's own path")
    shown = repr(directory if len(directory) <= 120 else directory[:120] + "...")
    try:
        root = Path(directory).resolve(strict=True)
        if not root.is_dir():
            raise InvalidArgument(f"directory: {shown} is not a directory")
    except OSError as exc:
        raise InvalidArgument(f"directory: {shown}: {_os_problem(exc)}") from None
    if any(root == pseudo or pseudo in root.parents for pseudo in PSEUDO_ROOTS):
        raise InvalidArgument(f"directory: {root} is a kernel pseudo-filesystem, not files")
    return root


def _os_problem(exc: OSError) -> str:
    known = _NAME_ERRORS.get(exc.errno or 0)
    return known or exc.strerror or type(exc).__name__


def secret_looking(name: str) -> bool:
    lowered = name.lower()
    return any(fnmatch.fnmatchcase(lowered, pattern) for pattern in SECRET_NAMES)


def read_directory(
    root: Path,
    extensions: tuple[str, ...],
    excluded: set[str],
    limits: ReadLimits = ReadLimits(),
    clock: Callable[[], float] = time.monotonic,
) -> DirectoryRead:
    """The text files of ``root`` (already resolved) with one of ``extensions``, walked in
    name order without following any link, within ``limits``."""
    found = DirectoryRead(root)
    deadline = clock() + limits.deadline_s
    root_fd = os.open(root, _OPEN_DIR)
    try:
        with contextlib.closing(_walk(root_fd, "", extensions, excluded, limits, found)) as walk:
            for reason in walk:
                if reason is None and clock() <= deadline:
                    continue
                found.stopped = reason or "deadline"
                break
    finally:
        os.close(root_fd)
    return found


def _walk(
    dir_fd: int,
    prefix: str,
    extensions: tuple[str, ...],
    excluded: set[str],
    limits: ReadLimits,
    found: DirectoryRead,
) -> Generator[str | None, None, None]:
    """Yields after each entry: None to go on, or the name of the cap reached."""
    with os.scandir(dir_fd) as listing:  # at most one entry past the cap is listed
        left = limits.max_entries - found.entries + 1
        entries = sorted(itertools.islice(listing, max(left, 0)), key=lambda e: e.name)
    for entry in entries:
        found.entries += 1
        if found.entries > limits.max_entries:
            yield "max_entries"
            return
        relative = f"{prefix}{entry.name}"
        if entry.is_symlink():
            found.skip("symbolic_link", relative)
        elif entry.is_dir(follow_symlinks=False):
            yield from _subdirectory(
                dir_fd, entry.name, relative, extensions, excluded, limits, found
            )
        elif PurePosixPath(entry.name).suffix.lower() not in extensions:
            found.skipped["other_extension"] += 1
        elif secret_looking(entry.name):
            found.skip("secret_looking_name", relative)
        elif not entry.is_file(follow_symlinks=False):  # FIFO, socket, device
            found.skip("not_a_regular_file", relative)
        else:
            _read_file(dir_fd, entry.name, relative, limits, found)
            if len(found.files) >= limits.max_files:
                yield "max_files"
                return
            if found.full:
                yield "max_total_bytes"
                return
        yield None


def _subdirectory(
    dir_fd: int,
    name: str,
    relative: str,
    extensions: tuple[str, ...],
    excluded: set[str],
    limits: ReadLimits,
    found: DirectoryRead,
) -> Generator[str | None, None, None]:
    if name.lower() in SECRET_DIRS:
        found.skip("secret_looking_folder", relative + "/")
        return
    if found.root / relative in PSEUDO_ROOTS:  # exact: no link on the way was followed
        found.skip("pseudo_filesystem", relative + "/")
        return
    if name in excluded:
        found.skip("excluded_folder", relative + "/")
        return
    try:
        child = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
    except OSError as exc:  # a link swapped in (ELOOP/ENOTDIR), or no permission
        found.skip("unreadable", f"{relative}/ ({_os_problem(exc)})")
        return
    try:
        yield from _walk(child, relative + "/", extensions, excluded, limits, found)
    finally:
        os.close(child)


def _read_file(
    dir_fd: int, name: str, relative: str, limits: ReadLimits, found: DirectoryRead
) -> None:
    try:
        fd = os.open(name, _OPEN_FILE, dir_fd=dir_fd)
    except OSError as exc:  # replaced since it was listed: a link (ELOOP), a socket (ENXIO)
        reasons = {errno.ELOOP: "symbolic_link", errno.ENXIO: "not_a_regular_file"}
        found.skip(reasons.get(exc.errno or 0, "unreadable"), relative)
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # FIFO, device, socket: never read
            found.skip("not_a_regular_file", relative)
            return
        room = min(limits.max_file_bytes, limits.max_total_bytes - found.total_bytes)
        raw = _read_at_most(fd, limits.max_file_bytes + 1)
    except OSError as exc:
        found.skip("unreadable", f"{relative} ({_os_problem(exc)})")
        return
    finally:
        os.close(fd)
    if len(raw) > limits.max_file_bytes:
        found.skip("larger_than_max_file_bytes", relative)
    elif len(raw) > room:
        found.skip("over_max_total_bytes", relative)
        found.full = True
    elif any(marker in raw for marker in SECRET_MARKERS):
        found.skip("secret_looking_content", relative)
    else:
        text = _text_of(raw)
        if text is None or not text.strip():
            found.skip("binary_or_empty", relative)
            return
        found.total_bytes += len(raw)
        found.files.append(TextFile(relative, text))


def _read_at_most(fd: int, size: int) -> bytes:
    parts: list[bytes] = []
    left = size
    while left > 0:
        chunk = os.read(fd, min(left, 65536))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _text_of(raw: bytes) -> str | None:
    """``raw`` as UTF-8 text, or None when it looks binary."""
    if b"\x00" in raw[:8192]:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
