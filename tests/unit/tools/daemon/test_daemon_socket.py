"""Where the daemon's socket lives: length checked, folder private, a live socket never removed."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.daemon import unix_socket as ds
from tools.settings import MAX_SOCKET_PATH, SOCKET_ENV, SocketSetupError, check_length, socket_path


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path (pytest's tmp_path may be too long for AF_UNIX)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mds-", dir="/tmp") as folder:
        yield Path(folder)


def test_the_default_socket_is_in_the_home(tmp_path: Path) -> None:
    assert socket_path({"MACULA_HOME": "/h"}) == Path("/h/daemon/mcp.sock")
    assert socket_path({"MACULA_HOME": "/h", SOCKET_ENV: "/s/x.sock"}) == Path("/s/x.sock")


def test_a_socket_path_too_long_names_the_setting_that_shortens_it() -> None:
    home = "/tmp/" + "h" * 120
    with pytest.raises(SocketSetupError) as raised:
        socket_path({"MACULA_HOME": home})
    message = str(raised.value)
    assert SOCKET_ENV in message and "longer than a Unix socket allows" in message
    with pytest.raises(SocketSetupError, match=SOCKET_ENV):
        socket_path({SOCKET_ENV: "/tmp/" + "s" * 200})
    with pytest.raises(SocketSetupError, match="empty"):
        socket_path({SOCKET_ENV: ""})


def test_the_longest_allowed_path_binds(short_dir: Path) -> None:
    name = "s" * (MAX_SOCKET_PATH - len(str(short_dir)) - 1)
    path = short_dir / name
    check_length(path)
    ds.bind(path).close()
    with pytest.raises(SocketSetupError):
        check_length(short_dir / (name + "x"))


def test_the_default_folder_is_made_private(short_dir: Path) -> None:
    home = short_dir / "home"
    env = {"MACULA_HOME": str(home)}
    sock = socket_path(env)
    ds.prepare_folder(sock, env)
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    sock.parent.chmod(0o755)
    ds.prepare_folder(sock, env)  # tightened again
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700


def test_a_named_folder_open_to_others_is_refused(short_dir: Path) -> None:
    shared = short_dir / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    env = {SOCKET_ENV: str(shared / "m.sock")}
    with pytest.raises(SocketSetupError, match=SOCKET_ENV):
        ds.prepare_folder(socket_path(env), env)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o777  # not changed behind the user's back
    fresh = {SOCKET_ENV: str(short_dir / "mine" / "m.sock")}
    ds.prepare_folder(socket_path(fresh), fresh)
    assert stat.S_IMODE((short_dir / "mine").stat().st_mode) == 0o700


def test_the_socket_is_0600(short_dir: Path) -> None:
    listener = ds.bind(short_dir / "m.sock")
    try:
        assert stat.S_IMODE((short_dir / "m.sock").stat().st_mode) == 0o600
    finally:
        listener.close()


def test_a_dead_socket_file_is_replaced(short_dir: Path) -> None:
    sock = short_dir / "m.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(sock))  # a crashed daemon's leftover: the file stays, nothing listens
    dead.close()
    assert sock.exists() and not ds.answers(sock)
    lock = ds.acquire_lock(sock)
    try:
        ds.claim_socket(sock)
        assert not sock.exists()
        listener = ds.bind(sock)
        assert ds.answers(sock)
        listener.close()
    finally:
        lock.close()


def test_a_live_socket_is_never_removed(short_dir: Path) -> None:
    sock = short_dir / "m.sock"
    live = ds.bind(sock)  # someone answers here without our lock
    try:
        lock = ds.acquire_lock(sock)
        try:
            with pytest.raises(ds.DaemonRunningError, match="left in place"):
                ds.claim_socket(sock)
        finally:
            lock.close()
        assert sock.exists() and ds.answers(sock)
    finally:
        live.close()


def test_something_else_at_the_socket_path_is_not_removed(short_dir: Path) -> None:
    sock = short_dir / "m.sock"
    sock.write_text("precious")
    lock = ds.acquire_lock(sock)
    try:
        with pytest.raises(SocketSetupError, match="not a socket"):
            ds.claim_socket(sock)
    finally:
        lock.close()
    assert sock.read_text() == "precious"


def test_the_lock_admits_one_daemon_and_frees_on_close(short_dir: Path) -> None:
    sock = short_dir / "m.sock"
    ds.pid_path(sock).write_text(f"{os.getpid()}\n")
    first = ds.acquire_lock(sock)
    with pytest.raises(ds.DaemonRunningError, match=str(os.getpid())):
        ds.acquire_lock(sock)  # flock is per open file: a second open conflicts
    first.close()
    ds.acquire_lock(sock).close()
    assert stat.S_IMODE(ds.lock_path(sock).stat().st_mode) == 0o600
    assert ds.read_pid(sock) == os.getpid()
    ds.pid_path(sock).write_text("garbage")
    assert ds.read_pid(sock) is None


def test_attach_forwards_both_ways_and_stdin_closing_detaches() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tools.daemon.attach import forward

    ours, daemon = socket.socketpair()
    daemon.settimeout(10)
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    os.write(stdin_w, b'{"id":1}\n')
    os.close(stdin_w)  # the harness wrote one line and exited
    with ThreadPoolExecutor(1) as pool:
        forwarding = pool.submit(forward, ours, b"early\n", stdin=stdin_r, stdout=stdout_w)
        seen = b""
        while not seen.endswith(b"\n"):
            seen += daemon.recv(100)
        assert seen == b'{"id":1}\n'
        assert daemon.recv(100) == b""  # stdin's end reached the daemon as EOF: detached
        daemon.sendall(b'{"id":1,"result":{}}\n')
        daemon.close()
        assert forwarding.result(timeout=10) is True
    os.close(stdout_w)
    assert os.read(stdout_r, 1000) == b'early\n{"id":1,"result":{}}\n'


def test_attach_reports_the_daemon_closing_first() -> None:
    from tools.daemon.attach import forward

    ours, daemon = socket.socketpair()
    stdin_r, stdin_w = os.pipe()  # the harness keeps stdin open
    stdout_r, stdout_w = os.pipe()
    daemon.close()
    try:
        assert forward(ours, b"", stdin=stdin_r, stdout=stdout_w) is False
    finally:
        os.close(stdin_w)
        for fd in (stdin_r, stdout_r, stdout_w):
            os.close(fd)
