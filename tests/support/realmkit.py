"""Raw-frame helpers for the protected-realm tests: endorsements, revocations, and the few
frames a test sends by hand (no client library)."""

from __future__ import annotations

import os
from typing import Any

from macula.wire.frames import Advertise, Call, Publish, Result, Subscribe
from macula.wire.identity import ZERO_REALM, Identity, realm_tag
from macula.wire.record_keys import member_endorsement_key
from macula.wire.records import Record, RecordType, new_record, record_version

from .rawclient import RawClient, now_ms, stamp

REALM_NAME = "org.example.private"
PRIVATE = realm_tag(REALM_NAME)
DAY_MS = 24 * 3600 * 1000


def endorse(
    authority: Identity,
    member: bytes,
    *,
    name: str = REALM_NAME,
    role: str = "member",
    valid_until: int | None = None,
    at_ms: int | None = None,
    ttl_ms: int | None = None,
) -> Record:
    """A 0x05 realm_member_endorsement of realm ``name`` signed by ``authority`` (the shape of
    ``macula.realm.records``, built by hand so a test can make bad ones)."""
    at = now_ms() if at_ms is None else at_ms
    payload = {
        "member_node": member,
        "realm": realm_tag(name),
        "realm_name": name,
        "role": role,
        "valid_until": at + 30 * DAY_MS if valid_until is None else valid_until,
    }
    return new_record(
        authority,
        RecordType.REALM_MEMBER_ENDORSEMENT,
        payload,
        now_ms=at,
        version=record_version(at, os.urandom(10)),
        ttl_ms=ttl_ms,
    )


def revoke(authority: Identity, member: bytes, *, name: str = REALM_NAME) -> Record:
    """A newer 0x05 with role "revoked"."""
    return endorse(authority, member, name=name, role="revoked", at_ms=now_ms() + 1)


def tombstone(authority: Identity, member: bytes, *, realm: bytes = PRIVATE) -> Record:
    """A 0x0C superseding the endorsement of ``member`` (not a revocation: see records.py)."""
    at = now_ms() + 1
    payload = {
        "superseded_key": member_endorsement_key(realm, member),
        "superseded_type": int(RecordType.REALM_MEMBER_ENDORSEMENT),
        "replaced_at": at,
        "reason": "revoked",
    }
    return new_record(
        authority,
        RecordType.TOMBSTONE,
        payload,
        now_ms=at,
        version=record_version(at, os.urandom(10)),
    )


def call_frame(raw: RawClient, procedure: str, payload: Any, realm: bytes = ZERO_REALM) -> Call:
    stamped = stamp()
    return Call(
        **stamped,
        call_id=os.urandom(16),
        procedure=procedure,
        realm=realm,
        payload=payload,
        deadline_ms=stamped["sent_at_ms"] + 30_000,
        caller=raw.node_id,
    )


async def call(raw: RawClient, procedure: str, payload: Any, realm: bytes = ZERO_REALM) -> Any:
    """Send a CALL; the RESULT or ERROR map."""
    frame = call_frame(raw, procedure, payload, realm)
    raw.send(frame)
    return await raw.reply_to(frame.call_id)


async def present(raw: RawClient, *records: Record | object) -> dict[str, Any]:
    """``_realm.present``; its RESULT payload."""
    items = [r.to_rpc() if isinstance(r, Record) else r for r in records]
    reply = await call(raw, "_realm.present", {"endorsements": items})
    assert reply["frame_type"] == "result", reply
    payload: dict[str, Any] = reply["payload"]
    return payload


async def put_record(raw: RawClient, record: Record) -> Any:
    reply = await call(raw, "_dht.put_record", record.to_rpc())
    assert reply["frame_type"] == "result", reply
    return reply["payload"]


async def refused(raw: RawClient) -> dict[str, int]:
    """What this connection had refused without an in-band answer (``_relay.ping``)."""
    reply = await call(raw, "_relay.ping", {})
    counts: dict[str, int] = reply["payload"]["refused"]
    return counts


def subscribe(raw: RawClient, topic: str, realm: bytes = PRIVATE) -> None:
    raw.send(Subscribe(**stamp(), topic=topic, realm=realm, subscriber=raw.node_id))


def publish(
    raw: RawClient, topic: str, seq: int, payload: Any, realm: bytes = PRIVATE, *, e2e: bool = False
) -> None:
    """PUBLISH; with ``e2e`` also the ``publisher_sig`` a station needs to relay it (§4.4)."""
    at = now_ms()
    frame = Publish(
        **stamp(),
        topic=topic,
        realm=realm,
        publisher=raw.node_id,
        seq=seq,
        payload=payload,
        published_at_ms=at,
    )
    raw.send(frame.with_publisher_sig(raw.identity) if e2e else frame)


def advertise(raw: RawClient, procedure: str, realm: bytes = PRIVATE) -> None:
    raw.send(Advertise(**stamp(), realm=realm, procedure=procedure, advertiser=raw.node_id))


def is_event(topic: str, payload: Any = None) -> Any:
    def match(received: Any) -> bool:
        frame = received.frame
        return (
            received.frame_type == "event"
            and frame.get("topic") in (topic, topic.encode())
            and (payload is None or frame.get("payload") == payload)
        )

    return match


async def serve_one(provider: RawClient, answer: Any, start: int = 0) -> bytes:
    """Answer the next CALL forwarded to ``provider`` with ``answer``; its call_id."""
    forwarded = await provider.expect(lambda r: r.frame_type == "call", start=start)
    call_id: bytes = forwarded.frame["call_id"]
    provider.send(Result(**stamp(), call_id=call_id, payload=answer, responded_by=provider.node_id))
    return call_id
