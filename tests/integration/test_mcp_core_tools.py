"""The core MCP tools (mesh_call, mesh_serve/unserve, mesh_put/get, DHT finds) over a real station.

Each agent is a whole ``macula-mcp`` server (its own identity, home and Node) driven through the
SDK's in-process ``Client``; two of them talk through a station on loopback.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp_types import CallToolResult

import tools.server.server
from macula.agent.contact_policy import trust
from macula.keyfile import save_identity
from macula.wire.content import raw_mcid
from relay.station.station import Station
from support.agentkit import DOUBLE, python
from support.identities import new_identity
from support.waiting import eventually
from tools.groups import content, dht, rpc

pytestmark = pytest.mark.anyio

GROUPS = (rpc, content, dht)
TOOLS = {
    "mesh_call",
    "mesh_serve",
    "mesh_unserve",
    "mesh_put",
    "mesh_get",
    "mesh_find_record",
    "mesh_find_records",
    "mesh_find_records_by_type",
}


COUNT = python(
    'import json,sys; p=json.load(sys.stdin); f=open(p["log"],"a"); f.write("x\\n"); f.close(); '
    'print(len(open(p["log"]).read().splitlines()))'
)
ENV_DUMP = python("import json,os,sys; json.load(sys.stdin); print(json.dumps(dict(os.environ)))")
EXIT_1 = python("import sys; sys.exit(1)")
NOT_JSON = python('print("this is not json")')
FLOODS = python('import sys; sys.stdout.write("x" * 2_000_000)')
HANGS = python(
    "import json,os,subprocess,sys,time; p=json.load(sys.stdin); "
    'c=subprocess.Popen(["sleep","30"]); f=open(p["pids"],"w"); '
    "f.write(json.dumps([os.getpid(), c.pid])); f.close(); time.sleep(30)"  # sleep: it hangs
)


class Agent:
    """One MCP server seen through its client: tool calls answer structured content."""

    def __init__(self, client: Client, node_id: str) -> None:
        self.client = client
        self.node_id = node_id

    async def raw(self, tool: str, **args: Any) -> CallToolResult:
        return await self.client.call_tool(tool, args)

    async def ok(self, tool: str, **args: Any) -> dict[str, Any]:
        result = await self.raw(tool, **args)
        assert not result.is_error, result.structured_content
        content: dict[str, Any] | None = result.structured_content
        assert content is not None
        return content

    async def error(self, tool: str, **args: Any) -> dict[str, Any]:
        result = await self.raw(tool, **args)
        assert result.is_error, result.structured_content
        error: dict[str, Any] | None = result.structured_content
        assert error is not None and {"code", "detail", "retryable", "next_action"} <= set(error)
        return error


@pytest.fixture
def agent(
    station: Station, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[str], Any]:
    monkeypatch.setattr(tools.server.server, "GROUPS", GROUPS)

    @asynccontextmanager
    async def start(name: str) -> AsyncIterator[Agent]:
        home = tmp_path / name
        identity = new_identity()
        save_identity(home / "id.key", identity)
        env = {
            "MACULA_HOME": str(home),
            "MACULA_MESH_STATIONS": station.endpoint,
            "MACULA_MCP_IDENTITY": str(home / "id.key"),
        }
        async with Client(tools.server.server.build_server(env)) as client:
            yield Agent(client, identity.node_id.hex())

    return start


async def call_when_served(agent: Agent, procedure: str, args: Any, **kw: Any) -> CallToolResult:
    """ADVERTISE has no acknowledgement (§6.1): retry while the station does not know it yet."""

    async def attempt() -> CallToolResult | None:
        result = await agent.raw("mesh_call", procedure=procedure, args=args, **kw)
        unknown = result.is_error and (result.structured_content or {}).get("code") == (
            "unknown_next_peer"
        )
        return None if unknown else result

    result: CallToolResult = await eventually(attempt)
    return result


def gone(pid: int) -> bool:
    """No such process, or only a zombie waiting for a parent that is not us to reap it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


# -- declarations -------------------------------------------------------------------------------


