"""The client's per-message paths (issue 15): what was made cheaper still does all it did.

A ``Node`` over a ``Session`` whose QUIC connection is a stand-in (``Wire``) that keeps what is
sent; frames are fed in as a station would send them. Covers: the one-encoding PUBLISH
(byte-equal to the reference two-step signing, both signatures valid), each received frame
verified once (a RESULT on the control stream; an EVENT for several subscriptions of one node),
a bad ``publisher_sig`` never reaching a subscription, a plain handler answered in the callback
that delivered its CALL (no task), an async handler through a task, and the call timer that
moves only earlier and re-arms itself when it fires.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from macula.client.core import CoreState
from macula.client.publishing import signed_publish
from macula.errors import CallTimeout, MeshError
from macula.node.node import Node
from macula.node.serving import CallRefused, IncomingCall
from macula.node.session import Session
from macula.stations import parse_station
from macula.wire import frames
from macula.wire.errors import LocalProtocolError
from macula.wire.frames import Call, Publish, Result, new_frame_id, parse_frame
from macula.wire.framing import FrameDecoder
from macula.wire.identity import Identity, realm_tag
from macula.wire.verified import publications
from support.vectorkit import load_vectors, typed

pytestmark = pytest.mark.anyio

REALM = realm_tag("test.client-hot-path")
ME, PUBLISHER, CALLER = (Identity.generate(random.Random(n).randbytes) for n in (1, 2, 3))
STATION = Identity.generate(random.Random(4).randbytes)
NOW = 1_790_000_000_000


class Wire:
    """Stands in for ``FrameProtocol``: the frames ``send`` was given, decoded."""

    lost = False

    def __init__(self) -> None:
        self.decoder = FrameDecoder()
        self.frames: list[frames.Frame] = []

    def new_stream(self) -> int:
        return 0

    def send(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        self.frames += [parse_frame(m) for m in self.decoder.feed(data)]

    def take(self, kind: type[frames.Frame]) -> list[Any]:
        taken = [f for f in self.frames if isinstance(f, kind)]
        self.frames = [f for f in self.frames if not isinstance(f, kind)]
        return taken


def offline(node: Node) -> tuple[Session, Wire]:
    """``node``'s session to a station that is only a ``Wire`` (TLS-pinned, established)."""
    wire = Wire()
    session = Session(node.identity, parse_station("127.0.0.1:1"), wire, node)  # type: ignore[arg-type]
    session.core.state = CoreState.ESTABLISHED
    session.core.tls_pinned = True
    node._session = session
    node._connected.set()
    return session, wire


@contextlib.asynccontextmanager
async def serving_node(**kwargs: Any) -> AsyncIterator[Node]:
    """A node with its task group (handlers run as its tasks) but no supervisor dialling."""
    node = Node(ME, ["127.0.0.1:1"], probe_interval_s=0, **kwargs)
    async with asyncio.TaskGroup() as group:
        node._group = group
        try:
            yield node
        finally:
            node._group = None
            for task in node._handlers:
                task.cancel()


def stamp(n: int = 0) -> dict[str, Any]:
    return {"frame_id": new_frame_id(NOW, bytes([n]) * 10), "sent_at_ms": NOW}


def publish_frame(**changes: Any) -> Publish:
    fields: dict[str, Any] = dict(
        **stamp(), topic="news", realm=REALM, publisher=PUBLISHER.node_id, seq=7,
        payload={"headline": "hi", "n": [1, 2.5, None]}, published_at_ms=NOW,
    )  # fmt: skip
    return Publish(**(fields | changes))


def event_map(seq: int, *, forged: bool = False) -> dict[str, Any]:
    """The EVENT a station sends for PUBLISHER's publish ``seq`` (``forged``: payload changed
    after the publisher signed it, frame signed again by the station)."""
    publish = publish_frame(seq=seq, payload=b"x" * 128).with_publisher_sig(PUBLISHER)
    event = frames.event_from_publish(publish, **stamp(seq % 256))
    if forged:
        event = dataclasses.replace(event, payload=b"y" * 128)
    return event.signed_by(STATION).to_map()


