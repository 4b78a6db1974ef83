"""The shipped handshake card: this code's own ``initialize`` answers, used by the front in a
home that has not learned a card yet, and only with the ``mcp`` it was made with."""

from __future__ import annotations

import json
from pathlib import Path

from tools.settings import CHANNEL_ENV
from tools.stdio import handshake_seed
from tools.stdio.front import (
    HANDSHAKE_VERSIONS,
    SEED_FILE,
    HandshakeCard,
    installed_mcp,
    opening,
    seed_answers,
)


def test_the_shipped_seed_is_what_this_code_answers() -> None:
    shipped = json.loads(SEED_FILE.read_text(encoding="utf-8"))
    assert shipped == handshake_seed.seed(), (
        "tools/stdio/handshake_seed.json is stale: "
        "run `uv run python -m tools.stdio.handshake_seed`"
    )


def test_every_handshake_version_and_both_channel_settings_are_seeded() -> None:
    on, off = seed_answers({}), seed_answers({CHANNEL_ENV: "0"})
    assert set(on) == set(off) == {f"initialize {v}" for v in HANDSHAKE_VERSIONS}
    for version in HANDSHAKE_VERSIONS:
        assert on[f"initialize {version}"]["protocolVersion"] == version
        assert "claude/channel" in on[f"initialize {version}"]["capabilities"]["experimental"]
        assert "experimental" not in off[f"initialize {version}"]["capabilities"]


def test_installed_mcp_is_read_without_importing_it() -> None:
    import importlib.metadata

    assert installed_mcp() == importlib.metadata.version("mcp")


def test_a_new_home_is_answered_from_the_seed(tmp_path: Path) -> None:
    card = HandshakeCard({"MACULA_HOME": str(tmp_path)})
    assert card.learned == {}
    request = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}},
    }
    decision = opening(request, {}, card.answers)
    assert decision.answer is not None and decision.forward
    assert decision.answer["result"]["protocolVersion"] == "2025-06-18"
    # the backend's equal reply is not stale, and is written down as the home's own card
    assert card.learn("initialize 2025-06-18", decision.answer["result"]) is False
    assert HandshakeCard({"MACULA_HOME": str(tmp_path)}).learned == card.learned


def test_a_seed_made_with_another_mcp_is_not_used(tmp_path: Path) -> None:
    stored = json.loads(SEED_FILE.read_text(encoding="utf-8"))
    other = tmp_path / "seed.json"
    other.write_text(json.dumps({**stored, "mcp": "0.0.1"}))
    assert seed_answers({}, other) == {}
    assert HandshakeCard({"MACULA_HOME": str(tmp_path)}, other).answers == {}
    other.write_text("{not json")
    assert seed_answers({}, other) == {}