async def test_every_tool_declares_hints_and_a_shorter_terse_description(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tools.server.server, "GROUPS", GROUPS)
    app = tools.server.server.build_server({"MACULA_HOME": "/nonexistent"})
    listed = {tool.name: tool for tool in await app.list_tools()}
    assert set(listed) == TOOLS
    for name, tool in listed.items():
        hints = tool.annotations
        assert hints is not None, name
        # a hint left out is the protocol's cautious default; a tool that writes states
        # destructive_hint (test_mcp_tools_list_budget.py checks what the hints mean)
        assert hints.read_only_hint or hints.destructive_hint is not None, name
        full, terse = app.descriptions.all[name]  # type: ignore[attr-defined]
        assert tool.description == full and len(terse) < len(full), name
    assert listed["mesh_get"].annotations.read_only_hint  # type: ignore[union-attr]
    assert listed["mesh_serve"].annotations.destructive_hint  # type: ignore[union-attr]
    serve_terse = app.descriptions.all["mesh_serve"][1]  # type: ignore[attr-defined]
    for caveat in ("stdin ONLY", "no shell", "stranger", "process group killed", "max 60"):
        assert caveat in serve_terse, caveat
    for name in ("mesh_call", "mesh_serve", "mesh_unserve", "mesh_put"):
        assert "idempotency_key" in listed[name].input_schema["properties"], name


# -- serving and calling ------------------------------------------------------------------------


async def test_serve_and_call_between_two_agents(
    agent: Callable[[str], Any], tmp_path: Path
) -> None:
    async with agent("alice") as alice, agent("bob") as bob:
        served = await alice.ok("mesh_serve", name="org.example.double", exec=DOUBLE)
        assert served["serving"] == 1 and served["replaced"] == 0 and served["announced"] == 1
        assert served["node_id"] == alice.node_id

        evil = "$(touch {0}) `touch {0}`; touch {0} | touch {0}".format(tmp_path / "pwned")
        result = await call_when_served(bob, "org.example.double", {"n": 21, "text": evil})
        assert not result.is_error, result.structured_content
        answer = result.structured_content or {}
        assert answer["procedure"] == "org.example.double" and answer["realm"] == "0" * 64
        assert answer["result"]["doubled"] == 42
        assert answer["result"]["caller"] == bob.node_id  # MACULA_CALLER
        assert answer["result"]["echo"]["text"] == evil  # stdin only: never run
        assert not (tmp_path / "pwned").exists()
        assert answer["direct"] == 0 and answer["duration_ms"] >= 0

        direct = await bob.ok("mesh_call", procedure="org.example.double", args={"n": 1}, direct=1)
        assert direct["result"]["doubled"] == 2 and direct["direct"] == 1

        # idempotency: the same key and arguments replay; the command ran once
        await alice.ok("mesh_serve", name="org.example.count", exec=COUNT)
        log = str(tmp_path / "count.log")
        await call_when_served(bob, "org.example.count", {"log": log})
        first = await bob.ok(
            "mesh_call", procedure="org.example.count", args={"log": log}, idempotency_key="count-1"
        )
        again = await bob.ok(
            "mesh_call", procedure="org.example.count", args={"log": log}, idempotency_key="count-1"
        )
        assert first["result"] == 2 and again["result"] == 2 and again["replayed"] == 1
        assert "replayed" not in first
        assert len(Path(log).read_text().splitlines()) == 2
        conflict = await bob.error(
            "mesh_call",
            procedure="org.example.count",
            args={"log": log + ".other"},
            idempotency_key="count-1",
        )
        assert conflict["code"] == "idempotency_conflict" and conflict["retryable"] == 0

        replay = await alice.ok(
            "mesh_serve", name="org.example.count", exec=COUNT, idempotency_key="serve-count"
        )
        assert replay["replaced"] == 1
        replayed = await alice.ok(
            "mesh_serve", name="org.example.count", exec=COUNT, idempotency_key="serve-count"
        )
        assert replayed["replayed"] == 1
        conflict = await alice.error(
            "mesh_serve", name="org.example.count", exec=DOUBLE, idempotency_key="serve-count"
        )
        assert conflict["code"] == "idempotency_conflict"

        # realms: a procedure served in one realm is invisible from another
        realm = "ab" * 32
        await alice.ok("mesh_serve", name="org.example.realmed", exec=DOUBLE, realm=realm)
        result = await call_when_served(bob, "org.example.realmed", {"n": 4}, realm=realm)
        assert (result.structured_content or {})["result"]["doubled"] == 8
        elsewhere = await bob.error("mesh_call", procedure="org.example.realmed", args={"n": 4})
        assert elsewhere["code"] == "unknown_next_peer"
        wrong = await alice.error("mesh_unserve", name="org.example.realmed", realm="cd" * 32)
        assert wrong["code"] == "invalid_argument" and "not served" in wrong["detail"]
        right = await alice.ok("mesh_unserve", name="org.example.realmed", realm=realm.upper())
        assert right["realm"] == realm and right["calls"] == 1

        # unserve: counts, then the procedure is gone for callers
        stopped = await alice.ok("mesh_unserve", name="org.example.double")
        assert stopped["stopped"] == 1 and stopped["calls"] == 2 and stopped["errors"] == 0

        async def unknown() -> bool:
            result = await bob.raw("mesh_call", procedure="org.example.double", args={"n": 1})
            code = (result.structured_content or {}).get("code")
            return result.is_error and code == "unknown_next_peer"

        await eventually(unknown)
        missing = await alice.error("mesh_unserve", name="org.example.double")
        assert missing["code"] == "invalid_argument" and "org.example.count" in missing["detail"]


