"""How fast a harness gets its answers.

First byte of the answer to the opening request (``--first``, the default): spawn -> the first
line of the answer to ``server/discover`` (Claude Code's probe; its budget is about 2 s, our
goal 1 s) and to ``initialize``, p50/p95 over ``--ttfb-runs`` spawns, for plain ``macula-mcp``
and ``macula-mcp attach``, cold (no daemon, no local station: both stopped before each spawn;
the home was used once, so its handshake card exists) and warm (station, and for attach the
daemon, running). Also one first-ever spawn in a new home (no card yet).

Then (``--lists``) spawn -> first ``tools/list`` answered, p50 over runs, three ways against a
station on loopback (in this process): warm attach, cold attach (the attach starts the
daemon) and plain ``macula-mcp``, with the official SDK client.

Run: ``uv run python scripts/bench.py attach [--ttfb-runs N] [--runs N] [--only first|lists]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_common
from mcp import Client, StdioServerParameters

from relay.station.station import Station, StationConfig
from tools.launch import server_command


async def first_list(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    async with Client(params) as client:
        tools = await client.list_tools()
        took = time.perf_counter() - started
    assert tools.tools, "no tools listed"
    return took


def stop_daemon(env: dict[str, str]) -> None:
    subprocess.run(
        [*server_command(), "daemon", "stop"], env=env, capture_output=True, timeout=60, check=True
    )


def line(name: str, samples: list[float]) -> str:
    return (
        f"{name:<34} p50 {statistics.median(samples):6.3f} s   min {min(samples):6.3f} s   "
        f"max {max(samples):6.3f} s   ({len(samples)} runs)"
    )


async def bench(runs: int, home: Path) -> list[str]:
    async with Station(StationConfig(data_dir=home / "station", port=0)) as station:
        env = dict(
            os.environ,
            MACULA_HOME=str(home / "h"),
            MACULA_MESH_STATIONS=station.endpoint,
            MACULA_MCP_AGENT="bench",
        )
        attach = [*server_command(), "attach"]
        cold, warm, plain = [], [], []
        try:
            for _ in range(runs):
                cold.append(await first_list(attach, env))  # starts the daemon
                warm.append(await first_list(attach, env))  # daemon up, agent hosted
                for _ in range(2):
                    warm.append(await first_list(attach, env))
                await asyncio.to_thread(stop_daemon, env)
            plain_env = dict(env, MACULA_HOME=str(home / "plain"))
            for _ in range(runs):
                plain.append(await first_list(server_command(), plain_env))
        finally:
            await asyncio.to_thread(stop_daemon, env)
    return [
        line("warm attach -> first tools/list", warm),
        line("cold attach (starts the daemon)", cold),
        line("plain macula-mcp", plain),
    ]


OPENING: dict[str, dict[str, Any]] = {
    "server/discover": {
        "jsonrpc": "2.0", "id": "server-discover-probe-1", "method": "server/discover",
        "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }},
    },
    "initialize": {
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "bench", "version": "0"}},
    },
}  # fmt: skip


def first_byte(argv: list[str], env: dict[str, str], method: str) -> float:
    """Seconds from spawn to the first line of the answer to the opening ``method``."""
    started = time.perf_counter()
    child = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(json.dumps(OPENING[method]).encode() + b"\n")
    child.stdin.flush()
    answer = child.stdout.readline()
    took = time.perf_counter() - started
    child.stdin.close()
    child.wait(120)
    assert json.loads(answer)["id"] == OPENING[method]["id"], answer[:200]
    return took


def stop_all(env: dict[str, str]) -> None:
    for args in (["daemon", "stop"], ["station", "stop"]):
        subprocess.run([*server_command(), *args], env=env, capture_output=True, timeout=60)


def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def first_lines(runs: int, home: Path) -> None:
    for form, extra in (("plain", []), ("attach", ["attach"])):
        env = dict(os.environ, MACULA_HOME=str(home / form), MACULA_MCP_AGENT="bench")
        env.pop("MACULA_MESH_STATIONS", None)
        argv = [*server_command(), *extra]
        for method in OPENING:
            new = dict(env, MACULA_HOME=str(home / f"{form}-new-{method.replace('/', '-')}"))
            first = first_byte(argv, new, method)
            stop_all(new)
            print(f"{form:<6} {method:<15} first spawn in a new home   {first:6.3f} s", flush=True)
        first_byte(argv, env, "initialize")  # the home's first use: its card is learned
        for temperature in ("cold", "warm"):
            for method in OPENING:
                samples = []
                for _ in range(runs):
                    if temperature == "cold":
                        stop_all(env)
                    samples.append(first_byte(argv, env, method))
                print(
                    f"{form:<6} {method:<15} {temperature} first byte  p50 "
                    f"{statistics.median(samples):6.3f} s  p95 {p95(samples):6.3f} s  "
                    f"max {max(samples):6.3f} s  ({runs} spawns; goal 1 s)",
                    flush=True,
                )
        stop_all(env)


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_common.parser("attach", __doc__)
    parser.add_argument("--runs", type=int, default=5, help="cold and plain runs (warm: 3x)")
    parser.add_argument("--ttfb-runs", type=int, default=10, help="spawns per first-byte figure")
    parser.add_argument("--only", choices=["first", "lists"], help="one of the two benches")
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="mba-", dir="/tmp"))  # short: the socket must fit
    try:
        if args.only != "lists":
            first_lines(max(1, args.ttfb_runs), home / "f")
        if args.only != "first":
            for text in asyncio.run(bench(max(1, args.runs), home)):
                print(text)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"(python {sys.version.split()[0]}, {os.cpu_count()} cpus, load {load:.1f})")


if __name__ == "__main__":  # run through the one entry point: python scripts/bench.py attach
    raise SystemExit(f"{__file__}: run it as `python scripts/bench.py attach ...`")
