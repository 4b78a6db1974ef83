"""Three station PROCESSES (real ``macula-relay`` subprocesses on loopback), B and C joining
through A with ``--peer`` (issue 37): a publish on C reaches a subscriber on B, and a call from
B reaches a procedure served on C, soon after C starts.

Discovery runs at its default 30 s interval, so the old code (B and C learning each other at
the next discovery round) fails the deadline below; the mesh's station lists
(``relay.federation.mesh_roster``) make it. The deadline is generous for a slow machine and
still far under the interval; how long the join takes is measured by
``scripts/bench_mesh.py --join``, not asserted here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from macula.errors import MeshError
from macula.node.node import Node
from support.identities import new_identity
from support.meshkit import REALM
from support.waiting import eventually
from tools.local_station.process import relay_command, relay_environment

pytestmark = pytest.mark.anyio

START_S = 30.0  # a station process prints its endpoint within this (a loaded machine)
DEADLINE_S = 10.0  # C's start -> B hears C and reaches C: far under the 30 s discovery
TOPIC = "joined.process"
PROCEDURE = "org.example.joined_echo_v1"


@contextlib.asynccontextmanager
async def relay(data_dir: Path, *peers: str) -> AsyncIterator[str]:
    """``macula-relay`` on a free loopback port, joining through ``peers``; its endpoint."""
    data_dir.mkdir(mode=0o700, parents=True)
    arguments = ["--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir),
                 "--log-file", str(data_dir / "station.log"), "--log-level", "info"]  # fmt: skip
    for peer in peers:
        arguments += ["--peer", peer]
    with (data_dir / "station.out").open("wb") as sink:
        child = await asyncio.create_subprocess_exec(
            *relay_command(*arguments), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=sink, env=relay_environment(os.environ),
        )  # fmt: skip
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), START_S)
        endpoint = line.decode(errors="replace").strip()
        assert "@" in endpoint, f"{data_dir.name} did not start: {endpoint!r}"
        yield endpoint
    finally:
        if child.returncode is None:
            child.terminate()
            try:
                await asyncio.wait_for(child.wait(), 10)
            except TimeoutError:
                child.kill()
                await child.wait()


def logged(data_dir: Path, text: str) -> bool:
    log = data_dir / "station.log"
    return log.exists() and text in log.read_text(errors="replace")


async def test_b_hears_and_reaches_c_soon_after_c_joins_through_a(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(relay(tmp_path / "a"))
        b = await stack.enter_async_context(relay(tmp_path / "b", a))
        await eventually(lambda: logged(tmp_path / "b", "link up:"), timeout=START_S)
        at_b = await stack.enter_async_context(Node(new_identity(), [b]))
        watch = await at_b.subscribe(REALM, TOPIC)
        await at_b.flush()

        started = loop.time()
        c = await stack.enter_async_context(relay(tmp_path / "c", a))
        at_c = await stack.enter_async_context(Node(new_identity(), [c]))
        await at_c.advertise(REALM, PROCEDURE, lambda call: {"echo": call.payload})
        await at_c.flush()
        left = DEADLINE_S - (loop.time() - started)

        async def heard() -> bool:
            await at_c.publish(REALM, TOPIC, "from C")
            try:
                return (await watch.next(0.2)).payload == "from C"
            except TimeoutError:
                return False

        async def reached() -> bool:
            try:
                answer = await at_b.call(REALM, PROCEDURE, 1, timeout=0.5)
            except MeshError:
                return False  # no route yet: B has not heard C's advert
            return bool(answer == {"echo": 1})

        await eventually(heard, timeout=left, message="B's subscriber never heard C in time")
        left = DEADLINE_S - (loop.time() - started)
        await eventually(reached, timeout=left, message="B's call never reached C in time")
        assert logged(tmp_path / "a", "link up:")
        assert not logged(tmp_path / "c", "Traceback")