@pytest.fixture
def count_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def counting(cls: type, name: str) -> list[int]:
        calls = [0]
        original = getattr(cls, name)

        def counted(self: Any, *args: Any) -> Any:
            calls[0] += 1
            return original(self, *args)

        monkeypatch.setattr(cls, name, counted)
        return calls

    yield counting


# --- publish: both signatures from one encoding ------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"payload": b"\x00" * 128},
        {"topic": "nouvelles.été", "ttl_ms": 5_000},
        {"payload": None, "seq": 2**63},
        {"payload": [{"b": 1, "a": {"z": b"", "y": -3}}], "capabilities": 1},
    ],
)
def test_signed_publish_is_byte_equal_to_signing_in_two_steps(changes: dict[str, Any]) -> None:
    frame = publish_frame(**changes)
    reference = frame.with_publisher_sig(PUBLISHER).sign_and_encode(PUBLISHER)
    assert signed_publish(frame, PUBLISHER) == reference
    (decoded,) = FrameDecoder().feed(reference)
    parsed = parse_frame(decoded)
    assert isinstance(parsed, Publish)
    assert parsed.verifies(PUBLISHER.node_id) and frames.publisher_sig_valid(parsed)


def test_signed_publish_reproduces_the_publish_vector() -> None:
    vectors = load_vectors("frames")
    client = Identity(bytes.fromhex(vectors["fixtures"]["client_seed_hex"]))
    vec = next(v for v in vectors["frames"] if v["name"] == "publish_with_publisher_sig")
    publish = parse_frame(typed(vec["fields"]))
    assert isinstance(publish, Publish)
    unsigned = dataclasses.replace(publish, signature=None, publisher_sig=None)
    assert signed_publish(unsigned, client).hex() == vec["wire_hex"]


def test_signed_publish_refuses_a_frame_already_signed() -> None:
    with pytest.raises(LocalProtocolError):
        signed_publish(publish_frame().with_publisher_sig(ME), ME)
    with pytest.raises(LocalProtocolError):
        signed_publish(publish_frame().signed_by(ME), ME)


async def test_node_publish_sends_one_frame_with_both_signatures_valid() -> None:
    node = Node(ME, ["127.0.0.1:1"], probe_interval_s=0)
    _, wire = offline(node)
    seq = await node.publish(REALM, "news", {"n": 1})
    (sent,) = wire.take(Publish)
    assert (sent.seq, sent.payload, sent.publisher) == (seq, {"n": 1}, ME.node_id)
    assert sent.verifies(ME.node_id) and frames.publisher_sig_valid(sent)


# --- receiving: each frame verified once, nothing forged delivered ------------------------------


async def test_an_event_for_two_subscriptions_is_verified_once_and_delivered_to_both() -> None:
    node = Node(ME, ["127.0.0.1:1"], probe_interval_s=0)
    session, _ = offline(node)
    first, second = [await node.subscribe(REALM, "news") for _ in range(2)]
    session.frames_received(0, [event_map(1)])
    assert (publications.verifies, publications.hits) == (1, 0)
    for sub in (first, second):
        delivery = await sub.next(1.0)
        assert (delivery.seq, delivery.authenticated) == (1, True)


async def test_an_event_whose_publisher_sig_fails_reaches_no_subscription() -> None:
    node = Node(ME, ["127.0.0.1:1"], probe_interval_s=0)
    session, _ = offline(node)
    sub = await node.subscribe(REALM, "news")
    session.frames_received(0, [event_map(1, forged=True), event_map(2)])
    assert session.dropped == {"bad_publisher_sig": 1}
    assert (await sub.next(1.0)).seq == 2  # the forged one never arrived
    assert sub.delivered == 1


def _result(call_id: bytes, payload: Any, signer: Identity = CALLER) -> Result:
    return Result(**stamp(), call_id=call_id, payload=payload, responded_by=signer.node_id)


