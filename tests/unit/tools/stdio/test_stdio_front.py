"""The stdio front's rules without a process: the opening decision (the era on purpose, the
card), what it does with the backend's replies (learn, drop what it answered), and its
constants kept equal to the SDK's and the channel module's. Real pipes for the reader thread."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mcp_types
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from tools.settings import CHANNEL_ENV
from tools.stdio.front import (
    CARD_FILE,
    HANDSHAKE_VERSIONS,
    UNSUPPORTED_PROTOCOL_VERSION,
    Front,
    HandshakeCard,
    opening,
)

DISCOVER = {
    "jsonrpc": "2.0",
    "id": "probe-1",
    "method": "server/discover",
    "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}},
}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}},
}


def test_the_constants_are_the_sdks() -> None:
    assert HANDSHAKE_VERSIONS == HANDSHAKE_PROTOCOL_VERSIONS
    assert UNSUPPORTED_PROTOCOL_VERSION == mcp_types.UNSUPPORTED_PROTOCOL_VERSION


def test_with_push_on_a_discover_is_declined_naming_the_handshake_versions() -> None:
    decision = opening(DISCOVER, {}, {"discover 2026-07-28": {"supportedVersions": ["x"]}})
    assert not decision.forward and decision.answer is not None
    error = decision.answer["error"]
    assert decision.answer["id"] == "probe-1" and error["code"] == -32022
    assert error["data"] == {"supported": list(HANDSHAKE_VERSIONS), "requested": "2026-07-28"}


def test_with_push_off_a_discover_goes_on_answered_from_the_card_when_known() -> None:
    off = {CHANNEL_ENV: "0"}
    unknown = opening(DISCOVER, off, {})
    assert unknown.forward and unknown.answer is None and unknown.key == "discover 2026-07-28"
    known = opening(DISCOVER, off, {"discover 2026-07-28": {"supportedVersions": ["2026-07-28"]}})
    assert known.forward and known.answer == {
        "jsonrpc": "2.0",
        "id": "probe-1",
        "result": {"supportedVersions": ["2026-07-28"]},
    }


def test_initialize_is_keyed_by_the_version_the_server_agrees_to() -> None:
    assert opening(INITIALIZE, {}, {}).key == "initialize 2025-06-18"
    future = {**INITIALIZE, "params": {"protocolVersion": "2099-01-01"}}
    assert opening(future, {}, {}).key == "initialize 2025-11-25"
    other = {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}
    assert opening(other, {}, {"initialize 2025-11-25": {}}).key is None


def test_a_reply_the_front_gave_is_dropped_and_a_changed_one_relearned(tmp_path: Path) -> None:
    env = {"MACULA_HOME": str(tmp_path)}
    read_in, write_in = os.pipe()
    read_out, write_out = os.pipe()
    front = Front(env, read_in, write_out)
    front.card.learn("initialize 2025-06-18", {"old": 1})
    handed: list[bytes | None] = []
    front.connect(handed.append)
    front.start()
    os.write(write_in, json.dumps(INITIALIZE).encode() + b"\n" + b'{"id":1,"method":"x"}\n')
    os.close(write_in)
    answer = json.loads(os.read(read_out, 65536))
    assert answer == {"jsonrpc": "2.0", "id": 0, "result": {"old": 1}}
    front._thread.join(5)
    assert handed == [json.dumps(INITIALIZE).encode() + b"\n", b'{"id":1,"method":"x"}\n', None]
    assert front.watching
    other = b'{"jsonrpc":"2.0","id":7,"result":{}}\n'
    assert front.from_backend(other) == other  # not the watched one: passed on
    assert front.from_backend(b'{"jsonrpc":"2.0","id":0,"result":{"new":2}}\n') is None
    assert not front.watching
    assert HandshakeCard(env).learned == {"initialize 2025-06-18": {"new": 2}}
    assert oct((tmp_path / CARD_FILE).stat().st_mode & 0o777) == "0o600"


def test_a_card_of_other_code_or_settings_is_not_used(tmp_path: Path) -> None:
    env = {"MACULA_HOME": str(tmp_path)}
    HandshakeCard(env).learn("initialize 2025-11-25", {"a": 1})
    assert HandshakeCard(env).learned == {"initialize 2025-11-25": {"a": 1}}
    assert HandshakeCard({**env, CHANNEL_ENV: "0"}).learned == {}
    (tmp_path / CARD_FILE).write_text("not json")
    assert HandshakeCard(env).learned == {}
