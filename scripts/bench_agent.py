"""What an agent feels: ``mesh_say`` in one ``macula-mcp`` to the other's ``mesh_wait_room``
returning with that message, through two real MCP servers and a real station process.

Agent A and agent B are two ``macula-mcp`` processes on stdio, each driven by the official
``mcp`` SDK client from this process (as a harness drives them), both connected to one station
in a child process on loopback. A opens a room, B joins it. Then, ``--messages`` times: B calls
``mesh_wait_room`` (blocked: nothing unread), A calls ``mesh_say``; the figure is the driver's
clock from sending A's ``tools/call`` to B's call returning with that very message (checked by
``message_id``). Printed: p50, p90, p99, max of that, of ``mesh_say``'s own round trip, and
the CPU each process spent per message (from /proc: the station, both ``macula-mcp``, and the
driver), over the measured messages only (after ``--warmup`` unmeasured ones).

B's wait is sent, then the driver lets ``--settle-ms`` pass before A says (the only way from
outside to know B is blocked, not still arriving); the settle time is outside the figure.

Run: ``uv run python scripts/bench.py agent [--messages 200] [--json PATH]``;
``--presence`` runs the 1,000-agent presence workload instead (``bench_presence``).
``--audit off`` runs both servers with the audit trail off (``MACULA_MCP_NO_AUDIT=1``);
``--audit both`` runs two pairs on one station, one with the trail and one without, their
messages interleaved (which pair goes first alternates), and prints both figures and the
difference of the p50s (issue 39's goal: within 5 %).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_common
from bench_common import child_process, percentile, process_cpu_seconds
from mcp import Client, StdioServerParameters

from macula.config import NO_AUDIT_ENV
from tools.launch import server_command

WAIT_S = 20.0
IDLE_S = 3.0
GOAL_P50_MS = 6.0
GOAL_P99_MS = 12.0


@dataclass
class McpAgent:
    name: str
    client: Client
    pid: int

    async def call(self, tool: str, **args: Any) -> dict[str, Any]:
        result = await self.client.call_tool(tool, args)
        if result.is_error:
            raise RuntimeError(f"{self.name} {tool}: {result.structured_content}")
        return dict(result.structured_content or {})


def child_pids() -> set[int]:
    """This process's children now (Linux: /proc/self/task/*/children)."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids |= {int(p) for p in (task / "children").read_text().split()}
    return pids


