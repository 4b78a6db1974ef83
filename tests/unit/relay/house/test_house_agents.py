"""The agent directory (relay.house.agents): key-holder writes, expiry, caps, the store.

Real SQLite files under ``tmp_path``; coroutines run with ``asyncio.run`` (no pytest-asyncio).
Time is stepped through ``now_ms``, never slept for.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from macula.agent.petnames import petname
from macula.agent.proof import make_proof
from macula.services.directory_listing import listing_procedure
from macula.services.house import AGENTS_LIST, AGENTS_REGISTER, AGENTS_REMOVE, LIST_STATIONS
from macula.wire import cbor
from macula.wire.codes import ErrorCode
from macula.wire.identity import Identity
from relay.builtins.outcome import Outcome
from relay.house.agents import (
    AgentDirectory,
    AgentDirectoryStore,
    key_holder_procedure,
)
from support.housekit import assert_no_booleans, ok, refused
from support.running import run

T = TypeVar("T")

NOW_MS = 1_767_225_600_000
BAD = ErrorCode.UNKNOWN_ERROR
ALICE = Identity.generate(os.urandom)
BOB = Identity.generate(os.urandom)


# --- the agent directory ----------------------------------------------------------------------


def open_directory(path: Path, max_agents: int = 10_000) -> AgentDirectory:
    return AgentDirectory(run(AgentDirectoryStore.open(path)), max_agents=max_agents)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[AgentDirectory]:
    directory = open_directory(tmp_path / "agents.sqlite3")
    yield directory
    run(directory.store.close())


def entry(identity: Identity, **fields: object) -> dict[str, object]:
    return {"node_id": identity.node_id.hex(), "petname": petname(identity.node_id), **fields}


def register_payload(
    identity: Identity, now_ms: int = NOW_MS, signer: Identity | None = None, **extra: object
) -> dict[str, object]:
    procedure = key_holder_procedure(AGENTS_REGISTER, identity.node_id)
    proof = make_proof(signer or identity, procedure, now_ms)
    return {"entry": entry(identity, model="claude"), "proof": proof, **extra}


def remove_payload(identity: Identity, now_ms: int = NOW_MS) -> dict[str, object]:
    procedure = key_holder_procedure(AGENTS_REMOVE, identity.node_id)
    return {"node_id": identity.node_id.hex(), "proof": make_proof(identity, procedure, now_ms)}


def call(
    directory: AgentDirectory, procedure: str, payload: object, caller: Identity, now_ms: int
) -> Outcome:
    return run(directory.handle(procedure, payload, caller.node_id, now_ms))


def listed(directory: AgentDirectory, now_ms: int = NOW_MS, **args: object) -> list[Any]:
    result = ok(call(directory, AGENTS_LIST, args, ALICE, now_ms))
    assert result["count"] == len(result["agents"])
    assert_no_booleans(result)
    return list(result["agents"])


def test_register_list_remove(agents: AgentDirectory) -> None:
    payload = register_payload(ALICE)
    payload["entry"] = entry(
        ALICE,
        operator_name="Ada",
        session_name="review",
        model="claude",
        connected_via="station.example",
        offers=["code review", "translation"],
    )
    over_the_wire = cbor.decode(cbor.encode(payload))
    result = ok(call(agents, AGENTS_REGISTER, over_the_wire, ALICE, NOW_MS))
    assert result == {"registered": 1, "expires_ms": NOW_MS + 1_200_000}
    assert listed(agents) == [
        {
            "node_id": ALICE.node_id.hex(),
            "petname": petname(ALICE.node_id),
            "operator_name": "Ada",
            "session_name": "review",
            "model": "claude",
            "connected_via": "station.example",
            "offers": ["code review", "translation"],
            "registered_ms": NOW_MS,
            "expires_ms": NOW_MS + 1_200_000,
        }
    ]
    ok(call(agents, AGENTS_REGISTER, register_payload(BOB, NOW_MS + 5), BOB, NOW_MS + 5))
    bob, alice = listed(agents, NOW_MS + 5)
    assert (bob["node_id"], alice["node_id"]) == (BOB.node_id.hex(), ALICE.node_id.hex())
    assert bob["operator_name"] is None and bob["offers"] == []
    assert [a["node_id"] for a in listed(agents, NOW_MS + 5, limit=1)] == [BOB.node_id.hex()]

    removed = ok(call(agents, AGENTS_REMOVE, remove_payload(ALICE, NOW_MS + 6), ALICE, NOW_MS))
    assert removed == {"removed": 1}
    again = ok(call(agents, AGENTS_REMOVE, remove_payload(ALICE, NOW_MS + 6), ALICE, NOW_MS))
    assert again == {"removed": 0}
    assert [a["node_id"] for a in listed(agents, NOW_MS + 7)] == [BOB.node_id.hex()]


def test_entries_expire_after_their_ttl_and_are_pruned(agents: AgentDirectory) -> None:
    ok(call(agents, AGENTS_REGISTER, register_payload(ALICE, ttl_seconds=60), ALICE, NOW_MS))
    ok(call(agents, AGENTS_REGISTER, register_payload(BOB), BOB, NOW_MS))
    assert len(listed(agents, NOW_MS + 59_999)) == 2
    assert [a["node_id"] for a in listed(agents, NOW_MS + 60_000)] == [BOB.node_id.hex()]
    assert run(agents.store.count()) == 2  # listing only reads: the expired row is still held
    later = NOW_MS + 60_000
    ok(call(agents, AGENTS_REGISTER, register_payload(BOB, later), BOB, later))
    assert run(agents.store.count()) == 1  # a registration deletes the expired rows
    assert run(agents.prune(later + 1_200_000)) == 1
    assert listed(agents, later + 1_200_000) == []
    assert run(agents.store.count()) == 0


def test_re_registering_renews_and_replaces(agents: AgentDirectory) -> None:
    ok(call(agents, AGENTS_REGISTER, register_payload(ALICE), ALICE, NOW_MS))
    ok(call(agents, AGENTS_REGISTER, register_payload(BOB, NOW_MS + 1), BOB, NOW_MS + 1))
    later = NOW_MS + 1_000_000
    payload = register_payload(ALICE, later, ttl_seconds=3600)
    payload["entry"] = entry(ALICE, model="renewed")
    assert ok(call(agents, AGENTS_REGISTER, payload, ALICE, later))["expires_ms"] == (
        later + 3_600_000
    )
    first, second = listed(agents, later)
    assert first["node_id"] == ALICE.node_id.hex()  # most recently registered first
    assert (first["model"], first["registered_ms"]) == ("renewed", later)
    assert second["node_id"] == BOB.node_id.hex()
    assert run(agents.store.count()) == 2
    assert [a["node_id"] for a in listed(agents, NOW_MS + 1_300_000)] == [ALICE.node_id.hex()]


def test_an_entry_for_another_node_id_is_refused(agents: AgentDirectory) -> None:
    detail = refused(
        call(agents, AGENTS_REGISTER, register_payload(BOB), ALICE, NOW_MS), "unauthorized"
    )
    assert "key" in detail
    refused(call(agents, AGENTS_REMOVE, remove_payload(BOB), ALICE, NOW_MS), "unauthorized")
    assert listed(agents) == []


def test_a_proof_signed_by_another_key_is_refused(agents: AgentDirectory) -> None:
    by_bob = register_payload(ALICE, signer=BOB)
    assert "wrong_node" in refused(
        call(agents, AGENTS_REGISTER, by_bob, ALICE, NOW_MS), "unauthorized"
    )
    forged = register_payload(ALICE)
    bob_signature = make_proof(BOB, key_holder_procedure(AGENTS_REGISTER, ALICE.node_id), NOW_MS)
    forged["proof"] = {
        **make_proof(ALICE, key_holder_procedure(AGENTS_REGISTER, ALICE.node_id), NOW_MS),
        "signature": bob_signature["signature"],
    }
    assert "bad_signature" in refused(
        call(agents, AGENTS_REGISTER, forged, ALICE, NOW_MS), "unauthorized"
    )
    assert listed(agents) == []


def test_a_proof_for_another_procedure_is_refused(agents: AgentDirectory) -> None:
    ok(call(agents, AGENTS_REGISTER, register_payload(ALICE), ALICE, NOW_MS))
    as_register = register_payload(ALICE)
    as_register["proof"] = remove_payload(ALICE)["proof"]
    assert "wrong_procedure" in refused(
        call(agents, AGENTS_REGISTER, as_register, ALICE, NOW_MS), "unauthorized"
    )
    as_remove = remove_payload(ALICE)
    as_remove["proof"] = register_payload(ALICE)["proof"]
    assert "wrong_procedure" in refused(
        call(agents, AGENTS_REMOVE, as_remove, ALICE, NOW_MS), "unauthorized"
    )
    unbound = register_payload(ALICE)
    unbound["proof"] = make_proof(ALICE, AGENTS_REGISTER, NOW_MS)  # no "#<node>"
    refused(call(agents, AGENTS_REGISTER, unbound, ALICE, NOW_MS), "unauthorized")
    assert len(listed(agents)) == 1


@pytest.mark.parametrize("skew_ms", [-60_001, 60_001, -(10**9)])
def test_a_stale_proof_is_refused(agents: AgentDirectory, skew_ms: int) -> None:
    signed_at = NOW_MS + skew_ms
    stale = register_payload(ALICE, signed_at)
    assert "stale" in refused(call(agents, AGENTS_REGISTER, stale, ALICE, NOW_MS), "unauthorized")
    old_remove = remove_payload(ALICE, signed_at)
    refused(call(agents, AGENTS_REMOVE, old_remove, ALICE, NOW_MS), "unauthorized")
    for edge in (NOW_MS - 60_000, NOW_MS + 60_000):  # the window's edges still pass
        ok(call(agents, AGENTS_REGISTER, register_payload(ALICE, edge), ALICE, NOW_MS))


def test_a_wrong_petname_is_refused(agents: AgentDirectory) -> None:
    payload = register_payload(ALICE)
    payload["entry"] = entry(ALICE, petname=petname(BOB.node_id))
    detail = refused(call(agents, AGENTS_REGISTER, payload, ALICE, NOW_MS), "bad_request")
    assert petname(ALICE.node_id) in detail
    payload["entry"] = entry(ALICE, petname=petname(ALICE.node_id).upper())
    refused(call(agents, AGENTS_REGISTER, payload, ALICE, NOW_MS), "bad_request")
    del payload["entry"]["petname"]  # type: ignore[attr-defined]
    refused(call(agents, AGENTS_REGISTER, payload, ALICE, NOW_MS), "bad_request")
    assert listed(agents) == []


def good_entry() -> dict[str, object]:
    return entry(ALICE)


BAD_REGISTER_PAYLOADS: list[tuple[object, str]] = [
    (None, "missing 'entry'"),
    ([], "the argument must be a map"),
    ({"proof": {}}, "missing 'entry'"),
    ({"entry": "alice", "proof": {}}, "'entry' must be a map, got text"),
    ({"entry": {**good_entry(), "node_id": "AB" * 32}, "proof": {}}, "'entry.node_id'"),
    ({"entry": {**good_entry(), "node_id": b"\x00" * 32}, "proof": {}}, "got bytes(32)"),
    ({"entry": {**good_entry(), "model": "x" * 281}, "proof": {}}, "'entry.model' must be"),
    ({"entry": {**good_entry(), "operator_name": 5}, "proof": {}}, "'entry.operator_name'"),
    ({"entry": {**good_entry(), "session_name": ["a"]}, "proof": {}}, "'entry.session_name'"),
    ({"entry": {**good_entry(), "connected_via": True}, "proof": {}}, "'entry.connected_via'"),
    ({"entry": {**good_entry(), "offers": "chat"}, "proof": {}}, "'entry.offers' must be"),
    ({"entry": {**good_entry(), "offers": ["a"] * 33}, "proof": {}}, "'entry.offers' must be"),
    ({"entry": {**good_entry(), "offers": ["a", ""]}, "proof": {}}, "'entry.offers[1]'"),
    ({"entry": {**good_entry(), "offers": [{}]}, "proof": {}}, "'entry.offers[0]'"),
    ({"entry": good_entry()}, "missing 'proof'"),
    ({"entry": good_entry(), "proof": {}, "ttl_seconds": 59}, "'ttl_seconds' must be an int"),
    ({"entry": good_entry(), "proof": {}, "ttl_seconds": 3601}, "60..3600, got int 3601"),
    ({"entry": good_entry(), "proof": {}, "ttl_seconds": 600.0}, "got float 600.0"),
    ({"entry": good_entry(), "proof": {}, "ttl_seconds": 2**70}, "got a huge int"),
]


@pytest.mark.parametrize(("payload", "named"), BAD_REGISTER_PAYLOADS)
def test_bad_register_payloads_are_refused_by_name(
    agents: AgentDirectory, payload: object, named: str
) -> None:
    detail = refused(call(agents, AGENTS_REGISTER, payload, ALICE, NOW_MS), "bad_request")
    assert named in detail
    assert listed(agents) == []


@pytest.mark.parametrize(
    ("procedure", "payload"),
    [
        (AGENTS_REGISTER, {"entry": good_entry(), "proof": "signed, honestly"}),
        (AGENTS_REGISTER, {"entry": good_entry(), "proof": [1, 2, 3]}),
        (AGENTS_REMOVE, {"node_id": "", "proof": {}}),
        (AGENTS_REMOVE, {"proof": {}}),
        (AGENTS_REMOVE, 42),
        (AGENTS_LIST, {"limit": 0}),
        (AGENTS_LIST, {"limit": 501}),
        (AGENTS_LIST, {"limit": "all"}),
        (AGENTS_LIST, "please"),
        ("macula.agents.unknown_v1", {}),
        (LIST_STATIONS, {}),
    ],
)
def test_bad_shapes_never_raise(agents: AgentDirectory, procedure: str, payload: object) -> None:
    outcome = call(agents, procedure, payload, ALICE, NOW_MS)
    assert outcome.code == BAD
    assert outcome.detail is not None and outcome.detail.split(b": ")[0] in (
        b"bad_request",
        b"unauthorized",
        b"unknown_procedure",
    )


def test_a_caller_without_a_node_id_is_refused(agents: AgentDirectory) -> None:
    for caller in (b"", b"x" * 31):
        outcome = run(agents.handle(AGENTS_REGISTER, register_payload(ALICE), caller, NOW_MS))
        refused(outcome, "unauthorized")


def test_the_directory_is_capped_but_renewals_pass(tmp_path: Path) -> None:
    agents = open_directory(tmp_path / "agents.sqlite3", max_agents=1)
    try:
        ok(call(agents, AGENTS_REGISTER, register_payload(ALICE), ALICE, NOW_MS))
        detail = refused(
            call(agents, AGENTS_REGISTER, register_payload(BOB), BOB, NOW_MS), "directory_full"
        )
        assert "1 agents" in detail
        ok(call(agents, AGENTS_REGISTER, register_payload(ALICE), ALICE, NOW_MS))  # renewal
        later = NOW_MS + 1_200_000  # Alice has expired: her slot is free again
        ok(call(agents, AGENTS_REGISTER, register_payload(BOB, later), BOB, later))
        assert [a["node_id"] for a in listed(agents, later)] == [BOB.node_id.hex()]
    finally:
        run(agents.store.close())


def test_free_identities_cannot_fill_the_directory(tmp_path: Path) -> None:
    """1,000 fresh unhardened identities against a directory of 50: only those that happen to
    meet the puzzle (1 in 256 at difficulty 8) get in; an honest hardened agent still does."""
    rng = random.Random(11)
    agents = open_directory(tmp_path / "agents.sqlite3", max_agents=50)
    try:
        admitted = 0
        for _ in range(1_000):
            sybil = Identity(rng.randbytes(32))
            outcome = call(agents, AGENTS_REGISTER, register_payload(sybil), sybil, NOW_MS)
            if sybil.has_valid_puzzle(8):
                ok(outcome)
                admitted += 1
            else:
                assert outcome.code == ErrorCode.CRYPTO_PUZZLE_INVALID, outcome
                assert outcome.detail is not None
                assert outcome.detail.decode().startswith("puzzle_required: ")
                assert b"difficulty 8" in outcome.detail
        assert admitted < 15 and run(agents.store.count()) == admitted
        honest = Identity.generate(os.urandom)
        ok(call(agents, AGENTS_REGISTER, register_payload(honest), honest, NOW_MS + 1))
        assert listed(agents, NOW_MS + 1)[0]["node_id"] == honest.node_id.hex()
    finally:
        run(agents.store.close())


def test_the_puzzle_difficulty_is_configurable(tmp_path: Path) -> None:
    weak = next(
        identity
        for identity in (Identity(os.urandom(32)) for _ in range(10_000))
        if not identity.has_valid_puzzle(1)
    )
    for difficulty, admitted in ((0, True), (1, False)):
        path = tmp_path / f"agents-{difficulty}.sqlite3"
        agents = AgentDirectory(run(AgentDirectoryStore.open(path)), puzzle_difficulty=difficulty)
        try:
            outcome = call(agents, AGENTS_REGISTER, register_payload(weak), weak, NOW_MS)
            assert outcome.is_error is not admitted, outcome
            ok(call(agents, AGENTS_REMOVE, remove_payload(weak), weak, NOW_MS))  # never gated
        finally:
            run(agents.store.close())
    store = run(AgentDirectoryStore.open(tmp_path / "x.sqlite3"))
    try:
        with pytest.raises(ValueError):
            AgentDirectory(store, puzzle_difficulty=65)
    finally:
        run(store.close())


def test_listing_writes_nothing(agents: AgentDirectory) -> None:
    ok(call(agents, AGENTS_REGISTER, register_payload(ALICE, ttl_seconds=60), ALICE, NOW_MS))
    changes = agents.store._db.total_changes
    for step in range(100):  # past Alice's expiry too
        listed(agents, NOW_MS + step * 1000)
    assert agents.store._db.total_changes == changes


def test_entries_survive_reopening_the_store(tmp_path: Path) -> None:
    path = tmp_path / "agents.sqlite3"
    first = open_directory(path)
    payload = register_payload(ALICE)
    payload["entry"] = entry(ALICE, offers=["ünïcode ✓"], operator_name="Zoë")
    ok(call(first, AGENTS_REGISTER, payload, ALICE, NOW_MS))
    run(first.store.close())
    second = open_directory(path)
    try:
        (alice,) = listed(second)
        assert (alice["offers"], alice["operator_name"]) == (["ünïcode ✓"], "Zoë")
        assert alice["expires_ms"] == NOW_MS + 1_200_000
        assert run(second.store.schema_version()) == 2
    finally:
        run(second.store.close())


def test_a_store_failure_is_a_temporary_failure_not_an_exception(tmp_path: Path) -> None:
    agents = open_directory(tmp_path / "agents.sqlite3")
    run(agents.store.close())
    outcome = call(agents, AGENTS_REGISTER, register_payload(ALICE), ALICE, NOW_MS)
    assert (outcome.code, outcome.detail) == (ErrorCode.TEMPORARY_RELAY_FAILURE, None)
    assert call(agents, AGENTS_LIST, {}, ALICE, NOW_MS).code == ErrorCode.TEMPORARY_RELAY_FAILURE


# --- the listing proof: what lets a linked station relay the row ---------------------------

STATION = bytes([7]) * 32


def listing_payload(identity: Identity, station: bytes = STATION, **changes: object) -> Any:
    """A registration carrying the agent's listing proof for ``station``."""
    payload = register_payload(identity, ttl_seconds=600)
    signed_entry = {**entry(identity, model="claude"), **changes}
    procedure = listing_procedure(station, 600, signed_entry)
    payload["listing_proof"] = make_proof(identity, procedure, NOW_MS)
    return payload


