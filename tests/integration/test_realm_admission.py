"""``--admission open|allowlist|members`` on a real station, raw CONNECTs (issue 13): a refused
CONNECT gets HELLO accepted "false" with a §9 code; the allowlist file is re-read when it
changes (a bad edit keeps the old list); ``members`` admits a CONNECT whose ``endorsements``
hold a valid endorsement of a protected realm, and that connection is a member at once."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from macula.wire.codes import ErrorCode
from macula.wire.frames import Connect
from macula.wire.identity import Identity
from macula.wire.records import Record
from relay.realms.admission import AdmissionMode
from relay.realms.gate import ProtectedRealm
from relay.station.station import Station, StationConfig
from support.meshkit import station_config
from support.rawclient import RawClient, raw_client, stamp
from support.realmkit import PRIVATE, REALM_NAME, endorse, is_event, publish, refused, subscribe
from support.waiting import eventually

pytestmark = pytest.mark.anyio

AUTHORITY = Identity.generate(os.urandom)
NEWS = "members.news"


def new_id() -> Identity:
    return Identity.generate(os.urandom)


def config(tmp_path: Path, mode: AdmissionMode, allowlist: Path | None = None) -> StationConfig:
    cfg = station_config(tmp_path / "station")
    cfg.realms = [ProtectedRealm(REALM_NAME, PRIVATE, AUTHORITY.node_id)]
    cfg.admission = mode
    cfg.allowlist = allowlist
    return cfg


@asynccontextmanager
async def connecting(
    station: Station, identity: Identity, endorsements: Sequence[object] = ()
) -> AsyncIterator[tuple[RawClient, dict[str, Any]]]:
    """A raw connection whose CONNECT carries ``endorsements``; with the HELLO map."""
    async with raw_client(station, identity, handshake=False) as raw:
        raw.control = raw.new_stream()
        items = [e.to_rpc() if isinstance(e, Record) else e for e in endorsements]
        raw.send(
            Connect(
                **stamp(),
                node_id=identity.node_id,
                station_id=identity.node_id,
                puzzle_evidence=identity.puzzle_evidence,
                endorsements=items,
            )
        )
        hello = await raw.expect(lambda r: r.frame_type == "hello")
        yield raw, hello.frame


async def test_allowlist_admits_the_listed_and_rereads_the_file(tmp_path: Path) -> None:
    alice, eve = new_id(), new_id()
    listed = tmp_path / "allowlist"
    listed.write_text(f"# team\n{alice.node_id.hex()}\n\n")
    async with Station(config(tmp_path, AdmissionMode.ALLOWLIST, listed)) as station:
        async with connecting(station, alice) as (_, hello):
            assert hello["accepted"] == "true"
        async with connecting(station, eve) as (raw, hello):
            assert hello["accepted"] == "false"
            assert hello["refusal_code"] == ErrorCode.UNAUTHORIZED
            await raw.wait_lost()
        assert station.core.stats["handshakes_refused"] == 1
        # a bad edit keeps the old list (and is not retried until the file changes again)
        listed.write_text(f"{alice.node_id.hex()}\nnot a node id\n{eve.node_id.hex()}\n")
        allowlist = station.allowlist
        assert allowlist is not None
        await eventually(lambda: allowlist.failed_reloads == 1)
        assert allowlist.ids == {alice.node_id}
        # the file edited: eve is in, alice is out (for new connections)
        listed.write_text(f"{eve.node_id.hex()}  # eve\n")
        await eventually(lambda: allowlist.ids == {eve.node_id})
        async with connecting(station, eve) as (_, hello):
            assert hello["accepted"] == "true"
        async with connecting(station, alice) as (_, hello):
            assert (hello["accepted"], hello["refusal_code"]) == ("false", ErrorCode.UNAUTHORIZED)


async def test_members_admits_a_connect_carrying_a_valid_endorsement(tmp_path: Path) -> None:
    alice, bob, eve = new_id(), new_id(), new_id()
    async with Station(config(tmp_path, AdmissionMode.MEMBERS)) as station:
        async with connecting(station, eve) as (_, hello):  # no endorsement
            assert (hello["accepted"], hello["refusal_code"]) == (
                "false",
                ErrorCode.TARGET_REALM_REFUSED,
            )
        bad = [
            endorse(AUTHORITY, alice.node_id),  # another node's
            endorse(eve, eve.node_id),  # not signed by the authority
            endorse(AUTHORITY, eve.node_id, valid_until=1),  # expired
            "not a record",
        ]
        async with connecting(station, eve, bad) as (_, hello):
            assert hello["accepted"] == "false"
        good_a = endorse(AUTHORITY, alice.node_id)
        good_b = endorse(AUTHORITY, bob.node_id)
        async with (
            connecting(station, alice, [good_a]) as (a, hello_a),
            connecting(station, bob, ["junk", good_b]) as (b, hello_b),
        ):
            assert hello_a["accepted"] == hello_b["accepted"] == "true"
            # members from the CONNECT on: no _realm.present needed
            subscribe(a, NEWS)
            await a.flush()
            publish(b, NEWS, 1, "hello members")
            await a.expect(is_event(NEWS, "hello members"))
            assert await refused(b) == {}
        assert station.core.stats["handshakes_refused"] == 2


async def test_open_admits_anyone_and_needs_no_endorsement(tmp_path: Path) -> None:
    async with (
        Station(config(tmp_path, AdmissionMode.OPEN)) as station,
        connecting(station, new_id()) as (raw, hello),
    ):
        assert hello["accepted"] == "true"
        subscribe(raw, NEWS)  # connected, but not a member of the protected realm
        assert (await refused(raw))["realm_refused"] == 1


async def test_a_station_needs_an_allowlist_or_a_realm_for_its_mode(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="allowlist file"):
        async with Station(config(tmp_path, AdmissionMode.ALLOWLIST)):
            pass
    cfg = config(tmp_path, AdmissionMode.MEMBERS)
    cfg.realms = []
    with pytest.raises(ValueError, match="protected realm"):
        async with Station(cfg):
            pass
