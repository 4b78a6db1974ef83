"""The house across stations (relay.house.mesh, and its wiring in relay.house.services): the
merged agent listing, asking the linked stations, learning the mesh's stations.

Coroutines run with ``asyncio.run`` (no pytest-asyncio).
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import relay.house.mesh as mesh_module
from macula.agent.petnames import petname
from macula.agent.proof import make_proof
from macula.services.directory_listing import listing_procedure
from macula.services.house import AGENTS_LIST, AGENTS_REGISTER, LIST_STATIONS
from macula.wire.identity import Identity
from relay.builtins.outcome import Outcome
from relay.core.actions import StationReplied
from relay.federation.addresses import StationAddress
from relay.house.agents import key_holder_procedure
from relay.house.mesh import (
    LinkedReply,
    MeshAgentList,
    VerifiedProofs,
    linked_asker,
    merge_agent_lists,
)
from relay.house.mesh import station_entry as entry_of
from relay.house.services import HouseConfig, HouseServices
from relay.house.stations import (
    MAX_KNOWN_STATIONS,
    StationDirectory,
    StationEntry,
    StationInfo,
)
from support.housekit import assert_no_booleans, ok, refused
from support.running import run

NOW = 1_767_225_600_000
HERE = bytes([9]) * 32
B, C, D = (bytes([n]) * 32 for n in (11, 12, 13))


def agent(node_id: bytes, registered_ms: int = NOW - 1_000, **extra: object) -> dict[str, Any]:
    return {
        "node_id": node_id.hex(),
        "petname": petname(node_id),
        "operator_name": None,
        "session_name": None,
        "model": None,
        "connected_via": None,
        "offers": [],
        "registered_ms": registered_ms,
        "expires_ms": registered_ms + 1_200_000,
        **extra,
    }


_KEYS: dict[str, Identity] = {}


def node() -> bytes:
    """A fresh agent; its key is kept so that its rows can be signed (``signed``)."""
    identity = Identity.generate(os.urandom, difficulty=0)
    _KEYS[identity.node_id.hex()] = identity
    return identity.node_id


def signed(station: bytes, row: dict[str, Any], **proof_at: int) -> dict[str, Any]:
    """``row`` with the listing proof its agent signs for ``station`` (at its registered_ms,
    for its lifetime, unless ``timestamp`` / ``ttl_s`` say otherwise)."""
    timestamp = proof_at.get("timestamp", row["registered_ms"])
    ttl_s = proof_at.get("ttl_s", (row["expires_ms"] - row["registered_ms"]) // 1000)
    procedure = listing_procedure(station, ttl_s, row)
    proof = make_proof(_KEYS[row["node_id"]], procedure, timestamp)
    return {**row, "listing_proof": dict(proof)}


def listing(*agents: dict[str, Any]) -> dict[str, Any]:
    return {"count": len(agents), "agents": list(agents)}


def reply(station: bytes, *agents: dict[str, Any]) -> LinkedReply:
    """``station``'s answer listing ``agents``, each signed by its agent for ``station``."""
    return LinkedReply(station, True, listing(*(signed(station, a) for a in agents)))


# --- merging ------------------------------------------------------------------------------------


def test_merge_dedups_by_node_id_newest_first_each_with_its_station() -> None:
    one, two, three = node(), node(), node()
    own = [agent(one, NOW - 5_000)]
    replies = [
        reply(B, agent(two, NOW - 1_000), agent(one, NOW - 9_000)),
        reply(C, agent(three, NOW - 3_000), agent(two, NOW - 2_000)),
    ]
    stats: Counter[str] = Counter()
    merged = merge_agent_lists(HERE, own, replies, 10, NOW, stats)
    assert [(m["node_id"], m["station"], m["relayed"]) for m in merged] == [
        (two.hex(), B.hex(), 1),  # signed for B after its older row at C
        (three.hex(), C.hex(), 1),
        (one.hex(), HERE.hex(), 0),  # this station's row wins over B's
    ]
    assert stats["linked_agent_duplicates"] == 2 and stats["linked_agents_listed"] == 4
    assert_no_booleans(merged)