async def test_a_result_on_the_control_stream_is_verified_once(count_calls: Any) -> None:
    node = Node(ME, ["127.0.0.1:1"], probe_interval_s=0)
    session, wire = offline(node)
    pending = asyncio.ensure_future(node.call(REALM, "org.example.echo_v1", 1, timeout=5))
    await asyncio.sleep(0)  # one loop turn: the CALL is sent
    (call,) = wire.take(Call)
    verified = count_calls(Result, "verifies")
    forged = {**_result(call.call_id, "forged").signed_by(CALLER).to_map(), "payload": "x"}
    session.frames_received(0, [forged])
    assert verified == [1] and session.dropped == {"unverified": 1} and not pending.done()
    session.frames_received(0, [_result(call.call_id, "real").signed_by(CALLER).to_map()])
    assert verified == [2]
    assert await pending == "real"


async def test_a_result_on_a_content_stream_is_still_verified() -> None:
    node = Node(ME, ["127.0.0.1:1"], probe_interval_s=0)
    session, wire = offline(node)
    session.core.open_content(4)
    pending = asyncio.ensure_future(session.call(REALM, "_x", None, 5, stream=4))
    await asyncio.sleep(0)  # one loop turn: the pending call sends its CALL
    (call,) = wire.take(Call)
    forged = {**_result(call.call_id, "forged").signed_by(CALLER).to_map(), "payload": "x"}
    session.frames_received(4, [forged])
    assert session.dropped == {"unverified": 1} and not pending.done()
    session.frames_received(4, [_result(call.call_id, "real").signed_by(CALLER).to_map()])
    assert await pending == "real"


# --- serving: a plain handler answers in the delivering callback --------------------------------


def _call_map(procedure: str, payload: Any, n: int = 0) -> dict[str, Any]:
    call = Call(
        **stamp(n), call_id=bytes([n]) * 16, procedure=procedure, realm=REALM,
        payload=payload, deadline_ms=NOW + 5_000, caller=CALLER.node_id,
    )  # fmt: skip
    return call.signed_by(CALLER).to_map()


async def test_a_plain_handler_is_answered_before_the_callback_returns() -> None:
    seen: list[IncomingCall] = []

    def echo(call: IncomingCall) -> Any:
        seen.append(call)
        return call.payload

    def refuse(call: IncomingCall) -> Any:
        raise CallRefused("not today")

    def broken(call: IncomingCall) -> Any:
        raise RuntimeError("secret local state")

    async with serving_node() as node:
        session, wire = offline(node)
        for name, handler in [("echo_v1", echo), ("refuse_v1", refuse), ("broken_v1", broken)]:
            await node.advertise(REALM, f"org.example.{name}", handler)
        session.frames_received(0, [_call_map("org.example.echo_v1", [1, "a"], 1)])
        (result,) = wire.take(Result)  # no loop turn has passed
        assert result.payload == [1, "a"] and result.call_id == bytes([1]) * 16
        assert seen[0].caller == CALLER.node_id and not node._handlers
        session.frames_received(0, [_call_map("org.example.refuse_v1", 0, 2)])
        session.frames_received(0, [_call_map("org.example.broken_v1", 0, 3)])
        refused, failed = wire.take(frames.Error)
        assert refused.detail == b"not today"
        assert failed.detail == b"handler_error"  # never the exception's text
        assert node.stats.calls_served == 1 and node.stats.handler_errors == 2
        assert node._served.in_flight == 0


async def test_an_async_handler_is_awaited_in_a_task_and_counted_in_flight() -> None:
    release = asyncio.Event()

    async def slow(call: IncomingCall) -> Any:
        await release.wait()
        return call.payload * 2

    async with serving_node(max_handlers=1) as node:
        session, wire = offline(node)
        await node.advertise(REALM, "org.example.slow_v1", slow)
        session.frames_received(0, [_call_map("org.example.slow_v1", 21, 1)])
        session.frames_received(0, [_call_map("org.example.slow_v1", 1, 2)])
        (busy,) = wire.take(frames.Error)  # the one slot is taken
        assert busy.call_id == bytes([2]) * 16 and node.stats.calls_refused_busy == 1
        assert node._served.in_flight == 1 and wire.take(Result) == []
        release.set()
        (task,) = node._handlers
        await task
        (result,) = wire.take(Result)
        assert result.payload == 42 and node._served.in_flight == 0