async def test_failing_commands_answer_only_their_caller(
    agent: Callable[[str], Any], tmp_path: Path
) -> None:
    async with agent("alice") as alice, agent("bob") as bob:
        await alice.ok("mesh_serve", name="org.example.double", exec=DOUBLE, announce=0)
        await alice.ok("mesh_serve", name="org.example.exit1", exec=EXIT_1, announce=0)
        await alice.ok("mesh_serve", name="org.example.garbage", exec=NOT_JSON, announce=0)
        await alice.ok("mesh_serve", name="org.example.floods", exec=FLOODS, announce=0)
        await alice.ok(
            "mesh_serve", name="org.example.hangs", exec=HANGS, exec_timeout_seconds=1, announce=0
        )
        assert not (await call_when_served(bob, "org.example.double", {"n": 2})).is_error

        pids = tmp_path / "pids.json"
        cases = [
            ("org.example.exit1", {}, "exited with status 1"),
            ("org.example.garbage", {}, "not one JSON value"),
            ("org.example.floods", {}, "more than 1048576 bytes"),
            ("org.example.hangs", {"pids": str(pids)}, "timed out after 1 s"),
        ]
        for procedure, args, reason in cases:
            result = await call_when_served(bob, procedure, args, timeout_ms=10_000)
            failed = result.structured_content or {}
            assert result.is_error and failed["code"] == "unknown_error", failed
            assert reason in failed["detail"] and failed["retryable"] == 1, failed
            still = await bob.ok("mesh_call", procedure="org.example.double", args={"n": 5})
            assert still["result"]["doubled"] == 10

        leader, child = json.loads(pids.read_text())
        await eventually(lambda: gone(leader) and gone(child))

        counts = await alice.ok("mesh_unserve", name="org.example.hangs")
        assert counts["calls"] == 1 and counts["errors"] == 1