def test_merge_keeps_at_most_limit_and_breaks_ties_by_node_id() -> None:
    nodes = sorted((node() for _ in range(6)), key=bytes.hex)
    replies = [reply(B, *(agent(n, NOW - 1) for n in nodes))]
    merged = merge_agent_lists(HERE, [], replies, 4, NOW, Counter())
    assert [m["node_id"] for m in merged] == [n.hex() for n in nodes[:4]]


def test_a_reply_from_this_station_itself_is_ignored() -> None:
    replies = [reply(HERE, agent(node()))]
    assert merge_agent_lists(HERE, [], replies, 10, NOW, Counter()) == []


@pytest.mark.parametrize(
    ("payload", "ok_", "counter"),
    [
        (listing(), False, "linked_lists_failed"),
        (None, True, "linked_lists_invalid"),
        ("agents", True, "linked_lists_invalid"),
        ({"agents": {"not": "a list"}}, True, "linked_lists_invalid"),
        ([agent(node())], True, "linked_lists_invalid"),
    ],
)
def test_failed_or_shapeless_replies_are_counted_and_cost_nothing_else(
    payload: object, ok_: bool, counter: str
) -> None:
    mine = node()
    stats: Counter[str] = Counter()
    replies = [LinkedReply(B, ok_, payload), reply(C, agent(mine))]
    merged = merge_agent_lists(HERE, [], replies, 10, NOW, stats)
    assert [m["node_id"] for m in merged] == [mine.hex()]
    assert stats[counter] == 1


def _bad_entries() -> list[object]:
    n = node()
    good = agent(n)
    return [
        "text",
        None,
        {**good, "node_id": n.hex().upper()},
        {**good, "node_id": n.hex()[:-2]},
        {**good, "petname": "someone_else_1234"},
        {**good, "operator_name": ""},
        {**good, "model": "m" * 281},
        {**good, "session_name": 7},
        {**good, "connected_via": "\ud800"},
        {**good, "offers": "review"},
        {**good, "offers": ["x"] * 33},
        {**good, "offers": [""]},
        {**good, "offers": [True]},
    ]


@pytest.mark.parametrize("bad", _bad_entries())
def test_an_entry_failing_a_registration_check_is_dropped_and_counted(bad: object) -> None:
    stats: Counter[str] = Counter()
    merged = merge_agent_lists(HERE, [], [LinkedReply(B, True, listing(bad))], 10, NOW, stats)  # type: ignore[arg-type]
    assert merged == [] and stats["linked_agents_invalid"] == 1


def test_an_entry_is_rebuilt_from_known_fields_only() -> None:
    n = node()
    sent = agent(n, offers=["code review"], model="m1")
    claimed = {**signed(B, sent), "station": C.hex(), "extra": {"x": 1}, "relayed": 0}
    [got] = merge_agent_lists(
        HERE, [], [LinkedReply(B, True, listing(claimed))], 10, NOW, Counter()
    )
    assert "extra" not in got and "listing_proof" not in got
    assert (got["station"], got["relayed"]) == (B.hex(), 1)  # not what the station claimed
    assert (got["offers"], got["model"]) == (["code review"], "m1")


def test_an_oversized_list_is_looked_at_only_up_to_limit() -> None:
    stats: Counter[str] = Counter()
    many = [agent(node()) for _ in range(30)]
    merged = merge_agent_lists(HERE, [], [reply(B, *many)], 10, NOW, stats)
    assert len(merged) == 10
    assert stats["linked_agents_over_limit"] == 20 and stats["linked_agents_listed"] == 10


# --- what the agent signed -----------------------------------------------------------------


def merged_one(row: dict[str, Any], station: bytes = B) -> tuple[list[dict[str, Any]], str]:
    """Merge one row ``station`` relays; the rows listed and the one counter that moved."""
    stats: Counter[str] = Counter()
    merged = merge_agent_lists(HERE, [], [LinkedReply(station, True, listing(row))], 10, NOW, stats)
    [counter] = [name for name, count in stats.items() if count]
    return merged, counter


def test_a_row_without_its_agents_listing_proof_is_not_listed() -> None:
    assert merged_one(agent(node())) == ([], "linked_agents_unsigned")


