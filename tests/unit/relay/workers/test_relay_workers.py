"""``macula-relay --workers N``'s pure parts: the count and its default, a worker's role and
command line, its data dir, its log label, the restart backoff, the workers' environment, and
the link manager dialling another worker that holds this station's node id."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import stat
from pathlib import Path

import pytest

from macula.logformat import JsonFormatter, KeyValueFormatter
from relay.federation.links import LinkManager, LinkTarget
from relay.ops import cli
from relay.ops.options import build_parser
from relay.workers.balancer import (
    MAX_WORKERS,
    WorkerLabel,
    WorkerRole,
    default_count,
    parse_role,
    prepare_worker_dir,
    roles,
    worker_command,
    worker_count,
    worker_log_file,
)
from relay.workers.supervisor import RESTART_MAX_S, restart_delay, worker_environment

ME = bytes([7]) * 32


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_the_default_is_one_on_loopback_and_one_per_core_up_to_the_cap_elsewhere() -> None:
    assert default_count("127.0.0.1", 8) == 1
    assert default_count("localhost", 8) == 1
    assert default_count("::1", 8) == 1
    assert default_count("0.0.0.0", 8) == 1  # opt-in: two workers were slower on 2 cores
    assert default_count("0.0.0.0", 1) == 1
    assert default_count("192.0.2.7", None) == 1  # cores unknown: one
    assert worker_count(_args()) == 1  # --host 127.0.0.1 by default


@pytest.mark.parametrize("value", ["0", "-1", str(MAX_WORKERS + 1), "64"])
def test_a_worker_count_out_of_bounds_is_refused_naming_the_flag(value: str) -> None:
    with pytest.raises(SystemExit, match=rf"--workers must be 1\.\.{MAX_WORKERS}, got {value}"):
        worker_count(_args("--workers", value))


def test_a_worker_count_that_is_not_a_number_is_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        _args("--workers", "two")
    assert "--workers" in capsys.readouterr().err


def test_idle_exit_is_refused_with_several_workers() -> None:
    with pytest.raises(SystemExit, match="--idle-exit-s cannot be used with --workers"):
        worker_count(_args("--workers", "2", "--idle-exit-s", "5"))
    assert worker_count(_args("--workers", "1", "--idle-exit-s", "5")) == 1


def test_main_refuses_a_bad_count_from_the_config_file_naming_its_line(tmp_path: Path) -> None:
    config = tmp_path / "station.toml"
    config.write_text('host = "127.0.0.1"\nworkers = 9\n')
    with pytest.raises(SystemExit) as caught:
        cli.main(["--config", str(config), "--data-dir", str(tmp_path / "d")])
    message = str(caught.value.code)
    assert "--workers must be" in message and "line 2" in message and "'workers'" in message


def test_a_role_round_trips_through_its_flag_and_garbage_is_refused() -> None:
    role = WorkerRole(0, 2, 40001, (40002,))
    assert parse_role(role.flag()) == role
    assert parse_role("1/2:40002:") == WorkerRole(1, 2, 40002, ())
    for bad in ("", "x", "2/2:1:", "0/2:0:", "0/2:1:70000", "0/2:1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_role(bad)


def test_each_pair_of_workers_has_one_link_dialled_by_the_lower_index() -> None:
    assert roles(2, [5001, 5002]) == [WorkerRole(0, 2, 5001, (5002,)), WorkerRole(1, 2, 5002)]
    three = roles(3, [1, 2, 3])
    pairs = {(r.link_port, d) for r in three for d in r.dials}
    assert pairs == {(1, 2), (1, 3), (2, 3)}


def test_a_workers_command_line_overrides_what_differs(tmp_path: Path) -> None:
    argv = ["--workers", "2", "--port", "4433", "--monitor", "127.0.0.1:9100"]
    argv += ["--log-file", str(tmp_path / "relay.log"), "--publish-rate", "7"]
    args = _args(*argv)
    role = WorkerRole(1, 2, 40002)
    command = worker_command(["py"], argv, role, data_dir=tmp_path, port=4433, args=args)
    assert command[0] == "py"
    seen = _args(*command[1:])
    assert seen.workers == 1 and seen.worker_role == role
    assert seen.data_dir == tmp_path / "workers" / "1"
    assert (seen.port, seen.dht_port, seen.publish_rate) == (4433, 0, 7)
    assert seen.monitor == ("127.0.0.1", 9101)  # the base port plus the worker's index
    assert seen.log_file == tmp_path / "relay.worker1.log"
    first = worker_command(
        ["py"], argv, WorkerRole(0, 2, 1), data_dir=tmp_path, port=4433, args=args
    )
    assert _args(*first[1:]).dht_port is None  # the first worker keeps the configured DHT port


def test_the_worker_role_is_no_config_file_key(tmp_path: Path) -> None:
    config = tmp_path / "station.toml"
    config.write_text('worker-role = "0/2:1:2"\n')
    with pytest.raises(SystemExit, match="worker-role"):
        cli.main(["--config", str(config)])


def test_a_worker_dir_holds_private_copies_of_the_key_and_certificate(tmp_path: Path) -> None:
    for name, body in (
        ("station.key", b"k"),
        ("station-cert.pem", b"c"),
        ("station-key.pem", b"p"),
    ):
        (tmp_path / name).write_bytes(body)
    directory = prepare_worker_dir(tmp_path, 1)
    assert directory == tmp_path / "workers" / "1"
    for path in (directory, directory.parent):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    for name in ("station.key", "station-cert.pem", "station-key.pem"):
        copy = directory / name
        assert copy.read_bytes() == (tmp_path / name).read_bytes()
        assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    (tmp_path / "station-cert.pem").write_bytes(b"renewed")
    prepare_worker_dir(tmp_path, 1)
    assert (directory / "station-cert.pem").read_bytes() == b"renewed"
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        ["station.key", "station-cert.pem", "station-key.pem"]
    )


def test_log_lines_say_which_worker_wrote_them() -> None:
    record = logging.LogRecord("macula.relay", logging.INFO, "x", 1, 'said "hi"', None, None)
    assert WorkerLabel(KeyValueFormatter(), 1, False).format(record).startswith("worker=1 ts=")
    line = json.loads(WorkerLabel(JsonFormatter(), 0, True).format(record))
    assert line["worker"] == 0 and line["msg"] == 'said "hi"'
    assert worker_log_file(Path("/var/log/relay.log"), 2) == Path("/var/log/relay.worker2.log")


def test_restarts_back_off_doubling_up_to_the_cap() -> None:
    delays = [restart_delay(n) for n in range(10)]
    assert delays[:4] == [0.5, 1.0, 2.0, 4.0]
    assert delays[-1] == RESTART_MAX_S and delays == sorted(delays)


def test_workers_are_not_given_systemds_notify_socket() -> None:
    given = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "2", "HOME": "/h"}
    assert worker_environment(given) == {"HOME": "/h"}


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_link_manager_dials_a_sibling_that_holds_its_own_node_id(
    anyio_backend: str,
) -> None:
    dialled: list[LinkTarget] = []
    sibling = LinkTarget(ME, "127.0.0.1", 40002)
    itself = LinkTarget(ME, "127.0.0.1", 40003)

    async def run_link(target: LinkTarget) -> None:
        dialled.append(target)
        await asyncio.Event().wait()  # the link stays up

    manager = LinkManager(
        ME, run_link=run_link, has_link=lambda _: False, peers=[itself], siblings=[sibling]
    )
    manager.start()
    for _ in range(100):  # a few loop turns for the task to start
        if dialled:
            break
        await asyncio.sleep(0)  # one loop turn: polled predicate (dialled), bounded above
    await manager.stop()
    assert dialled == [sibling]  # the sibling is dialled; a --peer naming itself is not