def test_a_listing_proof_for_this_station_is_stored_and_listed(tmp_path: Path) -> None:
    store = run(AgentDirectoryStore.open(tmp_path / "agents.sqlite3"))
    agents = AgentDirectory(store, station_id=STATION)
    payload = cbor.decode(cbor.encode(listing_payload(ALICE)))
    ok(call(agents, AGENTS_REGISTER, payload, ALICE, NOW_MS))
    [row] = listed(agents)
    assert row["listing_proof"] == payload["listing_proof"]
    run(store.close())
    reopened = AgentDirectory(run(AgentDirectoryStore.open(tmp_path / "agents.sqlite3")))
    [row] = listed(reopened)  # kept on disk
    assert row["listing_proof"] == payload["listing_proof"]
    run(reopened.store.close())


@pytest.mark.parametrize(
    "payload",
    [
        listing_payload(ALICE, bytes([8]) * 32),  # signed for another station
        listing_payload(ALICE, model="gpt"),  # for another entry
        {**listing_payload(ALICE), "listing_proof": {"node_id": "00"}},
        {**listing_payload(BOB), "entry": entry(ALICE, model="claude")},  # BOB's proof
    ],
)
def test_a_listing_proof_that_does_not_verify_is_refused(tmp_path: Path, payload: Any) -> None:
    agents = AgentDirectory(
        run(AgentDirectoryStore.open(tmp_path / "agents.sqlite3")), station_id=STATION
    )
    if payload["entry"]["node_id"] == ALICE.node_id.hex() and "listing_proof" in payload:
        payload = {**payload, "proof": register_payload(ALICE)["proof"]}
    detail = refused(call(agents, AGENTS_REGISTER, payload, ALICE, NOW_MS), "unauthorized")
    assert "listing_proof" in detail
    assert listed(agents) == []
    run(agents.store.close())


