"""Where the daemon listens and how one daemon per ``MACULA_HOME`` is guaranteed.

Files: ``$MACULA_HOME/daemon/mcp.sock`` (or ``MACULA_MCP_SOCKET``), and beside it
``mcp.sock.lock`` (held with ``fcntl.flock`` by the running daemon for its whole life) and
``mcp.sock.pid``.

Invariants:
- light: standard library only (``attach`` resolves the socket without the mesh library);
  where the socket is (``home_dir``, ``socket_path``) is a setting: ``tools.settings``;
- the socket's folder is 0700 (the default one is created or tightened so; a folder named by
  ``MACULA_MCP_SOCKET`` must already be this user's and closed to others, or it is created);
  the socket is 0600;
- a socket file is removed only by the holder of the lock, and only when nothing answers a
  connect on it: a live daemon's socket is never removed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from tools.settings import HOME_ENV, SOCKET_ENV, SocketSetupError


class DaemonRunningError(SocketSetupError):
    """Another live process holds the lock or answers on the socket."""


def lock_path(sock: Path) -> Path:
    return sock.with_name(sock.name + ".lock")


def pid_path(sock: Path) -> Path:
    return sock.with_name(sock.name + ".pid")


def prepare_folder(sock: Path, env: Mapping[str, str]) -> None:
    """Make the socket's folder exist, this user's, 0700 (see the module docstring)."""
    folder = sock.parent
    named = env.get(SOCKET_ENV) is not None
    try:
        folder.mkdir(mode=0o700, parents=not named, exist_ok=True)
        info = folder.stat()
    except OSError as exc:
        where = SOCKET_ENV if named else HOME_ENV
        raise SocketSetupError(f"{where}: cannot create {folder}: {exc.strerror}") from None
    if info.st_uid != os.getuid():
        raise SocketSetupError(f"{SOCKET_ENV}: {folder} belongs to another user")
    if stat.S_IMODE(info.st_mode) & 0o077:
        if named:
            raise SocketSetupError(
                f"{SOCKET_ENV}: {folder} is open to other users; use a folder of your own "
                f"(mkdir -m 700)"
            )
        folder.chmod(0o700)


def answers(sock: Path, timeout: float = 1.0) -> bool:
    """Whether something accepts a connection on ``sock`` now."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout)
    try:
        probe.connect(str(sock))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def read_pid(sock: Path) -> int | None:
    try:
        text = pid_path(sock).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def acquire_lock(sock: Path) -> IO[str]:
    """The daemon's lock, held until the returned file is closed (or the process dies);
    ``DaemonRunningError`` when another process holds it."""
    handle = open(lock_path(sock), "a+")  # noqa: SIM115 (held for the daemon's life)
    os.chmod(handle.fileno(), 0o600)
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            pid = read_pid(sock)
            raise DaemonRunningError(
                f"a daemon already runs for this socket ({sock}; pid {pid or 'unknown'})"
            ) from None
        raise
    return handle


def claim_socket(sock: Path) -> None:
    """With the lock held: remove a stale socket file (nothing answers on it); refuse when
    something live answers, leaving its socket in place."""
    if not (sock.exists() or sock.is_symlink()):
        return
    if not stat.S_ISSOCK(sock.lstat().st_mode):
        raise SocketSetupError(f"{SOCKET_ENV}: {sock} exists and is not a socket")
    if answers(sock):
        raise DaemonRunningError(
            f"another process answers on {sock} without holding {lock_path(sock).name}: "
            f"left in place; stop it or set {SOCKET_ENV} elsewhere"
        )
    sock.unlink()


def bind(sock: Path) -> socket.socket:
    """A listening socket at ``sock``, 0600 from its creation."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(0o177)
    try:
        listener.bind(str(sock))
    except OSError:
        listener.close()
        raise
    finally:
        os.umask(previous)
    os.chmod(sock, 0o600)
    listener.listen(64)
    return listener
