"""Shared harness of the two-process live checks (scripts/*-two-process-check.py).

Real processes only: a station (``macula-relay`` on a free loopback port, unless ``--station``
names one) and two client processes, each with its own identity, driven over stdin/stdout with
one JSON object per line. The orchestrator prints one line per check and ``N/M checks passed``
and exits 0 only if every check passed.

Run as a child: ``python scripts/livecheck.py child --station EP --key FILE``; commands on stdin
(``{"op": "publish", ...}``), answers on stdout (``{"ok": 1, ...}`` / ``{"ok": 0, "error": ...}``),
asynchronous deliveries as ``{"event": ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHECK_REALM = "org.macula.livecheck"


# --- orchestrator side ----------------------------------------------------------------------


class Checks:
    def __init__(self) -> None:
        self.passed = 0
        self.total = 0

    def check(self, label: str, ok: bool, detail: str = "") -> bool:
        self.total += 1
        self.passed += ok
        mark = "ok  " if ok else "FAIL"
        print(f"[{mark}] {label}" + (f" ({detail})" if detail else ""), flush=True)
        return ok

    def finish(self) -> int:
        print(f"{self.passed}/{self.total} checks passed", flush=True)
        return 0 if self.passed == self.total and self.total else 1


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalStation:
    """A ``macula-relay`` subprocess on loopback that can be restarted on the same port/key."""

    def __init__(self, workdir: Path) -> None:
        self.data_dir = workdir / "station"
        self.port = free_udp_port()
        self.process: subprocess.Popen[str] | None = None
        self.endpoint = ""

    def start(self, timeout: float = 20.0) -> str:
        command = [sys.executable, "-m", "relay.ops.cli", "--port", str(self.port),
                   "--data-dir", str(self.data_dir), "--log-level", "warning"]  # fmt: skip
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline and not line:
            line = self.process.stdout.readline().strip()
            if self.process.poll() is not None:
                break
        if "@" not in line:
            raise RuntimeError(f"station did not start (said {line!r})")
        self.endpoint = line
        return line

    def stop(self) -> int | None:
        if self.process is None:
            return None
        try:
            return terminate(self.process)
        finally:
            self.process = None


def terminate(process: subprocess.Popen[str], timeout: float = 8.0) -> int:
    """SIGTERM, then SIGKILL if it is not gone within ``timeout`` s; its exit code."""
    process.terminate()
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


class Child:
    """One client process with its own identity."""

    def __init__(self, name: str, station: str, workdir: Path) -> None:
        self.name = name
        key = workdir / f"{name}.key"
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "child",
            "--station",
            station,
            "--key",
            str(key),
        ]
        self.process = subprocess.Popen(
            command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.events: list[dict[str, Any]] = []

    def request(self, op: str, timeout: float = 30.0, **args: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.process.stdin.flush()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                return {"ok": 0, "error": f"{self.name} exited"}
            message = json.loads(line)
            if "event" in message:
                self.events.append(message["event"])
                continue
            return dict(message)
        return {"ok": 0, "error": f"{self.name}: no answer to {op} within {timeout:g} s"}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.request("quit", timeout=5)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()


def run_check(body: Callable[[Checks, Any, Path], None], station_arg: str | None) -> int:
    """Start (or use) a station, run ``body(checks, station_or_None_if_external, workdir)``."""
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix="macula-live-") as tmp:
        workdir = Path(tmp)
        station = None if station_arg else LocalStation(workdir)
        try:
            if station is not None:
                station.start()
            checks.check(
                "station reachable", True, station.endpoint if station else station_arg or ""
            )
            body(checks, station, workdir)
        except Exception as exc:  # a crashed harness is a failed check, with the reason
            checks.check("harness ran to the end", False, f"{type(exc).__name__}: {exc}")
        finally:
            if station is not None:
                station.stop()
    return checks.finish()


class ScriptChild:
    """A child process of a check script: ``<script> child --station EP --home DIR [extra]``,
    one JSON command a line on stdin and one JSON answer a line on stdout."""

    def __init__(self, script: str, name: str, station: str, workdir: Path, *extra: str) -> None:
        self.name = name
        self.station = station
        self.home = workdir / name
        self.command = [sys.executable, str(Path(script).resolve()), "child",
                        "--station", station, "--home", str(self.home), *extra]  # fmt: skip
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def request(self, op: str, timeout: float = 30.0, **args: Any) -> dict[str, Any]:
        """One command and its answer (the child bounds its own work; ``timeout`` is unused
        here and kept for the callers' symmetry with ``Child.request``)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            return {"ok": 0, "error": f"{self.name} exited"}
        line = self.process.stdout.readline()
        return dict(json.loads(line)) if line else {"ok": 0, "error": f"{self.name} exited"}

    def kill(self) -> int:
        """SIGKILL: no goodbye, nothing flushed."""
        self.process.kill()
        return self.process.wait(timeout=10)

    def restart(self) -> None:
        self.process = self._spawn()

    def close(self, timeout: float = 10.0) -> None:
        with contextlib.suppress(Exception):
            self.request("quit")
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def check_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--station", help="node_id@host:port of a running station (default: start one)"
    )
    return parser


def check_main(description: str, body: Callable[[Checks, Any, Path, str], None]) -> None:
    """The orchestrator's ``main``: parse ``--station``, run ``body(checks, station, workdir,
    endpoint)`` with :func:`run_check` and exit with its code."""
    args = check_parser(description).parse_args()
    sys.exit(
        run_check(lambda c, s, w: body(c, s, w, s.endpoint if s else args.station), args.station)
    )


