"""relay.ops.sdnotify: addresses, the watchdog interval, datagrams on a real AF_UNIX socket."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from relay.ops.sdnotify import Notifier, socket_address, watchdog_interval_s


def test_an_at_sign_is_an_abstract_socket() -> None:
    assert socket_address("@sd-notify") == b"\0sd-notify"
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"


def test_watchdog_interval_is_half_and_only_for_this_process() -> None:
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000"}, 7) == 15.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "7"}, 7) == 15.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "8"}, 7) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "0"}, 7) is None
    assert watchdog_interval_s({}, 7) is None


def test_without_notify_socket_nothing_is_sent() -> None:
    notifier = Notifier.from_environment({})
    assert not notifier.enabled and notifier.ready("x") is False


def test_fields_arrive_as_lines(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(5)
        notifier = Notifier.from_environment({"NOTIFY_SOCKET": str(path)})
        assert notifier.ready("serving") is True
        lines = sock.recv(4096).decode().splitlines()
        assert lines == ["READY=1", "STATUS=serving", f"MAINPID={os.getpid()}"]
        assert notifier.stopping() is True
        assert sock.recv(4096).decode().splitlines() == ["STOPPING=1", "STATUS=stopping"]


def test_a_missing_socket_is_logged_not_raised(tmp_path: Path) -> None:
    notifier = Notifier(str(tmp_path / "absent"))
    assert notifier.watchdog() is False and notifier.watchdog() is False
