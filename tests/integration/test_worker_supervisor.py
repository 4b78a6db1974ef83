"""``relay.workers.supervisor.Supervisor`` over real child processes (tiny Python workers that
print their line, then do what the test asks): the endpoint is announced once every worker
is up, a crashed worker is started again, SIGHUP is passed on, a worker that fails before
the station is up ends the start with its exit code, one that ends by itself stops it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from relay.ops.sdnotify import Notifier
from relay.workers.supervisor import Supervisor
from support.waiting import eventually

pytestmark = pytest.mark.anyio

WORKER = """
import signal, sys
mode, marks = sys.argv[1], sys.argv[2]
def mark(text):
    with open(marks, "a") as out:
        out.write(text + "\\n")
if mode == "fail":
    sys.exit(3)
signal.signal(signal.SIGHUP, lambda *_: mark("hup"))
signal.signal(signal.SIGTERM, lambda *_: (mark("term"), sys.exit(0)))
print("up", flush=True)
mark("up")
if mode == "end":  # only once the first worker can hear SIGTERM (its "up" is after its handler)
    import os, time
    first, deadline = os.path.join(os.path.dirname(marks), "w0"), time.monotonic() + 20
    while not (os.path.exists(first) and "up" in open(first).read().split()):
        if time.monotonic() > deadline:
            sys.exit(4)
        time.sleep(0.01)  # polling interval of a condition with a deadline (a child process)
    sys.exit(0)
while True:
    signal.pause()
"""


def _commands(tmp_path: Path, *modes: str) -> list[list[str]]:
    return [
        [sys.executable, "-c", WORKER, mode, str(tmp_path / f"w{i}")]
        for i, mode in enumerate(modes)
    ]


def _marks(tmp_path: Path, index: int) -> list[str]:
    path = tmp_path / f"w{index}"
    return path.read_text().split() if path.exists() else []


def _supervisor(commands: list[list[str]], announced: list[str]) -> Supervisor:
    return Supervisor(
        commands,
        "id@127.0.0.1:1",
        on_ready=lambda: announced.append("ready"),
        environ=dict(os.environ),
        notifier=Notifier(None),
    )


async def test_ready_once_all_are_up_a_crash_is_restarted_sighup_passed_on_then_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    announced: list[str] = []
    supervisor = _supervisor(_commands(tmp_path, "serve", "serve"), announced)
    running = asyncio.create_task(supervisor.run())
    await eventually(lambda: announced == ["ready"], timeout=20)
    crashed = supervisor.processes[1]
    crashed.kill()
    await eventually(lambda: supervisor.restarts == 1, timeout=20)
    await eventually(lambda: _marks(tmp_path, 1).count("up") == 2, timeout=20)
    assert crashed.returncode == -signal.SIGKILL and supervisor.processes[1] is not crashed
    assert capsys.readouterr().out == "id@127.0.0.1:1\n"  # printed once, not again on restart
    os.kill(os.getpid(), signal.SIGHUP)  # the supervisor's handler passes it on
    await eventually(lambda: all("hup" in _marks(tmp_path, i) for i in (0, 1)), timeout=10)
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(running, 20) == 0
    assert all("term" in _marks(tmp_path, i) for i in (0, 1))
    assert announced == ["ready"]


async def test_a_worker_failing_before_the_station_is_up_ends_the_start_with_its_code(
    tmp_path: Path,
) -> None:
    announced: list[str] = []
    supervisor = _supervisor(_commands(tmp_path, "serve", "fail"), announced)
    assert await asyncio.wait_for(supervisor.run(), 20) == 3
    assert announced == [] and supervisor.restarts == 0
    assert all(p.returncode is not None for p in supervisor.processes.values())


async def test_a_worker_ending_by_itself_stops_the_station(tmp_path: Path) -> None:
    announced: list[str] = []
    supervisor = _supervisor(_commands(tmp_path, "serve", "end"), announced)
    assert await asyncio.wait_for(supervisor.run(), 20) == 0
    assert "term" in _marks(tmp_path, 0)  # the other worker was told to stop
    assert supervisor.restarts == 0
