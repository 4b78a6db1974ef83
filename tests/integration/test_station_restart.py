"""A station process SIGKILLed and started again on the same key, port and data dir: its node
learns from the restarted station's stateless reset that its connection is gone, and is back
at once, its subscription replayed (``macula.quic.resets``; issue 37).

The node's probe is set far apart, so the only news the node can get is the reset: no ping
meets the dead port (an ICMP "port unreachable" would tell it too, and is the other path,
left to ``test_failover``). The station process runs on aioquic whatever this one runs on (a
qh3 station sends no resets); under ``MACULA_QUIC=qh3`` the node is a qh3 client, whose native
core recognises the reset itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from macula.node.node import Node
from macula.quic.backend import ENV as QUIC_ENV
from support.identities import new_identity
from support.meshkit import REALM
from support.paths import SCRIPTS
from support.processkit import station_process

pytestmark = pytest.mark.anyio


async def test_a_node_is_back_by_the_reset_of_its_restarted_station(tmp_path: Path) -> None:
    async with station_process(tmp_path / "station") as station:
        endpoint = station.endpoint
        node = Node(new_identity(), [endpoint], probe_interval_s=60, settle_s=0)
        async with node:
            sub = await node.subscribe(REALM, "restart.news")
            await node.flush()
            await station.kill()  # SIGKILL: no GOODBYE, no CONNECTION_CLOSE
            again = await station.start()
            assert again == endpoint  # same key, same port
            assert node.stats.reconnects == 0  # nothing told the node yet
            # its next packet meets the new process, which answers with a reset; the
            # PUBLISH in flight is confirmed on the next connection
            await node.publish_confirmed(REALM, "restart.news", "after", timeout=15)
            assert node.stats.stateless_resets == 1 and node.stats.reconnects == 1
            assert node.stats.probes_acknowledged == 0  # the probe had no part in it
            assert (await sub.next(5)).payload == "after"  # the subscription replayed
            await node.flush()
            async with Node(new_identity(), [again]) as other:
                await other.publish(REALM, "restart.news", "from another node")
                assert (await sub.next(5)).payload == "from another node"


def test_the_restart_bench_runs_and_tells_how_the_node_learned() -> None:
    """``scripts/bench.py restart`` end to end on one restart (figures are its own business)."""
    script = SCRIPTS / "bench.py"
    env = {k: v for k, v in os.environ.items() if k != QUIC_ENV}
    done = subprocess.run(
        [sys.executable, str(script), "restart", "--runs", "1", "--nodes", "1", "--settle", "0.3"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "restart: 1 of 1 learned by a stateless reset" in done.stdout
    assert "restart: back after the kill in p50" in done.stdout
