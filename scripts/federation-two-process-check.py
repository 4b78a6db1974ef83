"""Live check: two stations in two processes, linked; one agent on each, talking across the link.

Station A starts a mesh of its own; station B joins it with ``--peer A``. Agent ``west`` sits on
A, agent ``east`` on B (each a process: Node + Agent, its own identity and stores, driven over
stdin/stdout with one JSON object per line). Checks, each with its latency: the link comes up;
pub/sub both ways (every event once, in order, authenticated); RPC both ways (the caller
attested); a ring from west to east and a room conversation both ways (attested); content put
on one station and fetched through the other (verified), and an unknown id is not_found.
Every wait is bounded (``STEP_S``); exits 0 only if every check passed.

``uv run python scripts/federation-two-process-check.py``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from livecheck import (
    CHECK_REALM,
    REPO,
    Checks,
    ScriptChild,
    child_args,
    free_udp_port,
    plain,
    serve_ops,
    sha256_hex,
    stdin_lines,
    terminate,
)

STEP_S = 15.0  # the longest any one step may take (propagation + the work)
COUNT = 10  # events each way
CALLS = 10  # calls each way
TOPIC = "livecheck.federation"
PROCEDURE = "org.macula.livecheck.fed_echo_v1"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


class StationProcess:
    """``macula-relay`` on a free loopback port, optionally joining through ``--peer``."""

    def __init__(self, name: str, workdir: Path, peer: str | None) -> None:
        self.name = name
        self.log = workdir / f"{name}.log"
        self.port = free_udp_port()
        command = [sys.executable, "-m", "relay.ops.cli", "--port", str(self.port),
                   "--dht-port", "0", "--data-dir", str(workdir / name),
                   "--log-level", "info", *(["--peer", peer] if peer else [])]  # fmt: skip
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                command, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True
            )
        self.endpoint = self._first_line(20.0)

    def _first_line(self, timeout: float) -> str:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline and not line and self.process.poll() is None:
            line = self.process.stdout.readline().strip()
        if "@" not in line:
            raise RuntimeError(f"station {self.name} did not start (said {line!r})")
        return line

    def logged(self, text: str) -> bool:
        return text in self.log.read_text(errors="replace")

    def stop(self) -> int:
        return terminate(self.process)


class AgentProcess(ScriptChild):
    """An agent process: ``federation-two-process-check.py child``; JSON lines in and out (the
    child bounds its own work by ``STEP_S``)."""

    def __init__(self, name: str, station: str, workdir: Path) -> None:
        super().__init__(__file__, name, station, workdir)

    def close(self, timeout: float = 8.0) -> None:
        super().close(timeout)


def timed(agent: AgentProcess, op: str, **args: Any) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    answer = agent.request(op, **args)
    return answer, time.monotonic() - started


def pubsub(checks: Checks, publisher: AgentProcess, subscriber: AgentProcess, run: str) -> None:
    label = f"{publisher.name} -> {subscriber.name}"
    subscriber.request("subscribe", topic=TOPIC)
    started = time.monotonic()
    publisher.request("probe", topic=TOPIC, run=run)
    heard = subscriber.request("received", topic=TOPIC, run=f"probe-{run}", count=1)
    took = time.monotonic() - started
    publisher.request("stop_probe", run=run)
    checks.check(
        f"pub/sub {label}: interest crossed the link (a probe event arrived)",
        heard.get("ok") == 1,
        ms(took) if heard.get("ok") == 1 else str(heard)[:160],
    )
    started = time.monotonic()  # from the first publish to the last delivery
    sent = publisher.request("publish", topic=TOPIC, count=COUNT, run=run)
    got = subscriber.request("received", topic=TOPIC, run=run, count=COUNT)
    took = time.monotonic() - started
    events = got.get("events", [])
    checks.check(
        f"pub/sub {label}: {COUNT} events once each, in order, authenticated",
        [e["n"] for e in events] == list(range(COUNT))
        and [e["seq"] for e in events] == sent.get("seqs")
        and all(e["authenticated"] == 1 for e in events),
        f"{len(events)}/{COUNT} in {ms(took)}" + ("" if events else f": {got}"[:160]),
    )


def rpc(checks: Checks, provider: AgentProcess, caller: AgentProcess) -> None:
    label = f"{caller.name} -> {provider.name}"
    provider.request("advertise", procedure=PROCEDURE)
    first, waited = timed(caller, "call_until_served", procedure=PROCEDURE)
    checks.check(
        f"RPC {label}: the advertisement crossed the link",
        first.get("ok") == 1,
        ms(waited) if first.get("ok") == 1 else str(first)[:160],
    )
    answer = caller.request("calls", procedure=PROCEDURE, count=CALLS)
    checks.check(
        f"RPC {label}: {CALLS} calls answered by the other station's agent, caller attested",
        answer.get("good") == CALLS,
        f"{answer.get('good')}/{CALLS}, p50 {answer.get('p50_ms')} ms, "
        f"max {answer.get('max_ms')} ms" + ("" if answer.get("good") else f": {answer}"[:160]),
    )


def agents(checks: Checks, west: AgentProcess, east: AgentProcess, ids: dict[str, str]) -> None:
    rung, took = timed(west, "ring", to=ids["east"], purpose="compare notes across stations")
    checks.check(
        "ring west -> east across stations: answer 1 (accepted), east joined the room",
        rung.get("answer") == 1 and rung.get("joined") == 1,
        ms(took) if rung.get("answer") == 1 else str(rung)[:160],
    )
    room = rung.get("room_topic", "")
    for speaker, listener, text in ((west, east, "is the link up?"), (east, west, "it is")):
        started = time.monotonic()  # from saying it to the listener having it
        said = speaker.request("say", room=room, kind="question_asked", text=text)
        heard = listener.request("wait", room=room, kind="question_asked", sender=ids[speaker.name])
        took = time.monotonic() - started
        message = heard.get("message") or {}
        checks.check(
            f"room {speaker.name} -> {listener.name}: the message arrives, attested",
            said.get("ok") == 1 and message.get("text") == text and message.get("attested") == 1,
            ms(took) if message else str(heard)[:160],
        )


def content(checks: Checks, writer: AgentProcess, reader: AgentProcess) -> None:
    for label, size in (("1 KiB", 1024), ("3 MiB (chunks + manifest)", 3 * 1024 * 1024)):
        put, put_s = timed(writer, "put", size=size)
        got, get_s = timed(reader, "get", mcid=put.get("mcid", ""))
        checks.check(
            f"content {label}: put at {writer.name}'s station, fetched through "
            f"{reader.name}'s, verified",
            got.get("ok") == 1 and got.get("sha256") == put.get("sha256") and got["size"] == size,
            f"put {ms(put_s)}, get {ms(get_s)}" if got.get("ok") == 1 else str(got)[:160],
        )
    bogus = reader.request("get", mcid="0155" + "00" * 32)
    checks.check(
        "content: an id no station holds is a clear not_found error",
        bogus.get("ok") == 0 and "not_found" in str(bogus.get("error")),
        str(bogus.get("error"))[:80],
    )


def body(checks: Checks, workdir: Path) -> None:
    west_station = StationProcess("station_a", workdir, None)
    stations = [west_station]
    children: list[AgentProcess] = []
    try:
        started = time.monotonic()
        east_station = StationProcess("station_b", workdir, west_station.endpoint)
        stations.append(east_station)
        deadline = time.monotonic() + STEP_S
        while time.monotonic() < deadline and not (
            west_station.logged("link up:") and east_station.logged("link up:")
        ):
            time.sleep(0.05)  # polling interval: until both stations log the link
        checks.check(
            "station B joined station A through --peer: the link is up on both sides",
            west_station.logged("link up:") and east_station.logged("link up:"),
            f"{ms(time.monotonic() - started)} from B's start",
        )
        west = AgentProcess("west", west_station.endpoint, workdir)
        east = AgentProcess("east", east_station.endpoint, workdir)
        children += [west, east]
        ids = {c.name: c.request("hello").get("node_id", "") for c in children}
        checks.check(
            "one agent on each station, present, each with its own identity",
            all(ids.values()) and ids["west"] != ids["east"],
        )
        pubsub(checks, west, east, "west-east")
        pubsub(checks, east, west, "east-west")
        rpc(checks, east, west)
        rpc(checks, west, east)
        agents(checks, west, east, ids)
        content(checks, west, east)
        content(checks, east, west)
    finally:
        for child in children:
            child.close()
        for station in reversed(stations):
            code = station.stop()
            checks.check(f"{station.name} stopped cleanly on SIGTERM", code == 0, f"exit {code}")
            if code != 0:
                print(f"  {station.name} exited {code}; its log ends:", flush=True)
                print(station.log.read_text(errors="replace")[-1500:], flush=True)


def run() -> int:
    checks = Checks()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="macula-live-fed-") as tmp:
        try:
            body(checks, Path(tmp))
        except Exception as exc:  # a crashed harness is a failed check, with the reason
            checks.check("harness ran to the end", False, f"{type(exc).__name__}: {exc}")
    print(f"total {time.monotonic() - started:.1f} s", flush=True)
    return checks.finish()


# --- the agent process ----------------------------------------------------------------------


async def _child(station: str, home: Path) -> None:
    from macula.agent.agent import Agent, AgentSettings
    from macula.errors import MaculaError, MeshError
    from macula.keyfile import load_or_create_identity
    from macula.node.node import Node
    from macula.node.serving import IncomingCall
    from macula.node.subscriptions import Subscription
    from macula.wire.identity import realm_tag

    realm = realm_tag(CHECK_REALM)
    home.mkdir(parents=True, exist_ok=True)
    (home / "contact_policy.json").write_text(json.dumps({"contact_policy": "open"}))
    identity = load_or_create_identity(home / "identity.key")
    reader = await stdin_lines()
    received: dict[str, list[dict[str, Any]]] = {}
    arrived = asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()
    probes: dict[str, asyncio.Task[None]] = {}

    async def pump(sub: Subscription) -> None:
        async for delivery in sub:
            payload = delivery.payload if isinstance(delivery.payload, dict) else {}
            event = {"seq": delivery.seq, "authenticated": int(delivery.authenticated), **payload}
            received.setdefault(str(payload.get("run")), []).append(event)
            arrived.set()

    async def until(condition: Any, seconds: float = STEP_S) -> bool:
        deadline = time.monotonic() + seconds
        while not condition():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), min(left, 0.1))
        return True

    def echo(call: IncomingCall) -> Any:
        return {"echo": call.payload, "caller": call.caller.hex()}

    settings = AgentSettings.from_env({"MACULA_HOME": str(home)})
    async with Node(identity, [station]) as node, Agent(node, settings) as agent:

        async def subscribe(a: dict[str, Any]) -> dict[str, Any]:
            sub = await node.subscribe(realm, a["topic"])
            tasks.add(asyncio.ensure_future(pump(sub)))
            await node.flush()
            return {}

        async def probe(a: dict[str, Any]) -> dict[str, Any]:
            """Start publishing a ``probe-<run>`` event every 100 ms (for at most STEP_S) in
            the background: the first to arrive shows that the interest has crossed."""
            run = f"probe-{a['run']}"

            async def publishing() -> None:
                for n in range(int(STEP_S * 10)):
                    await node.publish(realm, a["topic"], {"n": n, "run": run})
                    await asyncio.sleep(0.1)  # probe interval

            probes[run] = asyncio.ensure_future(publishing())
            return {}

        async def stop_probe(a: dict[str, Any]) -> dict[str, Any]:
            task = probes.pop(f"probe-{a['run']}", None)
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, MaculaError):
                    await task
            return {}

        async def publish(a: dict[str, Any]) -> dict[str, Any]:
            seqs = [
                await node.publish(realm, a["topic"], {"n": i, "run": a["run"]})
                for i in range(a["count"])
            ]
            await node.flush()
            return {"seqs": seqs}

        async def got(a: dict[str, Any]) -> dict[str, Any]:
            ok = await until(lambda: len(received.get(a["run"], [])) >= a["count"])
            return {"ok": int(ok), "events": received.get(a["run"], [])}

        async def advertise(a: dict[str, Any]) -> dict[str, Any]:
            await node.advertise(realm, a["procedure"], echo)
            await node.flush()
            return {}

        async def call_until_served(a: dict[str, Any]) -> dict[str, Any]:
            deadline = time.monotonic() + STEP_S
            last: str = ""
            while time.monotonic() < deadline:
                try:
                    return {"result": await node.call(realm, a["procedure"], {"i": -1}, timeout=5)}
                except MeshError as exc:
                    last = str(exc)
                    if exc.code != 0x01:  # only "nobody serves it (yet)" is worth a retry
                        break
                await asyncio.sleep(0.05)  # retry interval: until the advert has crossed
            return {"ok": 0, "error": last}

        async def calls(a: dict[str, Any]) -> dict[str, Any]:
            good, times = 0, []
            for i in range(a["count"]):
                started = time.monotonic()
                with contextlib.suppress(MaculaError):
                    result = await node.call(realm, a["procedure"], {"i": i}, timeout=5)
                    good += result == {"echo": {"i": i}, "caller": identity.node_id.hex()}
                times.append((time.monotonic() - started) * 1000)
            times.sort()
            p50, top = times[len(times) // 2], times[-1]
            return {"good": good, "p50_ms": round(p50, 1), "max_ms": round(top, 1)}

        async def ring(a: dict[str, Any]) -> dict[str, Any]:
            deadline = time.monotonic() + STEP_S
            while True:  # the callee's ring endpoint may not have crossed the link yet
                rung = plain(await agent.rings.ring(bytes.fromhex(a["to"]), a["purpose"]))
                if rung.get("unreachable") != 1 or time.monotonic() > deadline:
                    return dict(rung)
                await asyncio.sleep(0.1)  # retry interval

        async def say(a: dict[str, Any]) -> dict[str, Any]:
            return dict(plain(await agent.rooms.say(a["room"], a["kind"], a["text"])))

        async def wait(a: dict[str, Any]) -> dict[str, Any]:
            message = await agent.rooms.wait(
                a["room"], STEP_S, after_ms=0, kinds={a["kind"]}, sender=a.get("sender")
            )
            return {"message": plain(message)}

        async def put(a: dict[str, Any]) -> dict[str, Any]:
            data = os.urandom(a["size"])
            mcid = await node.put_content(data, name="federation-check.bin")
            return {"mcid": mcid.hex(), "sha256": sha256_hex(data)}

        async def get(a: dict[str, Any]) -> dict[str, Any]:
            data = await asyncio.wait_for(node.get_content(bytes.fromhex(a["mcid"])), STEP_S)
            return {"size": len(data), "sha256": sha256_hex(data)}

        async def hello(a: dict[str, Any]) -> dict[str, Any]:
            await agent.hello()
            return {"node_id": identity.node_id.hex()}

        ops = {
            "hello": hello,
            "subscribe": subscribe,
            "probe": probe,
            "stop_probe": stop_probe,
            "publish": publish,
            "received": got,
            "advertise": advertise,
            "call_until_served": call_until_served,
            "calls": calls,
            "ring": ring,
            "say": say,
            "wait": wait,
            "put": put,
            "get": get,
        }
        await serve_ops(
            reader,
            ops,
            (MaculaError, KeyError, ValueError, OSError, TimeoutError),
            timeout=2 * STEP_S,
            mesh_codes=True,
        )
        for task in [*tasks, *probes.values()]:
            task.cancel()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        args = child_args()
        sys.path.insert(0, str(REPO))
        asyncio.run(_child(args.station, args.home))
        return
    argparse.ArgumentParser(description=__doc__).parse_args()
    sys.exit(run())


if __name__ == "__main__":
    main()