def test_a_registration_without_listing_proof_is_listed_here_without_one(
    agents: AgentDirectory,
) -> None:
    ok(call(agents, AGENTS_REGISTER, register_payload(ALICE), ALICE, NOW_MS))
    [row] = listed(agents)
    assert "listing_proof" not in row


def test_a_directory_of_the_first_schema_is_migrated_and_keeps_its_rows(tmp_path: Path) -> None:
    import relay.house.agents as agents_module
    from macula.store.base import SqliteStore

    class FirstSchema(SqliteStore):
        MIGRATIONS = (agents_module._AGENTS_V1,)

    path = tmp_path / "agents.sqlite3"
    old = run(FirstSchema.open(path))
    insert = (
        "INSERT INTO agents (node_id, petname, offers, registered_ms, expires_ms)"
        " VALUES (?, ?, '[]', ?, ?)"
    )
    run(old._execute(insert, (ALICE.node_id, petname(ALICE.node_id), NOW_MS, NOW_MS + 60_000)))
    run(old.close())
    directory = AgentDirectory(run(AgentDirectoryStore.open(path)), station_id=STATION)
    assert run(directory.store.schema_version()) == 2
    [row] = listed(directory)
    assert row["node_id"] == ALICE.node_id.hex() and "listing_proof" not in row
    ok(call(directory, AGENTS_REGISTER, listing_payload(ALICE), ALICE, NOW_MS))  # renewed
    [row] = listed(directory)
    assert row["listing_proof"]["node_id"] == ALICE.node_id.hex()
    run(directory.store.close())
