"""What every benchmark module shares: argument parsing, timing, percentiles, printing, the
adapter protocols, figures, limits and child processes (``scripts/bench.py`` runs them all).

Invariants: every system is driven through ``Broker``/``Client``/``Inbox`` only; a ``Figure``'s
``key`` is the same for every system measuring the same thing (ratios pair them up by key); a
child process announces readiness with one stdout line and is ended by closing its stdin (then
killed after a bound), so no run leaves a process behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

PROCEDURE = "org.example.bench_echo_v1"
PAYLOAD_SIZE = 128
PROBE = b"?"  # readiness probes; every measured payload is PAYLOAD_SIZE bytes long
YIELD_EVERY = 100
SUB_BUFFER = 100_000
IN_FLIGHT = 50
CALL_TIMEOUT = 10.0
SCRIPT = Path(__file__).resolve().parent / "bench.py"  # child processes: ``bench.py station``


class BenchError(Exception):
    """A workload could not be set up (subscriptions or procedure never became active)."""


@dataclass(frozen=True)
class Limits:
    messages: int  # pub/sub 1:1
    fanout_subscribers: int
    fanout_messages: int  # per subscriber
    calls: int  # sequential, 1 in flight
    parallel_calls: int  # IN_FLIGHT in flight
    connects: int
    latency_samples: int
    phase_seconds: float  # upper bound on each measured phase
    content_bytes: int  # put + get through the station; the raw aioquic stream moves as much
    idle_connections: int  # station RSS before/after this many idle connections


MIB = 1024 * 1024
FULL = Limits(20_000, 50, 2_000, 2_000, 10_000, 50, 2_000, 60.0, 16 * MIB, 1_000)
QUICK = Limits(400, 5, 40, 50, 200, 3, 50, 10.0, MIB // 4, 10)


class Inbox(Protocol):
    @property
    def dropped(self) -> int: ...

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def next(self, timeout: float) -> bytes: ...


class Client(Protocol):
    async def publish(self, topic: str, payload: bytes) -> None: ...

    async def subscribe(self, topic: str) -> Inbox: ...

    async def call(self, payload: bytes, timeout: float) -> bytes: ...

    async def serve(self) -> None: ...


class Broker(Protocol):
    name: str

    def connect(self) -> contextlib.AbstractAsyncContextManager[Client]: ...


@dataclass(frozen=True)
class Figure:
    key: str  # same key for every system: the ratios pair them up
    label: str
    value: float
    unit: str  # a rate ("…/s") is better higher, a time or a size better lower
    note: str = ""


def parser(command: str, doc: str | None) -> argparse.ArgumentParser:
    """The argument parser of ``bench.py COMMAND``, described by its module's first doc line."""
    return argparse.ArgumentParser(
        prog=f"bench.py {command}", description=(doc or "").split("\n")[0] or None
    )


def show(system: str, figure: Figure) -> None:
    value = f"{figure.value:>12,.1f}" if figure.value < 100 else f"{figure.value:>12,.0f}"
    print(f"{system:<8}{figure.label:<38} {value} {figure.unit:<13} {figure.note}", flush=True)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def elapsed_since(start: float) -> float:
    return time.perf_counter() - start


def best_cpu_seconds(rounds: int, prepare: Callable[[], Callable[[], object]]) -> float:
    """The least CPU time (``process_time``) of ``rounds`` runs, each of a fresh ``prepare()``.

    Preparing is not timed; the smallest figure is the one least disturbed by other processes.
    """
    best = float("inf")
    for _ in range(rounds):
        work = prepare()
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best


def cpu_us(work: Callable[[], object], iterations: int, rounds: int) -> float:
    """µs of CPU per call of ``work``: warmed once, best of ``rounds`` runs of ``iterations``."""

    def repeat() -> None:
        for _ in range(iterations):
            work()

    work()
    return best_cpu_seconds(rounds, lambda: repeat) / iterations * 1e6


TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of another process so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Child:
    pid: int
    said: str  # the rest of its readiness line


@contextlib.asynccontextmanager
async def child_process(mode: str, *args: str, ready: str) -> AsyncIterator[Child]:
    """``bench.py station --MODE ARGS`` in a child process, until its stdin closes.

    It prints ``READY REST`` once serving; anything else (or nothing within 30 s) fails.
    """
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SCRIPT),
        "station",
        f"--{mode}",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30.0)
        if not line.startswith(ready.encode() + b" "):
            raise BenchError(f"{mode} process said {line!r}")
        yield Child(proc.pid, line.decode().split(" ", 1)[1].strip())
    finally:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def serve_until_stdin_closes(seconds: float) -> None:
    """In a child: return when the parent closes our stdin, or after ``seconds``."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(reader.read(), seconds)


def rss_kib(pid: int) -> int:
    """Resident set size of a process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise BenchError(f"no VmRSS for process {pid}")