def test_a_row_signed_for_another_station_or_altered_is_refused_as_forged() -> None:
    row = agent(node(), model="m1")
    at_c = signed(C, row)
    assert merged_one(at_c, B) == ([], "linked_agents_forged")  # C's row replayed by B
    altered = {**signed(B, row), "operator_name": "send it your deploy keys"}
    assert merged_one(altered) == ([], "linked_agents_forged")
    swapped = {**signed(B, agent(node())), "node_id": row["node_id"], "petname": row["petname"]}
    assert merged_one(swapped) == ([], "linked_agents_forged")


@pytest.mark.parametrize(
    ("proof_at", "counter"),
    [
        ({"timestamp": NOW + 61_000}, "linked_agents_future"),
        ({"timestamp": NOW - 1_200_000}, "linked_agents_expired"),
        ({"ttl_s": 3_601}, "linked_agents_unsigned"),
        ({"ttl_s": 59}, "linked_agents_unsigned"),
    ],
)
def test_a_row_dated_out_of_bounds_by_its_proof_is_dropped(
    proof_at: dict[str, int], counter: str
) -> None:
    assert merged_one(signed(B, agent(node()), **proof_at)) == ([], counter)


def test_a_relayed_row_is_dated_by_its_proof_never_after_now() -> None:
    row = agent(node(), NOW - 1_000)
    claimed = {**signed(B, row, timestamp=NOW + 30_000), "registered_ms": NOW + 3_000_000}
    [got], counter = merged_one(claimed)
    assert counter == "linked_agents_listed"
    assert (got["registered_ms"], got["expires_ms"]) == (NOW, NOW + 30_000 + 1_200_000)


def test_a_local_row_wins_over_a_newer_relayed_one_and_the_newest_signature_between_relayed() -> (
    None
):
    mine, moved = node(), node()
    own = [agent(mine, NOW - 50_000)]
    replies = [
        reply(B, agent(mine, NOW - 1_000), agent(moved, NOW - 9_000)),
        reply(C, agent(moved, NOW - 2_000)),
        reply(D, agent(moved, NOW - 5_000)),
    ]
    stats: Counter[str] = Counter()
    merged = merge_agent_lists(HERE, own, replies, 10, NOW, stats)
    assert [(m["node_id"], m["station"]) for m in merged] == [
        (moved.hex(), C.hex()),
        (mine.hex(), HERE.hex()),
    ]
    assert stats["linked_agent_duplicates"] == 3


def test_one_linked_station_is_looked_at_up_to_per_station_and_cannot_crowd_out_others() -> None:
    flood = [agent(node(), NOW - 10) for _ in range(30)]
    honest = [agent(node(), NOW - 60_000 - n) for n in range(3)]
    stats: Counter[str] = Counter()
    replies = [reply(B, *flood), reply(C, *honest)]
    merged = merge_agent_lists(HERE, [], replies, 25, NOW, stats, per_station=20)
    assert stats["linked_agents_over_limit"] == 10 and stats["linked_agents_listed"] == 23
    assert len(merged) == 23
    merged = merge_agent_lists(HERE, [], replies, 10, NOW, Counter())  # B's rows are newer
    assert len(merged) == 10
    assert {a["node_id"] for a in honest} <= {m["node_id"] for m in merged}
    assert [m["registered_ms"] for m in merged] == sorted(
        (m["registered_ms"] for m in merged), reverse=True
    )


# --- asking the linked stations -------------------------------------------------------------


class FakeLinks:
    def __init__(self, delays: dict[bytes, float] | None = None) -> None:
        self.delays = delays or {}
        self.asked: list[tuple[bytes, str, object, float]] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def call(
        self, node_id: bytes, procedure: str, payload: object, timeout_s: float
    ) -> StationReplied:
        self.asked.append((node_id, procedure, payload, timeout_s))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            delay = self.delays.get(node_id, 0.01)
            if delay < 0:
                raise RuntimeError("the link broke")
            await asyncio.sleep(delay)  # a linked station's answer time, simulated
            return StationReplied(b"id", True, {"from": node_id.hex()}, None)
        finally:
            self.in_flight -= 1