async def test_served_commands_see_none_of_the_servers_secrets(
    agent: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-do-not-leak")
    monkeypatch.setenv("MACULA_TEST_SECRET", "hunter2")
    async with agent("alice") as alice, agent("bob") as bob:
        await alice.ok("mesh_serve", name="org.example.env", exec=ENV_DUMP, announce=0)
        result = await call_when_served(bob, "org.example.env", {})
        seen = (result.structured_content or {})["result"]
        assert "sk-ant-do-not-leak" not in json.dumps(seen) and "hunter2" not in json.dumps(seen)
        passed = {"PATH", "HOME", "LANG", "TMPDIR"} & set(os.environ)
        own = {"MACULA_CALLER", "MACULA_PROCEDURE", "MACULA_REALM"}
        # LC_CTYPE: Python itself may set it in the child (PEP 538 locale coercion)
        assert set(seen) - {"LC_CTYPE"} == passed | own, seen
        assert all(seen[name] == os.environ[name] for name in passed)
        assert seen["MACULA_CALLER"] == bob.node_id
        assert seen["MACULA_PROCEDURE"] == "org.example.env"
        assert seen["MACULA_REALM"] == "0" * 64


async def test_each_caller_is_held_to_the_rate_it_was_served_with(
    agent: Callable[[str], Any],
) -> None:
    async with agent("alice") as alice, agent("bob") as bob, agent("carol") as carol:
        served = await alice.ok(
            "mesh_serve", name="org.example.slow", exec=DOUBLE, rate_per_minute=2, announce=0
        )
        assert served["rate_per_minute"] == 2 and served["allow"] == "open"
        assert not (await call_when_served(bob, "org.example.slow", {"n": 1})).is_error
        await bob.ok("mesh_call", procedure="org.example.slow", args={"n": 2})
        over = await bob.error("mesh_call", procedure="org.example.slow", args={"n": 3})
        assert over["code"] == "unknown_error" and over["retryable"] == 1, over
        assert "rate_limited: at most 2 calls a minute" in over["detail"]
        assert "retry in" in over["detail"]
        # another caller has its own allowance
        honest = await carol.ok("mesh_call", procedure="org.example.slow", args={"n": 4})
        assert honest["result"]["doubled"] == 8
        counts = await alice.ok("mesh_unserve", name="org.example.slow")
        assert counts["calls"] == 4 and counts["rate_limited"] == 1 and counts["errors"] == 0


async def test_allowlist_serving_refuses_callers_not_on_the_contact_allowlist(
    agent: Callable[[str], Any], tmp_path: Path
) -> None:
    async with agent("alice") as alice, agent("bob") as bob, agent("carol") as carol:
        trust(tmp_path / "alice" / "contact_policy.json", bytes.fromhex(carol.node_id))
        served = await alice.ok(
            "mesh_serve", name="org.example.friends", exec=DOUBLE, allow="allowlist", announce=0
        )
        assert served["allow"] == "allowlist"
        friend = await call_when_served(carol, "org.example.friends", {"n": 5})
        assert (friend.structured_content or {})["result"]["doubled"] == 10
        stranger = await bob.error("mesh_call", procedure="org.example.friends", args={"n": 1})
        assert "not_allowed" in stranger["detail"] and bob.node_id in stranger["detail"]
        trust(tmp_path / "alice" / "contact_policy.json", bytes.fromhex(bob.node_id))
        now = await bob.ok("mesh_call", procedure="org.example.friends", args={"n": 1})
        assert now["result"]["doubled"] == 2  # read on every call: trusting takes effect at once
        counts = await alice.ok("mesh_unserve", name="org.example.friends")
        assert counts["refused"] == 1 and counts["calls"] == 3


# -- content ------------------------------------------------------------------------------------


async def test_put_get_round_trip_and_limits(agent: Callable[[str], Any], station: Station) -> None:
    async with agent("alice") as alice:
        data = b"an artifact \x00\xff" * 10
        put = await alice.ok(
            "mesh_put",
            content=base64.b64encode(data).decode(),
            name="a.bin",
            idempotency_key="put-1",
        )
        assert put["size_bytes"] == len(data) and put["name"] == "a.bin"
        assert put["mcid_hex"] == raw_mcid(data).hex()
        again = await alice.ok(
            "mesh_put",
            content=base64.b64encode(data).decode(),
            name="a.bin",
            idempotency_key="put-1",
        )
        assert again["replayed"] == 1 and again["mcid_hex"] == put["mcid_hex"]

        got = await alice.ok("mesh_get", mcid_hex=put["mcid_hex"])
        assert base64.b64decode(got["content_base64"]) == data
        assert got["size_bytes"] == len(data) and got["mcid_hex"] == put["mcid_hex"]

        for size in (40_000, 300_000):  # one raw block; chunks under a manifest
            big = await alice.ok("mesh_put", content=base64.b64encode(os.urandom(size)).decode())
            refused = await alice.error("mesh_get", mcid_hex=big["mcid_hex"])
            assert refused["code"] == "too_large" and str(size) in refused["detail"]

        absent = await alice.error("mesh_get", mcid_hex=raw_mcid(b"never stored").hex())
        assert absent["code"] == "not_found" and absent["retryable"] == 0

        forged = raw_mcid(b"the real bytes")
        assert station._content is not None
        await station._content.put_block(forged.digest, b"other bytes")
        tampered = await alice.error("mesh_get", mcid_hex=forged.hex())
        assert tampered["code"] == "content_invalid" and "content_base64" not in tampered


# -- DHT ----------------------------------------------------------------------------------------


async def test_dht_finds_verified_records(agent: Callable[[str], Any], station: Station) -> None:
    async with agent("alice") as alice:
        found = await alice.ok("mesh_find_records_by_type", record_type="station_endpoint")
        assert found["record_type"] == 0x12 and found["record_type_name"] == "station_endpoint"
        own = [r for r in found["records"] if r["signer"] == station.node_id.hex()]
        assert len(own) == 1 and found["count"] >= 1
        record = own[0]
        assert record["type_name"] == "station_endpoint"
        assert record["payload"]["quic_port"] == station.port
        assert record["expires_at"] > record["created_at"] > 0
        assert found["dropped"] == {"bad_signature": 0, "expired": 0, "malformed": 0}

        one = await alice.ok("mesh_find_record", key_hex=record["key_hex"])
        assert (
            one["record"]["signer"] == station.node_id.hex() and one["key_hex"] == record["key_hex"]
        )
        listed = await alice.ok("mesh_find_records", key_hex=record["key_hex"].upper())
        assert listed["count"] == 1 and listed["records"][0]["version"] == record["version"]
        nothing = await alice.ok("mesh_find_record", key_hex="00" * 32)
        assert nothing["record"] is None

        by_number = await alice.ok("mesh_find_records_by_type", record_type=0x12)
        assert by_number["record_type_name"] == "station_endpoint"

        await alice.ok("mesh_serve", name="org.example.found", exec=DOUBLE)
        adverts = await alice.ok("mesh_find_records_by_type", record_type="procedure_advertisement")
        mine = [
            r for r in adverts["records"] if r["payload"]["procedure_uri"] == "org.example.found"
        ]
        assert mine and mine[0]["payload"]["realm"] == "0" * 64
        assert mine[0]["payload"]["advertiser_node"] == alice.node_id


# -- bad arguments ------------------------------------------------------------------------------

BAD: list[tuple[str, dict[str, Any], str]] = [
    ("mesh_call", {"procedure": ""}, "procedure"),
    ("mesh_call", {"procedure": "a.b", "realm": "Not A Realm"}, "realm"),
    ("mesh_call", {"procedure": "a.b", "timeout_ms": 0}, "timeout_ms"),
    ("mesh_call", {"procedure": "a.b", "timeout_ms": 600_001}, "timeout_ms"),
    ("mesh_call", {"procedure": "a.b", "direct": 2}, "direct"),
    ("mesh_call", {"procedure": "a.b", "idempotency_key": "k" * 121}, "idempotency_key"),
    ("mesh_serve", {"name": "_dht.mine", "exec": DOUBLE}, "name"),
    ("mesh_serve", {"name": "agent.x.ring", "exec": DOUBLE}, "name"),
    ("mesh_serve", {"name": "a b", "exec": DOUBLE}, "name"),
    ("mesh_serve", {"name": "a.b", "exec": "no-such-program-here --x"}, "exec"),
    ("mesh_serve", {"name": "a.b", "exec": "python3 -c 'unclosed"}, "exec"),
    ("mesh_serve", {"name": "a.b", "exec": " "}, "exec"),
    ("mesh_serve", {"name": "a.b", "exec": DOUBLE, "exec_timeout_seconds": 61}, "exec_timeout"),
    ("mesh_serve", {"name": "a.b", "exec": DOUBLE, "announce": 3}, "announce"),
    ("mesh_serve", {"name": "a.b", "exec": DOUBLE, "idempotency_key": ""}, "idempotency_key"),
    ("mesh_serve", {"name": "a.b", "exec": DOUBLE, "rate_per_minute": 0}, "rate_per_minute"),
    ("mesh_serve", {"name": "a.b", "exec": DOUBLE, "rate_per_minute": 6001}, "rate_per_minute"),
    ("mesh_serve", {"name": "a.b", "exec": DOUBLE, "allow": "friends"}, "allow"),
    ("mesh_unserve", {"name": "never.served"}, "not served"),
    ("mesh_unserve", {"name": "a.b", "realm": "0 0"}, "realm"),
    ("mesh_put", {"content": "not base64!"}, "content"),
    ("mesh_put", {"content": "aGVs\nbG8="}, "content"),
    ("mesh_put", {"content": "aGVsbG8"}, "content"),
    ("mesh_put", {"content": "aGVsbG8=", "name": ""}, "name"),
    ("mesh_get", {"mcid_hex": "zz"}, "mcid_hex"),
    ("mesh_get", {"mcid_hex": "02" + "55" + "00" * 32}, "mcid_hex"),
    ("mesh_find_record", {"key_hex": "abc"}, "key_hex"),
    ("mesh_find_records", {"key_hex": "00" * 33}, "key_hex"),
    ("mesh_find_records_by_type", {"record_type": "no_such_type"}, "record_type"),
    ("mesh_find_records_by_type", {"record_type": 0}, "record_type"),
    ("mesh_find_records_by_type", {"record_type": 2}, "retired or unassigned"),
    ("mesh_find_records_by_type", {"record_type": "0x100"}, "record_type"),
]


async def test_every_tool_refuses_a_bad_argument_by_name(agent: Callable[[str], Any]) -> None:
    async with agent("alice") as alice:
        for tool, args, named in BAD:
            error = await alice.error(tool, **args)
            assert error["code"] == "invalid_argument", (tool, args, error)
            assert named in error["detail"], (tool, args, error)
            assert error["retryable"] == 0 and error["next_action"]
        assert {tool for tool, _, _ in BAD} == TOOLS
