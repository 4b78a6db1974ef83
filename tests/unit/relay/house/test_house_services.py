"""House services wired from HouseConfig (relay.house.services) and the ``macula-relay`` flags."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from macula.agent.petnames import petname
from macula.agent.proof import make_proof
from macula.services.house import AGENTS_REGISTER, MEMORY_ADD, MEMORY_QUERY
from macula.store.base import StoreError
from macula.wire.codes import ErrorCode
from macula.wire.identity import Identity
from relay.builtins.outcome import Outcome
from relay.house.agents import key_holder_procedure
from relay.house.services import HouseConfig, HouseServices
from relay.ops.cli import build_parser, config_from_args
from support.housekit import ok, refused
from support.running import run

NOW_MS = 1_767_225_600_000
STATION = bytes(range(100, 132))
NOTE = "Rotating TLS certificates: renew a week before expiry and reload the station. " * 3


def weak_identity() -> Identity:
    return next(
        identity
        for identity in (Identity(os.urandom(32)) for _ in range(10_000))
        if not identity.has_valid_puzzle(1)
    )


def register(house: HouseServices, identity: Identity) -> Outcome:
    node_hex = identity.node_id.hex()
    payload = {
        "entry": {"node_id": node_hex, "petname": petname(identity.node_id)},
        "proof": make_proof(
            identity, key_holder_procedure(AGENTS_REGISTER, identity.node_id), NOW_MS
        ),
    }
    return run(house.handle(AGENTS_REGISTER, payload, identity.node_id, NOW_MS))


def open_house(config: HouseConfig, data_dir: Path) -> HouseServices:
    return run(HouseServices.open(config, data_dir, STATION, "127.0.0.1", 4433))


def test_defaults_refuse_weak_identities_and_serve_hardened_ones(tmp_path: Path) -> None:
    house = open_house(HouseConfig(), tmp_path)
    try:
        outcome = register(house, weak_identity())
        assert outcome.code == ErrorCode.CRYPTO_PUZZLE_INVALID
        ok(register(house, Identity.generate(os.urandom)))
    finally:
        run(house.close())


def test_the_limits_reach_the_services(tmp_path: Path) -> None:
    config = HouseConfig(
        memory_max_bytes=100, memory_query_rate=0.25, directory_puzzle_difficulty=0
    )
    house = open_house(config, tmp_path)
    depositor = bytes(range(1, 33))
    try:
        full = run(house.handle(MEMORY_ADD, {"content": NOTE}, depositor, NOW_MS))
        refused(full, "quota_exceeded")
        ask = {"query_text": "certificates"}
        ok(run(house.handle(MEMORY_QUERY, ask, depositor, NOW_MS)))
        limited = run(house.handle(MEMORY_QUERY, ask, depositor, NOW_MS))
        assert limited.code == ErrorCode.UPSTREAM_CONGESTION  # burst 4 x 0.25 = 1
        ok(register(house, weak_identity()))
    finally:
        run(house.close())


def test_bad_limits_are_refused_at_construction() -> None:
    for field in ("memory_max_bytes", "memory_query_rate", "directory_max_agents"):
        with pytest.raises(ValueError, match=field):
            HouseConfig(**{field: 0})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="puzzle"):
        HouseConfig(directory_puzzle_difficulty=65)


def test_the_relay_flags_set_the_house_limits(tmp_path: Path) -> None:
    base = ["--data-dir", str(tmp_path)]
    assert config_from_args(build_parser().parse_args(base)).house == HouseConfig()
    flags = [
        *("--memory-max-bytes", "1000", "--memory-max-chunks-per-node", "7"),
        *("--memory-deposit-rate", "1.5", "--memory-query-rate", "3"),
        *("--directory-max-agents", "9", "--directory-puzzle-difficulty", "12"),
    ]
    house = config_from_args(build_parser().parse_args([*base, *flags])).house
    assert (house.memory_max_bytes, house.memory_max_chunks_per_node) == (1000, 7)
    assert (house.memory_deposit_rate, house.memory_query_rate) == (1.5, 3.0)
    assert (house.directory_max_agents, house.directory_puzzle_difficulty) == (9, 12)
    with pytest.raises(SystemExit):
        config_from_args(build_parser().parse_args([*base, "--directory-puzzle-difficulty", "65"]))
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--memory-max-bytes", "0"])


def test_a_store_that_fails_to_open_closes_the_ones_opened_before_it(tmp_path: Path) -> None:
    import threading

    def sqlite_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if "_connection_worker_thread" in t.name}

    (tmp_path / "agents.sqlite3").mkdir()  # the agent directory's store cannot open
    before = sqlite_threads()

    async def scenario() -> None:
        with pytest.raises(StoreError):
            await HouseServices.open(HouseConfig(), tmp_path, STATION, "127.0.0.1", 4433)

    run(scenario())
    for thread in sqlite_threads() - before:
        thread.join(timeout=5)  # a closed store's worker ends at once; a leaked one never does
    assert not sqlite_threads() - before  # the memory store opened first was closed again