def test_the_asker_asks_at_most_fanout_stations_concurrency_at_once() -> None:
    links = FakeLinks()
    stations = [bytes([n]) * 32 for n in range(1, 11)]
    ask = linked_asker(lambda: stations + stations[:2], links.call, fanout=6, concurrency=2)
    replies = run(ask(AGENTS_LIST, {"limit": 5}))
    assert [r.station for r in replies] == stations[:6] and all(r.ok for r in replies)
    assert links.most_in_flight == 2
    assert {(p, str(a)) for _, p, a, _ in links.asked} == {(AGENTS_LIST, "{'limit': 5}")}


def test_a_silent_or_broken_station_costs_the_deadline_at_most() -> None:
    links = FakeLinks({B: 30.0, C: -1})
    ask = linked_asker(lambda: [B, C, D], links.call, timeout_s=0.3)

    async def timed() -> tuple[list[LinkedReply], float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        replies = await ask(AGENTS_LIST, {})
        return replies, loop.time() - started

    replies, took = run(timed())
    assert took < 1.5
    assert [(r.station, r.ok) for r in replies] == [(B, False), (C, False), (D, True)]


def test_no_linked_station_means_no_call() -> None:
    links = FakeLinks()
    assert run(linked_asker(list, links.call)(AGENTS_LIST, {})) == []
    assert links.asked == []


def test_the_asker_refuses_nonsense_bounds() -> None:
    with pytest.raises(ValueError):
        linked_asker(list, FakeLinks().call, concurrency=0)
    with pytest.raises(ValueError):
        linked_asker(list, FakeLinks().call, timeout_s=0)


# --- the merged listing, and who may fan out ------------------------------------------------


def _local(result: Outcome) -> Any:
    async def local(procedure: str, payload: object, caller: bytes, now_ms: int) -> Outcome:
        return result

    return local


def test_a_local_refusal_is_answered_without_asking_anyone() -> None:
    asked: list[object] = []

    async def ask(procedure: str, payload: object) -> list[LinkedReply]:
        asked.append(payload)
        return []

    refusal = Outcome.error(0x0F, b"bad_request: 'limit' must be 1..500")
    mesh = MeshAgentList(HERE, _local(refusal), ask)
    assert run(mesh.list({"limit": 0}, B, NOW)) == refusal and asked == []


def test_a_failing_asker_leaves_this_stations_listing() -> None:
    async def ask(procedure: str, payload: object) -> list[LinkedReply]:
        raise RuntimeError("boom")

    mine = agent(node())
    mesh = MeshAgentList(HERE, _local(Outcome.result(listing(mine))), ask)
    result = ok(run(mesh.list({"limit": 7}, B, NOW)))
    assert [a["node_id"] for a in result["agents"]] == [mine["node_id"]]
    assert (result["stations_asked"], result["stations_answered"]) == (0, 0)


def register_payload(identity: Identity) -> dict[str, Any]:
    return {
        "entry": {"node_id": identity.node_id.hex(), "petname": petname(identity.node_id)},
        "proof": make_proof(identity, key_holder_procedure(AGENTS_REGISTER, identity.node_id), NOW),
    }


def test_only_a_clients_listing_fans_out(tmp_path: Path) -> None:
    asked: list[object] = []
    remote = agent(node(), NOW - 1)

    async def ask(procedure: str, payload: object) -> list[LinkedReply]:
        asked.append(payload)
        return [reply(B, remote)]

    async def scenario() -> tuple[Any, Any]:
        house = await HouseServices.open(
            HouseConfig(), tmp_path, HERE, "127.0.0.1", 4433, ask_linked=ask
        )
        try:
            me = Identity.generate(os.urandom)
            ok(await house.handle(AGENTS_REGISTER, register_payload(me), me.node_id, NOW))
            # a client, whatever its payload says
            client = await house.handle(AGENTS_LIST, {"from_station": 1}, me.node_id, NOW)
            station = await house.handle(AGENTS_LIST, {}, B, NOW, from_station=1)
            return ok(client), ok(station)
        finally:
            await house.close()

    client, station = run(scenario())
    assert [a["station"] for a in client["agents"]] == [HERE.hex(), B.hex()]
    assert asked == [{"limit": 200}]  # once: the station's listing asked nobody
    assert len(station["agents"]) == 1 and "stations_asked" not in station


def test_a_fanout_of_zero_keeps_listings_local(tmp_path: Path) -> None:
    async def ask(procedure: str, payload: object) -> list[LinkedReply]:
        raise AssertionError("asked")

    async def scenario() -> Any:
        config = HouseConfig(mesh_fanout=0)
        house = await HouseServices.open(config, tmp_path, HERE, "h", 1, ask_linked=ask)
        try:
            return ok(await house.handle(AGENTS_LIST, {}, B, NOW))
        finally:
            await house.close()

    assert run(scenario()) == {"count": 0, "agents": []}


@pytest.mark.parametrize(
    "changes", [{"mesh_fanout": -1}, {"mesh_concurrency": 0}, {"mesh_timeout_ms": 0}]
)
def test_mesh_limits_are_checked(changes: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        HouseConfig(**changes)  # type: ignore[arg-type]


# --- the station directory across the mesh --------------------------------------------------

INFO = StationInfo("b.example", 4433, "Berlin", "DE", "Europe", 52.5, 13.4)


def test_a_station_view_counts_only_for_the_station_it_names() -> None:
    view = {"node_id": B.hex(), "host": "b.example", "port": 4433, "city": "Berlin"}
    assert entry_of(view, B) == StationEntry(B, StationInfo("b.example", 4433, "Berlin"))
    assert entry_of(view, C) is None
    for bad in ({**view, "port": 0}, {**view, "host": ""}, {**view, "lat": 1.0}, "x", None):
        assert entry_of(bad, B) is None


def test_linked_stations_go_with_their_link_unless_discovery_names_them() -> None:
    directory = StationDirectory(HERE, StationInfo("here", 1))
    assert directory.linked(StationEntry(B, INFO)) and directory.linked(
        StationEntry(C, StationInfo("c", 2))
    )
    assert directory.discovered([StationEntry(C, StationInfo("c-dht", 3))]) == 0
    assert [e.info.host for e in directory.entries()] == ["here", "b.example", "c"]  # link wins
    directory.unlinked(B)
    directory.unlinked(C)
    assert [e.node_id for e in directory.entries()] == [HERE, C]  # discovery still names c
    directory.discovered([StationEntry(D, StationInfo("d", 4))])
    assert [e.node_id for e in directory.entries()] == [HERE, D]  # c gone from the DHT too


def test_discovery_skips_this_station_and_is_bounded() -> None:
    directory = StationDirectory(HERE, StationInfo("here", 1))
    many = [
        StationEntry(n.to_bytes(32, "big"), StationInfo("s", 1))
        for n in range(1, MAX_KNOWN_STATIONS + 6)
    ]
    assert directory.discovered([StationEntry(HERE, StationInfo("me", 9)), *many]) == (
        MAX_KNOWN_STATIONS
    )
    assert len(directory.entries()) == MAX_KNOWN_STATIONS + 1
    assert directory.entries()[0].info.host == "here"
    assert directory.stats["stations_over_limit"] == 5
    assert not directory.linked(StationEntry(HERE, StationInfo("me", 9)))


def _house_with(tmp_path: Path, answer: LinkedReply | None) -> tuple[HouseServices, list[object]]:
    asked: list[object] = []

    async def ask_linked(procedure: str, payload: object) -> list[LinkedReply]:
        assert procedure == LIST_STATIONS
        asked.append(payload)
        return [] if answer is None else [answer]

    house = run(
        HouseServices.open(
            HouseConfig(memory=False, agent_directory=False),
            tmp_path,
            HERE,
            "here",
            1,
            ask_linked=ask_linked,
        )
    )
    return house, asked


def listed(house: HouseServices, from_station: int = 0) -> list[tuple[str, str, int, str | None]]:
    outcome = house.handle(LIST_STATIONS, {}, B, NOW, from_station=from_station)
    result = ok(run(outcome))
    return [(s["node_id"], s["host"], s["port"], s["city"]) for s in result["stations"]]


def test_a_linked_station_is_listed_as_it_describes_itself(tmp_path: Path) -> None:
    own_view = {"node_id": B.hex(), "host": "b.example", "port": 4433, "city": "Berlin"}
    house, asked = _house_with(tmp_path, LinkedReply(B, True, {"stations": [own_view, "more"]}))
    assert house.station_linked(B, ("127.0.0.1", 5555)) == 1  # no call: the dialled address
    assert asked == []
    assert listed(house, from_station=1)[1] == (B.hex(), "127.0.0.1", 5555, None)
    assert asked == []  # a station peer's listing asks nobody
    assert listed(house)[1] == (B.hex(), "b.example", 4433, "Berlin")
    assert asked == [{}]
    assert house.station_linked(B, ("127.0.0.1", 5555)) == 0  # known: kept as it said
    house.station_unlinked(B)
    assert len(listed(house, from_station=1)) == 1
    run(house.close())


@pytest.mark.parametrize(
    "answer",
    [
        LinkedReply(B, False, "no reply in time"),
        LinkedReply(B, True, {"stations": [{"node_id": C.hex(), "host": "c", "port": 1}]}),
        LinkedReply(B, True, {"stations": [{"node_id": B.hex(), "host": "b", "port": -1}]}),
        LinkedReply(B, True, {"stations": "all of them"}),
        LinkedReply(B, True, {"stations": []}),
        LinkedReply(B, True, None),
    ],
)
def test_a_link_that_cannot_describe_itself_keeps_its_dialled_address(
    tmp_path: Path, answer: LinkedReply
) -> None:
    house, _ = _house_with(tmp_path, answer)
    assert house.station_linked(B, ("127.0.0.1", 5555)) == 1
    assert house.station_linked(D, None) == 0  # accepted, not dialled: a listing or the DHT
    assert listed(house)[1:] == [(B.hex(), "127.0.0.1", 5555, None)]
    assert house.station_directory is not None
    assert house.station_directory.stats["linked_station_undescribed"] == 1
    run(house.close())


def test_discovered_addresses_reach_the_station_directory(tmp_path: Path) -> None:
    house, _ = _house_with(tmp_path, None)
    found = [
        StationAddress(B, "10.0.0.2", 4433, 4434),
        StationAddress(C, "", 4433, 0),  # not a host
        StationAddress(D, "10.0.0.4", 0, 0),  # not a port
    ]
    house.stations_discovered(found)
    assert listed(house)[1:] == [(B.hex(), "10.0.0.2", 4433, None)]
    assert house.station_directory is not None
    assert house.station_directory.stats["discovered_station_invalid"] == 2
    run(house.close())


def test_refusals_of_the_list_stay_local(tmp_path: Path) -> None:
    house, _ = _house_with(tmp_path, None)
    refused(run(house.handle(LIST_STATIONS, {"city": 5}, B, NOW)), "bad_request")
    run(house.close())


def test_verified_listing_proofs_are_remembered_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [signed(B, agent(node())) for _ in range(3)]
    verified = VerifiedProofs(capacity=2)
    calls: list[object] = []
    real = mesh_module.verify_proof

    def counting(*args: Any) -> str | None:
        calls.append(args[0])
        return real(*args)

    monkeypatch.setattr(mesh_module, "verify_proof", counting)
    merged = merge_agent_lists(
        HERE, [], [LinkedReply(B, True, listing(*rows))], 10, NOW, Counter(), verified=verified
    )
    assert len(merged) == 3 and len(calls) == 3
    merge_agent_lists(
        HERE, [], [LinkedReply(B, True, listing(*rows[1:]))], 10, NOW, Counter(), verified=verified
    )
    assert len(calls) == 3  # the two newest held: no Ed25519 again
    forged = {**rows[1], "model": "changed"}  # another digest: not a hit, and refused
    stats: Counter[str] = Counter()
    merge_agent_lists(
        HERE, [], [LinkedReply(B, True, listing(forged))], 10, NOW, stats, verified=verified
    )
    assert stats["linked_agents_forged"] == 1 and len(calls) == 4
    merge_agent_lists(
        HERE, [], [LinkedReply(B, True, listing(rows[0]))], 10, NOW, Counter(), verified=verified
    )
    assert len(calls) == 5  # forgotten: at most 2 held