@contextlib.asynccontextmanager
async def spying(out: Path | None, pids: dict[str, int]) -> AsyncIterator[None]:
    """While inside: ``py-spy record`` on each process (raw collapsed stacks, 250 Hz, to
    ``out/NAME.txt``; py-spy comes from ``uv run --with py-spy``), or nothing without ``out``."""
    program = shutil.which("py-spy")
    if out is None:
        yield
        return
    if program is None:
        raise bench_common.BenchError("--spy needs py-spy: uv run --with py-spy python ...")
    out.mkdir(parents=True, exist_ok=True)
    record = [program, "record", "--nolineno", "--format", "raw", "-r", "250"]
    spies = [
        await asyncio.create_subprocess_exec(
            *record,
            "-o",
            str(out / f"{name}.txt"),
            "--pid",
            str(pid),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]
    try:
        yield
    finally:
        for proc in spies:
            proc.send_signal(signal.SIGINT)  # py-spy writes its file, then exits
        for proc in spies:
            await proc.wait()


@contextlib.asynccontextmanager
async def mcp_agent(
    name: str, home: Path, endpoint: str, audit: str = "on"
) -> AsyncIterator[McpAgent]:
    """``macula-mcp`` for ``name`` (its own home and identity) on stdio, and its pid; with
    ``audit`` "off" its audit trail is off."""
    env = dict(
        os.environ,
        MACULA_HOME=str(home),
        MACULA_MESH_STATIONS=endpoint,
        MACULA_MCP_IDENTITY=str(home / "id.key"),
        MACULA_MCP_AGENT=name,
    )
    env[NO_AUDIT_ENV] = "1" if audit == "off" else "0"
    argv = server_command()
    before = child_pids()
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    async with Client(params) as client:
        spawned = child_pids() - before
        if len(spawned) != 1:
            raise bench_common.BenchError(f"{name}: expected one child process, saw {spawned}")
        yield McpAgent(name, client, spawned.pop())


async def one_message(
    a: McpAgent, b: McpAgent, room: str, n: int, settle_s: float
) -> tuple[float, float]:
    """One say → wait: (ms from A's say sent to B's wait returned with it, ms of the say)."""
    waiting = asyncio.create_task(b.call("mesh_wait_room", room_topic=room, wait_seconds=WAIT_S))
    await asyncio.sleep(settle_s)  # B's call is in and blocked (outside the figure)
    if waiting.done():
        raise bench_common.BenchError(f"B's wait returned before A said: {waiting.result()}")
    started = time.perf_counter()
    said = await a.call("mesh_say", room_topic=room, text=f"message {n}")
    said_ms = (time.perf_counter() - started) * 1e3
    heard = await waiting
    took_ms = (time.perf_counter() - started) * 1e3
    ids = [m.get("message_id") for m in heard.get("messages", [])]
    if ids != [said["message_id"]]:
        raise bench_common.BenchError(f"B heard {ids}, A said {said['message_id']}")
    return took_ms, said_ms


def summary(name: str, samples: list[float]) -> dict[str, float]:
    figures = {
        "p50": statistics.median(samples),
        "p90": percentile(samples, 0.90),
        "p99": percentile(samples, 0.99),
        "max": max(samples),
    }
    shown = "  ".join(f"{k} {v:7.2f}" for k, v in figures.items())
    print(f"{name:<30} {shown}  ms  ({len(samples)} messages)", flush=True)
    return figures


async def paired_room(a: McpAgent, b: McpAgent) -> str:
    """A room A opened and B joined, B having read all it had."""
    room = str((await a.call("mesh_open_room", purpose="bench"))["room_topic"])
    await b.call("mesh_join_room", room_topic=room)
    await a.call("mesh_wait_room", room_topic=room, wait_seconds=WAIT_S)  # B joined
    while (await b.call("mesh_wait_room", room_topic=room, wait_seconds=0.05))["count"]:
        pass  # B has read all it had
    return room


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    if args.audit == "both":
        return await bench_audit(args)
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        async with (
            child_process("serve-station", "1800", ready="endpoint") as station,
            mcp_agent("bench-a", Path(tmp) / "a", station.said, args.audit) as a,
            mcp_agent("bench-b", Path(tmp) / "b", station.said, args.audit) as b,
        ):
            print(f"station {station.pid}, agent A {a.pid}, agent B {b.pid}", flush=True)
            room = await paired_room(a, b)
            for n in range(args.warmup):
                await one_message(a, b, room, n, args.settle_ms / 1e3)
            pids = {"station": station.pid, "agent_a": a.pid, "agent_b": b.pid}
            idle = await idle_cpu(pids, IDLE_S)
            async with spying(args.spy, pids):
                return await measured(a, b, room, args, pids) | {"idle_percent_of_core": idle}


async def bench_audit(args: argparse.Namespace) -> dict[str, Any]:
    """Two pairs on one station, the audit trail on in one and off in the other, messages
    interleaved: the same machine, load and moment for both figures."""
    settle = args.settle_ms / 1e3
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        async with (
            child_process("serve-station", "1800", ready="endpoint") as station,
            contextlib.AsyncExitStack() as stack,
        ):
            pairs: dict[str, tuple[McpAgent, McpAgent, str]] = {}
            for mode in ("off", "on"):
                a, b = [
                    await stack.enter_async_context(
                        mcp_agent(
                            f"bench-{side}-{mode}", Path(tmp) / side / mode, station.said, mode
                        )
                    )
                    for side in ("a", "b")
                ]
                pairs[mode] = (a, b, await paired_room(a, b))
            took: dict[str, list[float]] = {"off": [], "on": []}
            for n in range(args.warmup + args.messages):
                for mode in ("off", "on") if n % 2 else ("on", "off"):
                    a, b, room = pairs[mode]
                    latency, _ = await one_message(a, b, room, n, settle)
                    if n >= args.warmup:
                        took[mode].append(latency)
    figures = {mode: summary(f"say → wait, audit {mode}", took[mode]) for mode in ("off", "on")}
    change = 100 * (figures["on"]["p50"] - figures["off"]["p50"]) / figures["off"]["p50"]
    print(f"audit trail on vs off: p50 {change:+.1f}% (goal: within 5%)", flush=True)
    return {"say_to_wait_ms": figures, "p50_change_percent": round(change, 2),
            "messages": args.messages}  # fmt: skip


async def idle_cpu(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """% of a core each process spends with nothing asked of it (heartbeats, probes, ticks):
    the floor under the per-message CPU figures."""
    before = {k: process_cpu_seconds(p) for k, p in pids.items()}
    await asyncio.sleep(seconds)
    idle = {
        k: round(100 * (process_cpu_seconds(p) - before[k]) / seconds, 1) for k, p in pids.items()
    }
    print(f"idle CPU over {seconds:.0f} s, % of a core: {idle}", flush=True)
    return idle


async def measured(
    a: McpAgent, b: McpAgent, room: str, args: argparse.Namespace, pids: dict[str, int]
) -> dict[str, Any]:
    cpu0 = {k: process_cpu_seconds(p) for k, p in pids.items()}
    driver0, wall0 = time.process_time(), time.perf_counter()
    took, said = [], []
    for n in range(args.messages):
        latency, say = await one_message(a, b, room, n, args.settle_ms / 1e3)
        took.append(latency)
        said.append(say)
    wall = time.perf_counter() - wall0
    cpu = {k: process_cpu_seconds(p) - cpu0[k] for k, p in pids.items()}
    cpu["driver"] = time.process_time() - driver0
    return report(took, said, cpu, wall, args.messages)


def report(
    took: list[float], said: list[float], cpu: dict[str, float], wall: float, messages: int
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "say_to_wait_ms": summary("say → wait returned", took),
        "say_ms": summary("mesh_say round trip", said),
        "cpu_ms_per_message": {k: round(v / messages * 1e3, 3) for k, v in cpu.items()},
        "cpu_percent_of_core": {k: round(100 * v / wall, 1) for k, v in cpu.items()},
        "messages": messages,
    }
    for name, ms in result["cpu_ms_per_message"].items():
        share = result["cpu_percent_of_core"][name]
        print(f"CPU {name:<26} {ms:7.3f} ms per message ({share:5.1f}% of a core)", flush=True)
    p50, p99 = result["say_to_wait_ms"]["p50"], result["say_to_wait_ms"]["p99"]
    print(
        f"goal p50 <= {GOAL_P50_MS} ms: {'met' if p50 <= GOAL_P50_MS else 'no'}; "
        f"p99 <= {GOAL_P99_MS} ms: {'met' if p99 <= GOAL_P99_MS else 'no'}",
        flush=True,
    )
    return result


def main(argv: Sequence[str] | None = None) -> None:
    arguments = bench_common.parser("agent", __doc__)
    arguments.add_argument("--messages", type=int, default=200)
    arguments.add_argument("--warmup", type=int, default=10)
    arguments.add_argument("--settle-ms", type=float, default=30.0)
    arguments.add_argument("--quick", action="store_true", help="20 messages: a smoke run")
    arguments.add_argument("--json", type=Path, help="write the figures to this file")
    arguments.add_argument("--spy", type=Path, help="py-spy every process, stacks in this dir")
    arguments.add_argument(
        "--presence", action="store_true", help="the 1,000 present agents workload instead"
    )
    arguments.add_argument(
        "--audit",
        choices=("on", "off", "both"),
        default="on",
        help="the agents' audit trail (both: a pair with it and a pair without, interleaved)",
    )
    args, rest = arguments.parse_known_args(argv)
    if args.presence:
        import bench_presence

        shared = [
            *(["--quick"] if args.quick else []),
            *(["--json", str(args.json)] if args.json else []),
        ]
        bench_presence.main([*rest, *shared])
        return
    if rest:
        arguments.error(f"unrecognised arguments: {' '.join(rest)}")
    if args.quick:
        args.messages, args.warmup = 20, 3
    result = asyncio.run(bench(args))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":  # run through the one entry point: python scripts/bench.py agent
    raise SystemExit(f"{__file__}: run it as `python scripts/bench.py agent ...`")
