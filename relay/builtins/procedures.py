"""The station's built-in procedures (PROTOCOL.md §6.6), stricter where §13 allows.

Invariants:
- ``Builtins.run`` never raises (cancellation aside): every call ends in an ``Outcome``, a RESULT
  payload or an ERROR code + detail. Refusals are raised inside as ``Refused`` and turned into
  outcomes by ``relay.builtins.outcome.answer`` only; any other exception is a bug or a disk error:
  logged with its traceback, answered 0x02 with no detail.
- Arguments are validated completely (``relay.builtins.arguments``) before any store is touched (§13
#13):
  a malformed argument is 0x0F ``bad_request: <what>``, never 0x02. Extra argument keys are
  ignored; a required key that is null is missing.
- Records: parsed, size-capped, payload-checked (§10.6), signature- and expiry-checked,
  ``created_at`` at most the clock-skew bound ahead and a lifetime of at most
  ``max_record_ttl_ms`` (0x0F ``clock_skew`` / ``ttl_too_long``); the newest record per signer
  wins and an older put is refused as ``stale`` (§13 #12); past a ``StoreLimits`` cap a put is
  0x0F ``quota_exceeded`` and stores nothing. Reads never return expired records. A
  procedure_advertisement for a house procedure name
  (``macula.services.house.HOUSE_PROCEDURES``) signed by anyone but this station is refused as
  ``reserved_procedure`` (the station stores its own straight into the store).
- ``find_records`` / ``find_records_by_type`` answer the newest records whose CBOR array fits
  ``max_find_reply_bytes`` (and at most ``max_find_by_type`` by type). §6.6 makes the reply a
  plain array, so a cut reply is not marked in-band (a map would break every client): it is
  counted in ``stats["find_truncated"]``. Clients already treat the array as "some records".
- With a ``dht`` (the DHT among stations, ``relay.federation.dht.station``): a stored put is also
put
  in the mesh, and ``find_record(s)`` merge the local store with the mesh (newest per signer),
  each waiting at most ``mesh_wait_s``; a mesh that fails or is slow is counted (``dht_*``) and
  the answer is the local one. ``find_records_by_type`` stays local.
- Content: a block is accepted only under MCID version 1, codec 0x55, BLAKE3(payload) = digest
  (§13 #15); a manifest only if its fields hash to its MCID and its chunks fold to its root
  (§13 #14). A block whose hash differs is answered with the RESULT text ``hash_mismatch``.
  Past ``content_bytes_total`` the least recently used content goes (``relay.stores.content``);
  when nothing old enough can go, a put is 0x0F ``quota_exceeded``.
- Content across stations (``relay.federation.content``): a get that misses here and carries no
  ``hops_remaining`` asks ``ask_peers`` (up to a few linked stations, with ``hops_remaining`` 0);
  an answer is used only if it hashes to the MCID asked for (a manifest: verifies against it),
  a wrong one is counted (``peer_content_mismatch``) and ignored; the first good one is cached
  under the store limits (a full store only means it is not cached) and returned. A get that
  carries ``hops_remaining`` (0, the only value accepted) never asks anyone.
- Error details are ``<reason>: <text>`` in UTF-8, at most ``MAX_DETAIL_CHARS`` characters.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, Protocol

from macula.services.house import HOUSE_PROCEDURES
from macula.wire import cbor
from macula.wire.codes import ErrorCode
from macula.wire.content import CODEC_MANIFEST, CODEC_RAW, MCID_SIZE, Manifest, Mcid, digest
from macula.wire.errors import ContentInvalid, ProtocolError, RecordInvalid
from macula.wire.records import Record, RecordType, validate_payload
from relay.builtins.arguments import (
    Args,
    arguments,
    bad_request,
    bytes_arg,
    integer,
    kind,
    refusal,
    required,
    too_large,
)
from relay.builtins.outcome import Outcome, Refused, answer
from relay.core.router import BUILTINS
from relay.federation.content import AskPeers
from relay.federation.content_hops import HOPS_REMAINING
from relay.federation.dht.storage import newest_per_signer
from relay.realms.gate import RealmGate, endorsement_key, record_storage_key
from relay.stores.content import ContentStore
from relay.stores.limits import QuotaExceeded, StoreLimits
from relay.stores.records import Found, RecordStore

__all__ = [
    "BUILTIN_PROCEDURES",
    "MAX_BLOCK_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_RECORD_BYTES",
    "Builtins",
    "Outcome",
]

logger = logging.getLogger("macula.relay.builtins")

# the nine of §6.6 that ``run`` answers; ``_realm.present`` needs the connection (``present``)
BUILTIN_PROCEDURES: Final = BUILTINS - {"_realm.present"}

MAX_RECORD_BYTES: Final = 64 * 1024
MAX_BLOCK_BYTES: Final = 4 * 1024 * 1024
MAX_MANIFEST_BYTES: Final = 4 * 1024 * 1024
KEY_SIZE: Final = 32
# how long a _dht.* built-in waits for the mesh (a put's store, a find's lookup) before it
# answers with what it has
DEFAULT_MESH_WAIT_S: Final = 3.0
# records may claim a created_at this far ahead of the station clock when the frame skew check
# is off (StationPolicy.max_clock_skew_ms = 0): a record's clock is always bounded
DEFAULT_RECORD_SKEW_MS: Final = 300_000

OK: Final = "ok"
NOT_FOUND: Final = "not_found"
HASH_MISMATCH: Final = "hash_mismatch"


# --- argument checks (the shared ones are relay.builtins.arguments) -------------------------------


def _mcid_field(args: Args, codec: int) -> Mcid:
    raw = bytes_arg(args, "mcid", MCID_SIZE)
    try:
        mcid = Mcid.from_bytes(raw)
    except ProtocolError as exc:
        raise bad_request(exc.detail) from None
    if mcid.codec != codec:
        wanted = "a raw block (0x55)" if codec == CODEC_RAW else "a manifest (0x56)"
        raise bad_request(f"'mcid' has codec {mcid.codec:#04x}; this procedure takes {wanted}")
    return mcid


def _replicate_field(args: Args) -> None:
    value = args.get("replicate", "true")
    if value not in ("true", "false"):
        raise bad_request(f'\'replicate\' must be text "true" or "false", got {kind(value)}')


def _hops_field(args: Args) -> bool:
    """True when the get must not fan out: it carries ``hops_remaining`` (a station asked)."""
    if HOPS_REMAINING not in args:
        return False
    value = args[HOPS_REMAINING]
    if type(value) is not int or value != 0:
        raise bad_request(f"'{HOPS_REMAINING}' may only be 0, got {kind(value)}")
    return True


def _quota(exc: QuotaExceeded) -> Refused:
    return refusal("quota_exceeded", str(exc))


def _record_refusal(exc: RecordInvalid) -> Refused:
    reason = exc.reason if exc.reason in ("bad_signature", "expired") else "bad_request"
    return refusal(reason, exc.detail)


class RecordMesh(Protocol):
    """The DHT among stations as the built-ins use it
    (``relay.federation.dht.station.StationDht``)."""

    async def put(self, record: Record) -> int: ...

    async def find(self, storage_key: bytes) -> list[Record]: ...


def _endorsement_key_of(raw: object) -> bytes | None:
    """Where revocations of the endorsement ``raw`` (RPC form, unchecked) are stored."""
    payload = raw.get("payload") if isinstance(raw, Mapping) else None
    if not isinstance(payload, Mapping):
        return None
    realm, member = payload.get("realm"), payload.get("member_node")
    if type(realm) is not bytes or type(member) is not bytes:
        return None
    if len(realm) != KEY_SIZE or len(member) != KEY_SIZE:
        return None
    return endorsement_key(realm, member)


def _within(records: list[Record], max_bytes: int, truncated: int) -> Found:
    """The newest ``records`` whose RPC forms fit a CBOR array of ``max_bytes``."""
    kept: list[Record] = []
    used = 9  # the most an array header takes
    for record in records:
        used += len(cbor.encode(record.to_rpc()))
        if used > max_bytes:
            return Found(kept, 1)
        kept.append(record)
    return Found(kept, truncated)


# --- the procedures ---------------------------------------------------------------------------

_Handler = Callable[[object, int, int], Awaitable[object]]


class Builtins:
    """The nine built-ins of §6.6 over a ``RecordStore`` and a ``ContentStore``."""

    def __init__(
        self,
        records: RecordStore,
        content: ContentStore,
        *,
        station_id: bytes,
        limits: StoreLimits | None = None,
        max_clock_skew_ms: int = DEFAULT_RECORD_SKEW_MS,
        dht: RecordMesh | None = None,
        mesh_wait_s: float = DEFAULT_MESH_WAIT_S,
        ask_peers: AskPeers | None = None,
        on_stored: Callable[[Record, int], object] | None = None,
    ) -> None:
        if type(station_id) is not bytes or len(station_id) != KEY_SIZE:
            raise ValueError("station_id is the station's 32-byte node id")
        self.records = records
        self.content = content
        self.station_id = station_id
        self.limits = StoreLimits() if limits is None else limits
        self.record_skew_ms = max_clock_skew_ms if max_clock_skew_ms > 0 else DEFAULT_RECORD_SKEW_MS
        self.dht = dht
        self.mesh_wait_s = mesh_wait_s
        self.stats: Counter[str] = Counter()
        self.ask_peers = ask_peers  # linked stations, asked on a content miss
        self.on_stored = on_stored  # told every record a put stored
        self._handlers: dict[str, _Handler] = {
            "_dht.put_record": self._put_record,
            "_dht.find_record": self._find_record,
            "_dht.find_records": self._find_records,
            "_dht.find_records_by_type": self._find_records_by_type,
            "_content.put_block": self._put_block,
            "_content.get_block": self._get_block,
            "_content.put_manifest": self._put_manifest,
            "_content.get_manifest": self._get_manifest,
            "_relay.ping": self._ping,
        }

    async def run(self, procedure: str, payload: object, now_ms: int, now_us: int) -> Outcome:
        """Answer one CALL of ``procedure``; 0x01 if it is not a built-in. Never raises."""
        handler = self._handlers.get(procedure)
        if handler is None:
            return Outcome.error(ErrorCode.UNKNOWN_NEXT_PEER)
        return await answer(procedure, lambda: handler(payload, now_ms, now_us), logger)

    # -- _dht.* --

    async def _put_record(self, payload: object, now_ms: int, now_us: int) -> object:
        if not isinstance(payload, Mapping):
            raise bad_request(f"a record (RPC form) is a map, got {kind(payload)}")
        try:
            record = Record.from_rpc(payload)
            size = len(cbor.encode(record.to_rpc()))
            if size > MAX_RECORD_BYTES:
                raise too_large("the record", size, MAX_RECORD_BYTES)
            storage_key = record_storage_key(record)  # 0x05: from its realm and member_node
            validate_payload(record.type, record.payload)
            record.verify(now_ms)
        except RecordInvalid as exc:
            raise _record_refusal(exc) from None
        procedure = record.payload.get("procedure_uri")
        if (
            record.type == RecordType.PROCEDURE_ADVERTISEMENT
            and procedure in HOUSE_PROCEDURES
            and record.key != self.station_id
        ):
            self.stats["reserved_procedure"] += 1
            raise refusal(
                "reserved_procedure", f"{procedure} is a house service only this station announces"
            )
        self._check_times(record, now_ms)
        try:
            stored = await self.records.put(record, storage_key, now_ms, self.limits)
        except QuotaExceeded as exc:
            self.stats["record_quota"] += 1
            raise _quota(exc) from None
        if stored == "stale":
            raise refusal("stale", "this signer already stored a newer record under this key")
        if self.on_stored is not None:
            self.on_stored(record, now_ms)  # e.g. a realm revocation, honoured at once
        await self._mesh_put(record)
        return OK

    async def _mesh_put(self, record: Record) -> None:
        """Also store ``record`` at the mesh's closest stations; stored here whatever happens."""
        if self.dht is None:
            return
        try:
            await asyncio.wait_for(self.dht.put(record), self.mesh_wait_s)
        except TimeoutError:
            self.stats["dht_put_timeout"] += 1
        except Exception as exc:  # DhtRefused (e.g. too large for a UDP store) or a DHT fault
            self.stats["dht_put_failed"] += 1
            logger.debug("the mesh did not take a record: %s", exc)

    async def _with_mesh(self, key: bytes, local: list[Record], now_ms: int) -> list[Record]:
        """``local`` merged with what the mesh holds under ``key``: newest per signer."""
        if self.dht is None:
            return local
        try:
            found = await asyncio.wait_for(self.dht.find(key), self.mesh_wait_s)
        except TimeoutError:
            self.stats["dht_find_timeout"] += 1
            return local
        except Exception:
            self.stats["dht_find_failed"] += 1
            logger.exception("DHT lookup failed")
            return local
        alive = [r for r in found if not r.is_expired(now_ms)]
        return newest_per_signer([*local, *alive])

    def _check_times(self, record: Record, now_ms: int) -> None:
        ahead = record.created_at - now_ms
        if ahead > self.record_skew_ms:
            raise refusal(
                "clock_skew",
                f"created_at is {ahead} ms ahead of the station clock,"
                f" at most {self.record_skew_ms} ms is accepted",
            )
        lifetime = record.expires_at - record.created_at
        if lifetime > self.limits.max_record_ttl_ms:
            raise refusal(
                "ttl_too_long",
                f"expires_at - created_at is {lifetime} ms,"
                f" at most {self.limits.max_record_ttl_ms} ms is accepted",
            )

    async def _find_record(self, payload: object, now_ms: int, now_us: int) -> object:
        key = bytes_arg(arguments(payload), "key", KEY_SIZE)
        found = await self._with_mesh(key, await self.records.find(key, now_ms), now_ms)
        return found[0].to_rpc() if found else NOT_FOUND

    async def _find_records(self, payload: object, now_ms: int, now_us: int) -> object:
        key = bytes_arg(arguments(payload), "key", KEY_SIZE)
        found = await self.records.find_newest(key, now_ms, self.limits.max_find_reply_bytes)
        if self.dht is None:
            return self._reply(found)
        merged = await self._with_mesh(key, found.records, now_ms)
        return self._reply(_within(merged, self.limits.max_find_reply_bytes, found.truncated))

    async def _find_records_by_type(self, payload: object, now_ms: int, now_us: int) -> object:
        record_type = integer(arguments(payload), "type", 0, 0xFF)
        limits = self.limits
        found = await self.records.find_newest_by_type(
            record_type, now_ms, limits.max_find_by_type, limits.max_find_reply_bytes
        )
        return self._reply(found)

    def _reply(self, found: Found) -> list[object]:
        """The records as §6.6's plain array; a cut one is only counted (see the invariants)."""
        self.stats["find_truncated"] += found.truncated
        return [record.to_rpc() for record in found.records]

    # -- _content.* --

    async def _put_block(self, payload: object, now_ms: int, now_us: int) -> object:
        args = arguments(payload)
        mcid = _mcid_field(args, CODEC_RAW)
        data = bytes_arg(args, "payload")
        _replicate_field(args)  # accepted and validated; nothing to replicate to yet
        if len(data) > MAX_BLOCK_BYTES:
            raise too_large("the block", len(data), MAX_BLOCK_BYTES)
        if digest(data) != mcid.digest:
            return HASH_MISMATCH
        try:
            await self.content.put_block(mcid.digest, data, now_ms, self.limits)
        except QuotaExceeded as exc:
            self.stats["content_quota"] += 1
            raise _quota(exc) from None
        return OK

    async def _get_block(self, payload: object, now_ms: int, now_us: int) -> object:
        args = arguments(payload)
        mcid = _mcid_field(args, CODEC_RAW)
        local_only = _hops_field(args)
        data = await self.content.get_block(mcid.digest, now_ms)
        if data is None and not local_only:
            data = await self._block_from_peers(mcid, now_ms)
        return NOT_FOUND if data is None else data

    async def _block_from_peers(self, mcid: Mcid, now_ms: int) -> bytes | None:
        """The block from a linked station, checked against ``mcid`` and cached; else None."""
        if self.ask_peers is None:
            return None
        self.stats["peer_content_asked"] += 1
        for reply in await self.ask_peers("_content.get_block", {"mcid": mcid.to_bytes()}):
            if reply == NOT_FOUND:
                continue
            if (
                type(reply) is not bytes
                or len(reply) > MAX_BLOCK_BYTES
                or digest(reply) != mcid.digest
            ):
                self.stats["peer_content_mismatch"] += 1
                continue
            self.stats["peer_content_fetched"] += 1
            try:
                await self.content.put_block(mcid.digest, reply, now_ms, self.limits)
            except QuotaExceeded:
                self.stats["peer_content_not_cached"] += 1
            return reply
        return None

    async def _put_manifest(self, payload: object, now_ms: int, now_us: int) -> object:
        raw = required(arguments(payload), "manifest")
        try:
            manifest = Manifest.from_wire(raw)
            manifest.verify()
        except ContentInvalid as exc:
            reason = "mcid_mismatch" if exc.reason == "manifest_mcid_mismatch" else "bad_request"
            raise refusal(reason, exc.detail) from None
        except ProtocolError as exc:
            raise bad_request(exc.detail) from None
        size = len(cbor.encode(manifest.to_wire()))
        if size > MAX_MANIFEST_BYTES:
            raise too_large("the manifest", size, MAX_MANIFEST_BYTES)
        try:
            await self.content.put_manifest(manifest, now_ms, self.limits)
        except QuotaExceeded as exc:
            self.stats["content_quota"] += 1
            raise _quota(exc) from None
        return OK

    async def _get_manifest(self, payload: object, now_ms: int, now_us: int) -> object:
        args = arguments(payload)
        mcid = _mcid_field(args, CODEC_MANIFEST)
        local_only = _hops_field(args)
        manifest = await self.content.get_manifest(mcid.digest, now_ms)
        if manifest is None and not local_only:
            manifest = await self._manifest_from_peers(mcid, now_ms)
        return NOT_FOUND if manifest is None else manifest.to_wire()

    async def _manifest_from_peers(self, mcid: Mcid, now_ms: int) -> Manifest | None:
        """The manifest from a linked station, verified against ``mcid`` and cached."""
        if self.ask_peers is None:
            return None
        self.stats["peer_content_asked"] += 1
        for reply in await self.ask_peers("_content.get_manifest", {"mcid": mcid.to_bytes()}):
            if reply == NOT_FOUND:
                continue
            try:
                manifest = Manifest.from_wire(reply)
                manifest.verify(mcid)
                if len(cbor.encode(manifest.to_wire())) > MAX_MANIFEST_BYTES:
                    raise ContentInvalid("too_large", "manifest above the size cap")
            except (ContentInvalid, ProtocolError):
                self.stats["peer_content_mismatch"] += 1
                continue
            self.stats["peer_content_fetched"] += 1
            try:
                await self.content.put_manifest(manifest, now_ms, self.limits)
            except QuotaExceeded:
                self.stats["peer_content_not_cached"] += 1
            return manifest
        return None

    # -- _realm.* (relay.realms.gate, issue 13) --

    async def present(
        self, gate: RealmGate, conn: int, caller: bytes, payload: object, now_ms: int
    ) -> Outcome:
        """``_realm.present``: the connection ``conn`` of ``caller`` presents endorsements
        (``{"endorsements": [record, ...]}``, RPC form); revocations of them in the record
        store (and the mesh) are looked up first. Never raises."""

        async def work() -> object:
            raw = required(arguments(payload), "endorsements")
            if not isinstance(raw, list):
                raise bad_request(f"'endorsements' must be an array, got {kind(raw)}")
            if len(raw) > gate.max_presented:
                raise bad_request(f"at most {gate.max_presented} endorsements at once")
            keys = {key for item in raw if (key := _endorsement_key_of(item)) is not None}
            if gate.realms:
                keys |= {realm.authority for realm in gate.realms.values()}
            await self.learn_revocations(gate, keys, now_ms)
            self.stats["realm_presentations"] += 1
            return gate.present(conn, caller, raw, now_ms)

        return await answer("_realm.present", work, logger)

    async def learn_revocations(self, gate: RealmGate, keys: set[bytes], now_ms: int) -> int:
        """Tell ``gate`` the revocations stored under ``keys`` (here and in the mesh)."""

        async def under(key: bytes) -> list[Record]:
            return await self._with_mesh(key, await self.records.find(key, now_ms), now_ms)

        found = await asyncio.gather(*(under(key) for key in keys))  # the mesh waits overlap
        return sum(gate.learn(record, now_ms) for records in found for record in records)

    # -- _relay.* --

    async def _ping(self, payload: object, now_ms: int, now_us: int) -> object:
        return {"ts": now_us}
