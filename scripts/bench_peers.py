"""The peers ours is measured against: nats-server + nats-py, and the amqtt broker + amqtt clients.

Invariants: each peer runs in its own process (as our station does with ``--station-process``),
on a free loopback port, and is ended when its context exits; a peer whose program or Python
package is missing is skipped with one line saying what to install (``missing_*`` return that
line), nothing is ever installed. amqtt runs QoS 0 (as NATS core and our PUBLISH: at most once);
MQTT has no request/reply here, so amqtt runs no RPC workload.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import shutil
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from bench_common import (
    PROCEDURE,
    SUB_BUFFER,
    BenchError,
    Client,
    Inbox,
    child_process,
    free_tcp_port,
    serve_until_stdin_closes,
)


async def wait_listening(port: int, seconds: float, what: str) -> None:
    deadline = time.perf_counter() + seconds
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if time.perf_counter() > deadline:
                raise BenchError(f"{what} did not start listening within {seconds:g} s") from None
            await asyncio.sleep(0.05)


# -- NATS -----------------------------------------------------------------------------------


class NatsInbox:
    def __init__(self, sub: Any, slow: Counter[str]) -> None:
        self.sub = sub
        self.slow = slow

    @property
    def dropped(self) -> int:
        return self.slow["slow_consumer"]

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for msg in self.sub.messages:
            yield bytes(msg.data)

    async def next(self, timeout: float) -> bytes:
        return bytes((await self.sub.next_msg(timeout=timeout)).data)


class NatsClient:
    def __init__(self, nc: Any, slow: Counter[str]) -> None:
        self.nc = nc
        self.slow = slow

    async def publish(self, topic: str, payload: bytes) -> None:
        await self.nc.publish(topic, payload)

    async def subscribe(self, topic: str) -> Inbox:
        sub = await self.nc.subscribe(topic, pending_msgs_limit=SUB_BUFFER)
        await self.nc.flush()
        return NatsInbox(sub, self.slow)

    async def call(self, payload: bytes, timeout: float) -> bytes:
        return bytes((await self.nc.request(PROCEDURE, payload, timeout=timeout)).data)

    async def serve(self) -> None:
        async def respond(msg: Any) -> None:
            await msg.respond(msg.data)

        await self.nc.subscribe(PROCEDURE, cb=respond)
        await self.nc.flush()


@dataclass
class NatsBroker:
    url: str
    name: str = "nats"

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Client]:
        import nats  # type: ignore[import-not-found,unused-ignore]

        slow: Counter[str] = Counter()

        async def on_error(exc: Exception) -> None:
            slow["slow_consumer" if type(exc).__name__ == "SlowConsumerError" else "other"] += 1

        nc = await nats.connect(self.url, error_cb=on_error, allow_reconnect=False)
        try:
            yield NatsClient(nc, slow)
        finally:
            await nc.close()


@contextlib.asynccontextmanager
async def nats_server(executable: str) -> AsyncIterator[str]:
    port = free_tcp_port()
    proc = await asyncio.create_subprocess_exec(
        executable,
        "-a",
        "127.0.0.1",
        "-p",
        str(port),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await wait_listening(port, 10.0, "nats-server")
        yield f"nats://127.0.0.1:{port}"
    finally:
        if proc.returncode is None:
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def missing_nats() -> str | None:
    missing = []
    if shutil.which("nats-server") is None:
        missing.append("nats-server (apt-get install nats-server)")
    if importlib.util.find_spec("nats") is None:
        missing.append("nats-py (uv run --with nats-py python scripts/bench.py station)")
    return ", ".join(missing) or None


# -- amqtt ----------------------------------------------------------------------------------


class AmqttInbox:
    def __init__(self, client: Any) -> None:
        self.client = client

    @property
    def dropped(self) -> int:
        return 0  # the client's delivery queue is unbounded: a QoS 0 loss shows as undelivered

    async def __aiter__(self) -> AsyncIterator[bytes]:
        # straight from the session's queue: ``deliver_message`` spawns a task per message,
        # which would measure that wrapper rather than the broker
        queue = self.client.session.delivered_message_queue
        while True:
            message = await queue.get()
            yield bytes(message.data)

    async def next(self, timeout: float) -> bytes:
        message = await self.client.deliver_message(timeout_duration=timeout)
        return bytes(message.data) if message is not None else b""


class AmqttClient:
    def __init__(self, client: Any) -> None:
        self.client = client

    async def publish(self, topic: str, payload: bytes) -> None:
        await self.client.publish(topic.replace(".", "/"), payload, qos=0)

    async def subscribe(self, topic: str) -> Inbox:
        await self.client.subscribe([(topic.replace(".", "/"), 0)])  # SUBACK awaited
        return AmqttInbox(self.client)

    async def call(self, payload: bytes, timeout: float) -> bytes:
        raise BenchError("MQTT has no request/reply in this benchmark")

    async def serve(self) -> None:
        raise BenchError("MQTT has no request/reply in this benchmark")


@dataclass
class AmqttBroker:
    port: int
    name: str = "amqtt"

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Client]:
        from amqtt.client import MQTTClient  # type: ignore[import-not-found,unused-ignore]

        config = {"keep_alive": 60, "auto_reconnect": False, "default_qos": 0}
        client = MQTTClient(client_id=f"bench-{uuid.uuid4().hex[:12]}", config=config)
        await client.connect(f"mqtt://127.0.0.1:{self.port}/")
        try:
            yield AmqttClient(client)
        finally:
            with contextlib.suppress(Exception):
                await client.disconnect()


@contextlib.asynccontextmanager
async def amqtt_broker() -> AsyncIterator[int]:
    """The amqtt broker in a child process (``--serve-amqtt``): yields its port."""
    port = free_tcp_port()
    async with child_process("serve-amqtt", str(port), ready="listening"):
        await wait_listening(port, 10.0, "amqtt broker")
        yield port


async def serve_amqtt(port: int, seconds: float) -> None:
    """Child-process mode: an amqtt broker on 127.0.0.1:port, anonymous, without $SYS or logs."""
    from amqtt.broker import Broker  # type: ignore[import-not-found,unused-ignore]

    logging.getLogger("amqtt").setLevel(logging.CRITICAL)  # a client gone: ERROR lines
    config = {
        "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }
    broker = Broker(config)
    await broker.start()
    print(f"listening 127.0.0.1:{port}", flush=True)
    try:
        await serve_until_stdin_closes(seconds)
    finally:
        await broker.shutdown()


def missing_amqtt() -> str | None:
    if importlib.util.find_spec("amqtt") is None:
        return "amqtt (uv run --with amqtt python scripts/bench.py station)"
    return None