def child_args(*extra: str) -> argparse.Namespace:
    """A script child's arguments: ``child --station EP --home DIR`` and ``--<extra>`` each."""
    parser = argparse.ArgumentParser()
    parser.add_argument("role")
    parser.add_argument("--station", required=True)
    parser.add_argument("--home", type=Path, required=True)
    for name in extra:
        parser.add_argument(f"--{name}", required=True)
    return parser.parse_args()


def restart(checks: Checks, station: LocalStation | None) -> bool:
    """Restart our own station mid-check; with an external station there is nothing to do."""
    if station is None:
        return False
    code = station.stop()
    checks.check("station stopped cleanly on SIGTERM", code == 0, f"exit {code}")
    station.start()
    checks.check("station restarted on the same port and key", True, station.endpoint)
    return True


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- child side ----------------------------------------------------------------------------


def emit(message: dict[str, Any]) -> None:
    """One JSON answer line on stdout (a child's only channel back)."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def stdin_lines() -> asyncio.StreamReader:
    """This process's stdin as an asyncio stream."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def serve_ops(
    reader: asyncio.StreamReader,
    ops: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]],
    errors: tuple[type[BaseException], ...],
    *,
    timeout: float | None = None,
    mesh_codes: bool = False,
) -> None:
    """Answer commands until ``quit`` or end of input: ``{"ok": 1, **op(command)}``, or
    ``{"ok": 0, "error": ...}`` for one of ``errors`` (with the mesh error's ``code`` when
    ``mesh_codes``); each op bounded by ``timeout`` seconds when given."""
    from macula.errors import MeshError

    while line := await reader.readline():
        command = json.loads(line)
        op = command.pop("op")
        if op == "quit":
            emit({"ok": 1})
            break
        try:
            emit({"ok": 1, **(await asyncio.wait_for(ops[op](command), timeout))})
        except errors as exc:
            if mesh_codes and isinstance(exc, MeshError):
                emit({"ok": 0, "error": str(exc), "code": exc.code})
            else:
                emit({"ok": 0, "error": f"{type(exc).__name__}: {exc}"})


def plain(value: Any) -> Any:
    """Dataclasses as dicts, bytes as hex, lists element by element (for JSON lines)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


async def _child(station: str, key: Path) -> None:
    from macula.errors import MaculaError, MeshError
    from macula.keyfile import load_or_create_identity
    from macula.node.node import Node
    from macula.node.serving import IncomingCall
    from macula.node.subscriptions import Subscription
    from macula.wire.identity import realm_tag

    realm = realm_tag(CHECK_REALM)
    identity = load_or_create_identity(key)
    node = Node(identity, [station])
    states: list[str] = []
    node.on_state(states.append)
    reader = await stdin_lines()
    tasks: set[asyncio.Task[None]] = set()

    async def pump(topic: str, sub: Subscription) -> None:
        async for delivery in sub:
            emit(
                {
                    "event": {
                        "topic": topic,
                        "seq": delivery.seq,
                        "payload": delivery.payload,
                        "publisher": delivery.publisher.hex(),
                        "authenticated": int(delivery.authenticated),
                    }
                }
            )

    def echo(call: IncomingCall) -> Any:
        if isinstance(call.payload, dict) and call.payload.get("fail"):
            raise ValueError("asked to fail")
        return {"echo": call.payload, "caller": call.caller.hex()}

    async with node:
        while True:
            line = await reader.readline()
            if not line:
                break
            command = json.loads(line)
            op = command.pop("op")
            try:
                if op == "quit":
                    emit({"ok": 1})
                    break
                if op == "whoami":
                    emit({"ok": 1, "node_id": identity.node_id.hex()})
                elif op == "subscribe":
                    sub = await node.subscribe(realm, command["topic"])
                    task = asyncio.ensure_future(pump(command["topic"], sub))
                    tasks.add(task)
                    await node.flush()  # SUBSCRIBE has no ack (§7.1): the station has it now
                    emit({"ok": 1})
                elif op == "publish":
                    seqs = [
                        await node.publish(realm, command["topic"], {"n": i, "run": command["run"]})
                        for i in range(command["count"])
                    ]
                    emit({"ok": 1, "seqs": seqs})
                elif op == "advertise":
                    await node.advertise(realm, command["procedure"], echo)
                    await node.flush()
                    emit({"ok": 1})
                elif op == "call":
                    result = await node.call(
                        realm,
                        command["procedure"],
                        command["payload"],
                        timeout=command.get("timeout", 10),
                    )
                    emit({"ok": 1, "result": result})
                elif op == "put":
                    data = os.urandom(command["size"])
                    mcid = await node.put_content(data, name=command.get("name", "livecheck.bin"))
                    emit({"ok": 1, "mcid": mcid.hex(), "sha256": sha256_hex(data)})
                elif op == "get":
                    data = await node.get_content(bytes.fromhex(command["mcid"]))
                    emit({"ok": 1, "size": len(data), "sha256": sha256_hex(data)})
                elif op == "wait_reconnected":
                    deadline = time.monotonic() + command.get("timeout", 45)
                    while "reconnected" not in states and time.monotonic() < deadline:
                        await asyncio.sleep(0.1)  # polling interval: until reconnected
                    await node.session(max(0.1, deadline - time.monotonic()))
                    emit({"ok": int("reconnected" in states), "states": states})
                else:
                    emit({"ok": 0, "error": f"unknown op {op}"})
            except MeshError as exc:
                emit({"ok": 0, "error": str(exc), "code": exc.code})
            except (MaculaError, OSError) as exc:
                emit({"ok": 0, "error": f"{type(exc).__name__}: {exc}"})
        for task in tasks:
            task.cancel()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["child"])
    parser.add_argument("--station", required=True)
    parser.add_argument("--key", type=Path, required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    asyncio.run(_child(args.station, args.key))


if __name__ == "__main__":
    main()