class _AwaitableDict(dict[str, Any]):
    """A handler result whose type is a subclass of a plain one, and awaitable."""

    def __await__(self) -> Any:
        yield from asyncio.sleep(0).__await__()  # one loop turn: there only if it was awaited
        return {"awaited": 1}


async def test_a_subclass_of_a_plain_result_type_is_still_awaited() -> None:
    async with serving_node() as node:
        session, wire = offline(node)
        await node.advertise(REALM, "org.example.odd_v1", lambda call: _AwaitableDict())
        session.frames_received(0, [_call_map("org.example.odd_v1", 1, 1)])
        assert wire.take(Result) == []  # not answered inline: a task awaits it
        (task,) = node._handlers
        await task
        (result,) = wire.take(Result)
        assert result.payload == {"awaited": 1}


async def test_a_closing_node_runs_no_handler() -> None:
    ran: list[IncomingCall] = []
    async with serving_node() as node:
        session, wire = offline(node)
        await node.advertise(REALM, "org.example.echo_v1", ran.append)
        node._closing = True
        session.frames_received(0, [_call_map("org.example.echo_v1", 1)])
        node._closing = False
    assert ran == [] and wire.take(Result) == []


# --- the call timer -------------------------------------------------------------------------


async def test_a_nearer_deadline_moves_the_timer_earlier() -> None:
    node = Node(ME, ["127.0.0.1:1"], probe_interval_s=0)
    session, _ = offline(node)
    slow = asyncio.ensure_future(session.call(REALM, "org.example.a_v1", None, 30))
    await asyncio.sleep(0)  # one loop turn: the pending call sends its CALL
    far = session._timer_at
    with pytest.raises(CallTimeout):
        await session.call(REALM, "org.example.b_v1", None, 0.05)
    assert not slow.done() and session._timer_at == far  # re-armed for the call still pending
    slow.cancel()


async def test_the_timer_left_by_a_settled_call_re_arms_for_the_next() -> None:
    node = Node(ME, ["127.0.0.1:1"], probe_interval_s=0)
    session, wire = offline(node)
    first = asyncio.ensure_future(session.call(REALM, "org.example.a_v1", None, 0.02))
    await asyncio.sleep(0)  # one loop turn: the pending call sends its CALL
    (call,) = wire.take(Call)
    session.frames_received(0, [_result(call.call_id, 1).signed_by(CALLER).to_map()])
    assert await first == 1
    started = session.clock()
    with pytest.raises(CallTimeout):
        await session.call(REALM, "org.example.b_v1", None, 0.2)
    assert session.clock() >= started + 200  # not cut short by the first call's timer
    assert session.core.next_deadline() is None


async def test_a_call_answered_with_an_error_raises_mesh_error() -> None:
    node = Node(ME, ["127.0.0.1:1"], probe_interval_s=0)
    session, wire = offline(node)
    pending = asyncio.ensure_future(node.call(REALM, "org.example.a_v1", None, timeout=5))
    await asyncio.sleep(0)  # one loop turn: the pending call sends its CALL
    (call,) = wire.take(Call)
    error = frames.Error(**stamp(), call_id=call.call_id, code=0x0F, reported_by=CALLER.node_id)
    session.frames_received(0, [error.signed_by(CALLER).to_map()])
    with pytest.raises(MeshError):
        await pending


# --- Subscription.next ----------------------------------------------------------------------


async def test_next_returns_a_buffered_delivery_at_once_and_times_out_on_an_empty_buffer(
    count_calls: Any,
) -> None:
    node = Node(ME, ["127.0.0.1:1"], probe_interval_s=0)
    session, _ = offline(node)
    sub = await node.subscribe(REALM, "news")
    session.frames_received(0, [event_map(1), event_map(2)])
    tasks = count_calls(type(asyncio.get_running_loop()), "create_task")
    assert (await sub.next(0)).seq == 1  # buffered: no wait, even with no time to wait
    assert (await sub.next(1.0)).seq == 2
    assert tasks == [0]
    with pytest.raises(TimeoutError):
        await sub.next(0.01)
    session.frames_received(0, [event_map(3)])
    await sub.close()
    assert (await sub.next(0)).seq == 3  # what was buffered, then the end
    with pytest.raises(StopAsyncIteration):
        await sub.next(0.01)
