"""Private rooms without a network: key derivation and sealing (``room_crypto``), and the key
life of one agent (``RoomKeys`` on a real SQLite file): wrong keys, tampering, replayed epochs,
key envelopes from someone other than the opener, removal, held envelopes."""

from __future__ import annotations

import asyncio
import base64
import json
import stat
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import nacl.bindings
import nacl.public
import nacl.signing
import pytest

from macula.agent.envelope import KEY_KIND, build_envelope, validate
from macula.agent.room.crypto import (
    RoomCryptoError,
    RoomKey,
    build_key_envelope,
    key_envelope_problems,
    key_id_of,
    open_body,
    open_key_envelope,
    open_sealed_key,
    private_room_topic,
    seal_body,
    seal_key,
    x25519_private,
    x25519_public,
)
from macula.agent.room.keys import RoomKeyError, RoomKeys
from macula.store.room_keys import RoomKeyStore
from macula.wire.identity import Identity
from support.running import run

T = TypeVar("T")

ALICE = Identity(bytes([1]) * 32)
BOB = Identity(bytes([2]) * 32)
CAROL = Identity(bytes([3]) * 32)
SALT = bytes(range(16))
KEY = bytes([7]) * 32
NONCE = bytes(24)
SECRET = "the launch code is 0000"


def counter_random() -> Callable[[int], bytes]:
    state = [0]

    def random_bytes(n: int) -> bytes:
        state[0] += 1
        return (state[0].to_bytes(4, "big") * (n // 4 + 1))[:n]

    return random_bytes


def key_envelope(
    identity: Identity = ALICE,
    *,
    epoch: int = 1,
    key: bytes = KEY,
    recipients: tuple[Identity, ...] = (BOB,),
    salt: bytes = SALT,
    message_id: str = "k1",
) -> dict[str, Any]:
    return build_key_envelope(
        identity,
        message_id=message_id,
        salt=salt,
        epoch=epoch,
        key=key,
        recipients=[r.node_id for r in recipients],
        sent_at=1_000,
    )


def said(sender: Identity, text: str = SECRET, topic: str | None = None, mid: str = "m1") -> Any:
    return dict(
        build_envelope(
            message_id=mid,
            room_topic=topic or private_room_topic(ALICE.node_id, SALT),
            sender=sender.node_id,
            kind="question_asked",
            text=text,
            sent_at=2_000,
            refs=["mcid:x"],
        )
    )


# -- room_crypto ----------------------------------------------------------------------------------


def test_x25519_keys_derive_from_the_ed25519_identity() -> None:
    public = x25519_public(BOB.node_id)
    assert bytes(public) == nacl.bindings.crypto_sign_ed25519_pk_to_curve25519(BOB.node_id)
    assert bytes(x25519_private(BOB).public_key) == bytes(public)
    sealed = seal_key(KEY, BOB.node_id)
    assert open_sealed_key(sealed, BOB) == KEY
    assert open_sealed_key(sealed, CAROL) is None
    assert open_sealed_key("not base64!", BOB) is None
    with pytest.raises(RoomCryptoError):
        x25519_public(b"\xff" * 32)  # not a point of the curve


def test_the_topic_is_bound_to_its_opener() -> None:
    topic = private_room_topic(ALICE.node_id, SALT)
    assert topic.startswith("agents.room.") and len(topic) == len("agents.room.") + 32
    assert topic != private_room_topic(BOB.node_id, SALT)
    assert topic != private_room_topic(ALICE.node_id, bytes(16))


def test_a_key_envelope_verifies_and_opens_for_its_recipients_only() -> None:
    envelope = key_envelope(recipients=(BOB,))
    assert validate(envelope) == [] and envelope["kind"] == KEY_KIND
    assert key_envelope_problems(envelope, ALICE.node_id) == []
    assert sorted(envelope["room_key"]["sealed"]) == sorted(
        [ALICE.node_id.hex(), BOB.node_id.hex()]
    )
    mine = open_key_envelope(envelope, BOB)
    assert mine is not None and mine.key == KEY and mine.epoch == 1
    assert KEY.hex() not in repr(mine) and "key=" not in repr(mine)
    assert open_key_envelope(envelope, CAROL) is None
    assert KEY.hex() not in json.dumps(envelope)


def test_a_key_envelope_from_someone_other_than_the_opener_is_refused() -> None:
    alices = key_envelope()
    # carol makes her own envelope for alice's topic: her id does not open it
    forged = key_envelope(CAROL, recipients=(BOB,))
    forged["room_topic"] = alices["room_topic"]
    assert key_envelope_problems(forged, CAROL.node_id) == [
        "room_key: the sender did not open this room (topic and salt disagree)"
    ]
    # carol re-signs alice's envelope claiming to be alice: the signature does not verify
    claimed = json.loads(json.dumps(alices))
    claimed["room_key"]["sealed"][CAROL.node_id.hex()] = seal_key(KEY, CAROL.node_id)
    assert key_envelope_problems(claimed, ALICE.node_id) == ["room_key.signature: does not verify"]
    # alice's own envelope, published by carol
    assert key_envelope_problems(alices, CAROL.node_id) == [
        "from: not the attested sender of this key envelope"
    ]
    # a sealed key that opens to another key than key_id names
    swapped = json.loads(json.dumps(alices))
    swapped["room_key"]["key_id"] = key_id_of(bytes(32))
    with pytest.raises(RoomCryptoError):
        open_key_envelope(swapped, BOB)


def test_a_sealed_body_hides_everything_but_the_clear_fields() -> None:
    key = open_key_envelope(key_envelope(), BOB)
    assert key is not None
    plain = said(BOB)
    sealed = seal_body(plain, key, NONCE)
    assert validate(sealed) == []
    assert set(sealed) == {"message_id", "room_topic", "sent_at", "from", "kind", "text", "cipher"}
    assert sealed["text"] == "" and SECRET not in json.dumps(sealed) and "mcid:x" not in str(sealed)
    assert open_body(sealed, key) == plain


def _with_box(sealed: dict[str, Any], box: bytes) -> dict[str, Any]:
    return sealed | {"cipher": sealed["cipher"] | {"box": base64.b64encode(box).decode()}}


def test_wrong_key_tampered_and_moved_bodies_are_refused() -> None:
    key = open_key_envelope(key_envelope(), BOB)
    assert key is not None
    sealed = seal_body(said(BOB), key, NONCE)
    other = RoomKey(key.room_topic, 1, key.key_id, key.recipients, bytes(32))
    with pytest.raises(RoomCryptoError, match="tampered"):  # same id, another key
        open_body(sealed, other)
    with pytest.raises(RoomCryptoError, match="wrong key"):
        open_body(sealed, RoomKey(key.room_topic, 2, key.key_id, key.recipients, key.key))
    raw = bytearray(base64.b64decode(sealed["cipher"]["box"]))
    raw[-1] ^= 1
    with pytest.raises(RoomCryptoError, match="tampered"):
        open_body(_with_box(sealed, bytes(raw)), key)
    with pytest.raises(RoomCryptoError, match="tampered"):
        open_body(_with_box(sealed, b"short"), key)
    moved = sealed | {"message_id": "m2"}  # a body replayed under another envelope
    with pytest.raises(RoomCryptoError, match="mismatch"):
        open_body(moved, key)
    with pytest.raises(RoomCryptoError):
        seal_body(said(BOB, topic="agents.room." + "0" * 32), key, NONCE)


def test_envelope_shapes_of_private_rooms() -> None:
    key = open_key_envelope(key_envelope(), BOB)
    assert key is not None
    sealed = seal_body(said(BOB), key, NONCE)
    assert validate(sealed | {"text": "leak"}) == [
        "text: a sealed envelope's text is empty (it travels inside cipher)"
    ]
    assert validate(sealed | {"refs": ["x"]}) == [
        "refs: travels inside cipher in a sealed envelope"
    ]
    assert validate(sealed | {"cipher": {"epoch": 0, "key_id": "x", "box": "!"}}) != []
    assert validate(said(BOB) | {"room_key": key_envelope()["room_key"]}) != []
    bare = key_envelope()
    del bare["room_key"]
    assert validate(bare) != []


# -- RoomKeys on a real store --------------------------------------------------------------------


@asynccontextmanager
async def keys_of(identity: Identity, path: Path) -> AsyncIterator[RoomKeys]:
    async with await RoomKeyStore.open(path / f"{identity.node_id.hex()[:8]}.sqlite3") as store:
        yield RoomKeys(identity, store, lambda: 5_000, random_bytes=counter_random())


def test_open_send_remove_over_room_keys(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            keys_of(ALICE, tmp_path) as alice,
            keys_of(BOB, tmp_path) as bob,
            keys_of(CAROL, tmp_path) as carol,
        ):
            first = await alice.create([BOB.node_id, CAROL.node_id], "k1")
            topic = first["room_topic"]
            assert (await bob.accept(first, ALICE.node_id)).keyed == 1
            assert (await carol.accept(first, ALICE.node_id)).keyed == 1
            assert (await bob.accept(first, ALICE.node_id)).outcome == "duplicate"
            wire = await bob.seal(said(BOB, topic=topic))
            assert "cipher" in wire and SECRET not in json.dumps(wire)
            heard = await alice.receive(wire, BOB.node_id, True)
            assert [h.envelope["text"] for h in heard] == [SECRET]
            assert await alice.receive(wire, BOB.node_id, False) == []  # no publisher_sig

            # alice removes bob: epoch 2, sealed to carol and alice only
            second = await alice.remove(topic, [BOB.node_id], "k2")
            assert second["room_key"]["epoch"] == 2
            assert BOB.node_id.hex() not in second["room_key"]["sealed"]
            assert await bob.receive(second, ALICE.node_id, True) == []
            assert bob.stats["epochs_without_our_key"] == 1
            assert await carol.receive(second, ALICE.node_id, True) == []
            after = await alice.seal(said(ALICE, "after the removal", topic, "m2"))
            assert after["cipher"]["epoch"] == 2
            assert await bob.receive(after, ALICE.node_id, True) == []  # held, never shown
            assert bob.stats["undecryptable"] == 1 and await bob.undecryptable(topic) == 1
            assert [
                h.envelope["text"] for h in await carol.receive(after, ALICE.node_id, True)
            ] == ["after the removal"]
            # bob can no longer talk, and his old key no longer counts
            with pytest.raises(RoomKeyError, match="no key"):
                await bob.seal(said(BOB, "still here?", topic, "m3"))
            stale = seal_body(said(BOB, "old key", topic, "m4"), await _key(bob, topic, 1), NONCE)
            assert await carol.receive(stale, BOB.node_id, True) == []
            assert carol.stats["sealed_from_non_participant"] == 1
            # but a bare participant_left may still go out in the clear, and is taken
            left = said(BOB, topic=topic, mid="m5") | {"kind": "participant_left", "text": ""}
            del left["refs"]
            assert await bob.seal(left) == left
            assert len(await carol.receive(left, BOB.node_id, True)) == 1
            # plaintext talk in a private room is refused
            assert await carol.receive(said(BOB, topic=topic, mid="m6"), BOB.node_id, True) == []
            assert carol.stats["plaintext_refused"] == 1
            # a replayed older epoch does not roll the key back
            assert (await carol.accept(first, ALICE.node_id)).outcome == "stale"
            assert (await carol.store.room(topic)).epoch == 2  # type: ignore[union-attr]
            # only the opener rekeys
            with pytest.raises(RoomKeyError, match="only the opener"):
                await carol.remove(topic, [ALICE.node_id], "k3")

    run(main())


async def _key(keys: RoomKeys, topic: str, epoch: int) -> RoomKey:
    key = await keys.store.key(topic, epoch)
    assert key is not None
    return key


def test_an_envelope_before_its_key_is_held_then_opened(tmp_path: Path) -> None:
    async def main() -> None:
        async with keys_of(ALICE, tmp_path) as alice, keys_of(BOB, tmp_path) as bob:
            first = await alice.create([BOB.node_id], "k1")
            topic = first["room_topic"]
            early = await alice.seal(said(ALICE, "early", topic, "m1"))
            assert await bob.receive(early, ALICE.node_id, True) == []
            released = await bob.receive(first, ALICE.node_id, True)
            assert [h.envelope["text"] for h in released] == ["early"]
            assert await bob.undecryptable(topic) == 0
            # the opener hands the key again to a participant who joins; rekeys when one leaves
            joined = said(BOB, topic=topic, mid="j") | {"kind": "participant_joined", "text": ""}
            del joined["refs"]
            assert await alice.followup(joined) == first
            left = joined | {"message_id": "l", "kind": "participant_left"}
            rekeyed = await alice.followup(left)
            assert rekeyed is not None and rekeyed["room_key"]["epoch"] == 2
            assert list(rekeyed["room_key"]["sealed"]) == [ALICE.node_id.hex()]
            stranger = joined | {"from": CAROL.node_id.hex()}
            assert await alice.followup(stranger) is None

    run(main())


def test_refused_key_envelopes_and_invitations(tmp_path: Path) -> None:
    async def main() -> None:
        async with keys_of(ALICE, tmp_path) as alice, keys_of(CAROL, tmp_path) as carol:
            first = await alice.create([], "k1")
            topic = first["room_topic"]
            forged = key_envelope(CAROL, recipients=(ALICE,))
            forged["room_topic"] = topic
            accepted = await alice.accept(forged, CAROL.node_id)
            assert accepted.outcome == "refused" and alice.stats["key_envelopes_refused"] == 1
            assert await alice.receive(forged, CAROL.node_id, True) == []
            assert (await alice.store.room(topic)).epoch == 1  # type: ignore[union-attr]
            assert (await alice.accept("not an envelope", None)).outcome == "refused"
            # inviting someone not yet keyed takes a new epoch; someone keyed gets the current
            invite, rekeyed = await alice.invitation(topic, CAROL.node_id, "k2")
            assert rekeyed == 1 and invite is not None and invite["room_key"]["epoch"] == 2
            again, rekeyed = await alice.invitation(topic, CAROL.node_id, "k3")
            assert rekeyed == 0 and again == invite
            assert await alice.invitation("agents.room." + "0" * 32, CAROL.node_id, "k4") == (
                None,
                0,
            )
            await carol.accept(invite, ALICE.node_id)
            with pytest.raises(RoomKeyError, match="only its opener"):
                await carol.invitation(topic, BOB.node_id, "k5")
            with pytest.raises(RoomKeyError, match="at most"):
                alice.max_recipients = 2
                await alice.create([BOB.node_id, CAROL.node_id], "k6")

    run(main())


def test_the_key_file_is_private(tmp_path: Path) -> None:
    async def main() -> None:
        async with keys_of(ALICE, tmp_path) as alice:
            await alice.create([BOB.node_id], "k1")
            assert stat.S_IMODE(alice.store.path.stat().st_mode) == 0o600

    run(main())


def test_sealed_boxes_are_plain_nacl() -> None:
    """An invitee with nothing but PyNaCl and its seed opens its key (interoperability)."""
    envelope = key_envelope()
    raw = base64.b64decode(envelope["room_key"]["sealed"][BOB.node_id.hex()])
    private = nacl.signing.SigningKey(BOB.seed).to_curve25519_private_key()
    assert nacl.public.SealedBox(private).decrypt(raw) == KEY


def test_a_leave_and_a_removal_at_once_make_one_new_epoch(tmp_path: Path) -> None:
    async def main() -> None:
        async with keys_of(ALICE, tmp_path) as alice:
            first = await alice.create([BOB.node_id, CAROL.node_id], "k1")
            topic = first["room_topic"]
            left = said(BOB, topic=topic, mid="l") | {"kind": "participant_left", "text": ""}
            del left["refs"]
            removal, followup = await asyncio.gather(
                alice.remove(topic, [BOB.node_id], "k2"),
                alice.followup(left),
                return_exceptions=True,
            )
            assert isinstance(removal, dict) and followup is None
            room = await alice.store.room(topic)
            assert room is not None and room.epoch == 2
            assert BOB.node_id.hex() not in room.recipients
            with pytest.raises(RoomKeyError, match="not participants"):
                await alice.remove(topic, [BOB.node_id], "k3")
            with pytest.raises(RoomKeyError, match="close it"):
                await alice.remove(topic, [ALICE.node_id], "k4")

    run(main())


# -- the memo of RoomKeyStore.room ---------------------------------------------------------------


async def _privacy_reads(store: RoomKeyStore) -> list[str]:
    """Every statement that reads a room's row from ``private_rooms``, from now on."""
    reads: list[str] = []

    def traced(sql: str) -> None:
        if sql.startswith("SELECT room_topic, opener_hex"):
            reads.append(sql)

    await store._db.set_trace_callback(traced)
    return reads


def test_a_rooms_privacy_is_read_from_the_file_once_then_remembered(tmp_path: Path) -> None:
    """Every envelope sent or heard asks whether its room is private: one read per topic."""

    async def main() -> None:
        async with keys_of(BOB, tmp_path) as bob:
            reads = await _privacy_reads(bob.store)
            topic = "agents.room." + "ab" * 16
            for n in range(5):
                envelope = said(BOB, f"plain {n}", topic, f"m{n}")
                assert await bob.seal(envelope) == envelope  # not private: sent as it is
                assert len(await bob.receive(envelope, BOB.node_id, True)) == 1
            assert len(reads) == 1, reads

    run(main())


def test_a_room_that_turns_private_is_sealed_at_once(tmp_path: Path) -> None:
    """A key accepted (a write to private_rooms) empties the memo: the next seal seals."""

    async def main() -> None:
        async with keys_of(ALICE, tmp_path) as alice, keys_of(BOB, tmp_path) as bob:
            first = await alice.create([BOB.node_id], "k1")
            topic = first["room_topic"]
            assert await bob.store.room(topic) is None  # remembered: not private
            envelope = said(BOB, topic=topic)
            assert await bob.seal(envelope) == envelope
            assert (await bob.accept(first, ALICE.node_id)).keyed == 1
            assert "cipher" in await bob.seal(envelope)
            assert await bob.receive(said(ALICE, topic=topic), ALICE.node_id, True) == []

    run(main())


def test_a_read_that_a_write_overlapped_is_not_remembered(tmp_path: Path) -> None:
    async def main() -> None:
        async with keys_of(ALICE, tmp_path) as alice, keys_of(BOB, tmp_path) as bob:
            first = await alice.create([BOB.node_id], "k1")
            topic = first["room_topic"]
            store = bob.store
            read_room = store._read_room
            gate = asyncio.Event()

            was_read = asyncio.Event()

            async def slow_read(read_topic: str) -> Any:
                found = await read_room(read_topic)  # read before the write...
                was_read.set()
                await gate.wait()  # ...returned after it
                return found

            store._read_room = slow_read  # type: ignore[method-assign]
            stale = asyncio.create_task(store.room(topic))
            await was_read.wait()
            assert (await bob.accept(first, ALICE.node_id)).keyed == 1
            gate.set()
            assert await stale is None  # what the file said when it was read
            store._read_room = read_room  # type: ignore[method-assign]
            assert (await store.room(topic)) is not None  # read again, not the stale answer

    run(main())
